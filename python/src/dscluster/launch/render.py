"""The Plan of one launch: build_plan resolves the request on its site, looks the launcher
up in launchers.TABLE, and wraps the launcher's command in the head's launch.sh; pure."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from ..deepspeed_env import check_env_value, parse_env_file
from ..errors import DsclusterError
from ..launch_env import SYSTEM_PATH
from ..storage import JOB_UMASK
from .launchers import LAUNCHERS, TABLE
from .launchers.base import SSH_LIVENESS_ARGS, Files, Job, Raw, shell_join
from .request import JobSite, LaunchRequest
from .select import select_resources

# Seconds the launcher gets to end by itself once a node is lost (launch_watch.py), before
# it and the job's processes on the other nodes are ended.
LOST_NODE_GRACE = 10


def with_job_env(env_text: str, job_env: Mapping[str, str]) -> str:
    """`.deepspeed_env` with the run's own variables set last, over the inventory's lines of
    the same keys. An empty value is allowed here (DSCLUSTER_CHECKPOINT_TAG with no checkpoint
    yet): every launcher exports it as empty (DeepSpeed's PDSH runner `export K=; `)."""
    if not job_env:
        return env_text
    for key, value in job_env.items():
        check_env_value(key, value or "x")  # an empty value: the key alone is checked
    kept = [line for line in env_text.splitlines() if line.partition("=")[0].strip() not in job_env]
    return "\n".join([*kept, *(f"{k}={v}" for k, v in job_env.items())]) + "\n"


def render_launch_script(  # noqa: PLR0913 - launch.sh's parts, the launcher's and restarts'
    run_id: str,
    launcher: str,
    venv: str,
    argv: Sequence[str],
    *,
    hosts: Sequence[str] = (),
    grace: float = LOST_NODE_GRACE,
    prelude: Sequence[str] = (),
    checkpoint_dir: str = "",
    watch_args: Sequence[str] = (),
) -> str:
    """What launch.yml runs on the head, in the job directory, as the training user.

    `prelude`: the launcher's shell lines before it starts (HeadCommand.prelude). The
    launcher runs under launch_watch.py, which ends it `grace` seconds after a node is
    lost and kills the job's processes left on the other `hosts` (those whose environment
    holds this launch's DSCLUSTER_LAUNCH_TIME, which is not exported to anything else).
    `checkpoint_dir`: where the watcher reads DeepSpeed's `latest` once the launcher ended
    (launch --max-restarts), as the training user. `watch_args`: the launcher's own options
    to launch_watch.py (HeadCommand.watch).
    """
    lines = [
        "#!/bin/bash",
        f"# dscluster launch {run_id} ({launcher}): run on the head by playbooks/launch.yml.",
        "set -eu",
        JOB_UMASK,
        f"export PATH={shlex.quote(venv + '/bin:' + SYSTEM_PATH)}",
        "export PDSH_RCMD_TYPE=ssh",
        f"export PDSH_SSH_ARGS_APPEND={shlex.quote(SSH_LIVENESS_ARGS)}",
        'DSCLUSTER_LAUNCH_TIME="$(date +%s.%N)"',
        *prelude,
    ]
    watch = [f"{venv}/bin/python", "-u", "launch_watch.py", "--grace", f"{grace:g}"]
    watch += ["--marker", Raw('"DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME"')]
    watch += ["--hosts", ",".join(hosts)]
    if checkpoint_dir:
        watch += ["--checkpoint-dir", checkpoint_dir]
    watch += [*watch_args, "--"]
    lines.append(f"exec {shell_join(watch)} {shell_join(argv)}")
    return "\n".join(lines) + "\n"


def watch_source() -> str:
    """launch_watch.py, staged with every job."""
    return resources.files("dscluster.jobs").joinpath("launch_watch.py").read_text()


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything one launch needs: the head's command and the files staged with the job."""

    launcher: str
    run_id: str
    job_dir: str
    head: str
    resources: dict[str, list[int]]
    argv: list[str]
    # name -> (text, mode): staged into the job directory on the nodes.
    files: Files

    @property
    def world_size(self) -> int:
        return sum(len(s) for s in self.resources.values())

    @property
    def rank_hosts(self) -> list[str]:
        """The host of each global rank: hosts in order, each filled slot by slot."""
        return [host for host, slots in self.resources.items() for _ in slots]

    @property
    def command(self) -> str:
        return shell_join(self.argv)


def build_plan(request: LaunchRequest, site: JobSite) -> Plan:
    """Pure: the launch of `request` on `site`."""
    render = TABLE.get(request.launcher)
    if render is None:
        raise DsclusterError(
            f"launcher {request.launcher!r} is unknown; use one of {', '.join(LAUNCHERS)}"
        )
    if not request.program:
        raise DsclusterError("no script to run; put it after '--': dscluster launch -- train.py")
    if not 1 <= request.master_port <= 65535:
        raise DsclusterError(f"--master-port {request.master_port} is not a TCP port; use 1-65535")
    selected = select_resources(
        site.pool,
        include=request.include,
        exclude=request.exclude,
        num_nodes=request.num_nodes,
        num_gpus=request.num_gpus,
    )
    # As DeepSpeed: the first selected host (the head unless filtered out) is the master.
    master = next(iter(selected))
    env = {**parse_env_file(site.env_text, ".deepspeed_env"), **site.job_env}
    files: Files = {"hostfile": (site.hostfile_text, "0644")}
    files[".deepspeed_env"] = (with_job_env(site.env_text, site.job_env), "0644")
    head = render(Job(request, site, selected, master, env), files)
    files["launch.sh"] = (
        render_launch_script(
            site.run_id,
            request.launcher,
            site.venv,
            head.argv,
            hosts=list(selected),
            prelude=head.prelude,
            checkpoint_dir=site.job_env.get("DSCLUSTER_CHECKPOINT_DIR", ""),
            watch_args=head.watch,
        ),
        "0755",
    )
    files["launch_watch.py"] = (watch_source(), "0644")
    return Plan(
        launcher=request.launcher,
        run_id=site.run_id,
        job_dir=site.job_dir,
        head=site.head,
        resources=selected,
        argv=head.argv,
        files=files,
    )

"""--launcher torchrun: one torchrun agent per node (c10d rendezvous on the master), every
node started by pdsh from the head through one node script; accelerate uses the same."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ...storage import SOURCE_SECRETS
from .base import LAUNCH_TIME, Files, HeadCommand, Job, shell_join

PDSH_MAX_FAN_OUT = 1024  # as DeepSpeed's PDSHRunner


def torchrun_argv(
    *,
    venv: str,
    master: str,
    master_port: int,
    run_id: str,
    nnodes: int,
    nproc: int,
    is_master: bool,
    program: Sequence[str],
) -> list[str]:
    """One node's torchrun: c10d rendezvous on the master, this node's slot count.

    `is_host` tells the master's agent to serve the rendezvous store: torch would otherwise
    guess it from the endpoint's name, which need not be the node's own hostname.
    """
    return [
        f"{venv}/bin/torchrun",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{master}:{master_port}",
        "--rdzv-id",
        run_id,
        "--rdzv-conf",
        f"is_host={int(is_master)}",
        "--max-restarts",
        "0",
        *program,
    ]


def render_torchrun_node_script(
    *,
    run_id: str,
    job_dir: str,
    env: Mapping[str, str],
    nodes: Mapping[str, tuple[list[str], Mapping[str, str]]],
    name: str = "torchrun_node.sh",
    agent: str = "torchrun",
) -> str:
    """The script pdsh runs on every node as `<name> <its name> <launch time>` (one `agent`
    per node: torchrun or accelerate).

    nodes: host -> (its torchrun argv, extra env). The `.deepspeed_env` keys are exported
    here, as DeepSpeed's PDSH runner does; arguments are quoted for this shell alone.
    """
    lines = [
        "#!/bin/bash",
        f"# dscluster launch {run_id}: one {agent} agent per node, started by pdsh on the head.",
        "set -eu",
        'export DSCLUSTER_LAUNCH_TIME="${2:-}"',
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        SOURCE_SECRETS,
        f"cd {shlex.quote(job_dir)}",
        'case "$1" in',
    ]
    for host, (argv, extra) in nodes.items():
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in extra.items())
        lines.append(f"  {host}) {exports}exec {shell_join(argv)} ;;")
    lines += [
        f'  *) echo "{name}: node $1 is not part of this job" >&2; exit 2 ;;',
        "esac",
    ]
    return "\n".join(lines) + "\n"


def torchrun_pdsh_argv(
    hosts: Sequence[str], job_dir: str, script: str = "torchrun_node.sh"
) -> list[str]:
    """pdsh from the head: every selected node runs the node script with its own name (%h)."""
    return [
        "pdsh",
        "-S",
        "-f",
        str(PDSH_MAX_FAN_OUT),
        "-w",
        ",".join(hosts),
        "bash",
        f"{job_dir}/{script}",
        "%h",
        LAUNCH_TIME,
    ]


def render(job: Job, files: Files) -> HeadCommand:
    site = job.site
    nodes = {
        host: (
            torchrun_argv(
                venv=site.venv,
                master=job.master,
                master_port=job.request.master_port,
                run_id=site.run_id,
                nnodes=len(job.resources),
                nproc=len(slots),
                is_master=host == job.master,
                program=job.request.program,
            ),
            job.devices(host),
        )
        for host, slots in job.resources.items()
    }
    files["torchrun_node.sh"] = (
        render_torchrun_node_script(
            run_id=site.run_id, job_dir=site.job_dir, env=job.env, nodes=nodes
        ),
        "0755",
    )
    return HeadCommand(torchrun_pdsh_argv(list(job.resources), site.job_dir))

"""--launcher torchrun: one torchrun agent per node (c10d rendezvous on the master), every
node started by pdsh from the head through one node script; accelerate uses the same.

--nnodes MIN:MAX is torchrun's elastic mode: the agents restart the workers (up to
--max-restarts times) on the nodes left when one is lost, as long as MIN are; the master's
agent serves the rendezvous store (is_host), so the master must stay. launch_watch.py gets
--elastic MIN: it lets the agents go on without a lost node instead of ending the job.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ...errors import DsclusterError
from ...storage import SOURCE_SECRETS
from .base import LAUNCH_TIME, Files, HeadCommand, Job, shell_join

PDSH_MAX_FAN_OUT = 1024  # as DeepSpeed's PDSHRunner
# Seconds the agents get, once a node is lost, to restart the workers without it (elastic
# mode): the workers' collective timeout to notice, torch's last call (30 s), the new start.
ELASTIC_RESTART_BOUND = 300
# Where the agents restart workers (--nnodes given): each round's workers get a store of their
# own. The store shared across rounds hands a restarted worker the addresses of the round
# before (pytorch#135712: restart counts differ between nodes), so gloo/NCCL connect to ranks
# long gone.
FRESH_STORE_EACH_ROUND = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def nnodes_text(nnodes: tuple[int, int]) -> str:
    """--nnodes as torchrun takes it: N for a fixed count, MIN:MAX for elastic."""
    low, high = nnodes
    return str(low) if low == high else f"{low}:{high}"


def check_nnodes(nnodes: tuple[int, int], selected: int) -> None:
    """MAX (N) must be the nodes selected: every one runs an agent, and an agent beyond MAX
    would wait as a spare that pdsh waits for."""
    low, high = nnodes
    if high == selected:
        return
    given = nnodes_text(nnodes)
    fix = f"--nnodes {selected}" if low == high else f"--nnodes {min(low, selected)}:{selected}"
    raise DsclusterError(
        f"--nnodes {given} does not fit the {selected} nodes selected: torchrun starts one "
        f"agent on each; give {fix}, or select {high} nodes (--num-nodes {high})"
    )


def torchrun_argv(  # noqa: PLR0913 - one node's torchrun options, each a keyword
    *,
    venv: str,
    master: str,
    master_port: int,
    run_id: str,
    nnodes: int | str,
    nproc: int,
    is_master: bool,
    program: Sequence[str],
    max_restarts: int = 0,
) -> list[str]:
    """One node's torchrun: c10d rendezvous on the master, this node's slot count; nnodes
    "MIN:MAX" with max_restarts > 0 is torchrun's elastic mode.

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
        str(max_restarts),
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
    nnodes = job.request.nnodes or (len(job.resources),) * 2
    check_nnodes(nnodes, len(job.resources))
    nodes = {
        host: (
            torchrun_argv(
                venv=site.venv,
                master=job.master,
                master_port=job.request.master_port,
                run_id=site.run_id,
                nnodes=nnodes_text(nnodes),
                nproc=len(slots),
                is_master=host == job.master,
                program=job.request.program,
                max_restarts=job.request.torchrun_max_restarts,
            ),
            {**job.devices(host), **(FRESH_STORE_EACH_ROUND if job.request.nnodes else {})},
        )
        for host, slots in job.resources.items()
    }
    files["torchrun_node.sh"] = (
        render_torchrun_node_script(
            run_id=site.run_id, job_dir=site.job_dir, env=job.env, nodes=nodes
        ),
        "0755",
    )
    # Elastic: a node lost leaves the others to the agents while MIN nodes are left.
    watch = ["--elastic", str(nnodes[0])] if nnodes[0] < nnodes[1] else []
    if watch:
        watch += ["--elastic-bound", str(ELASTIC_RESTART_BOUND)]
    return HeadCommand(torchrun_pdsh_argv(list(job.resources), site.job_dir), watch=watch)

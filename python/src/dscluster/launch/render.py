"""The argv and the scripts staged with a job, per launcher (deepspeed over pdsh, torchrun
with one agent per node, OpenMPI's mpirun), and the Plan that holds them; pure.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from ..errors import DsclusterError
from ..hostfile import (
    SYSTEM_PATH,
    parse_env_file,
    render_hostfile,
)
from ..inventory import DEFAULT_MASTER_PORT
from .select import select_resources

LAUNCHERS = ("deepspeed", "torchrun", "mpi")
PDSH_MAX_FAN_OUT = 1024  # as DeepSpeed's PDSHRunner
# Environment naming the devices a process may use, per accelerator kind (DeepSpeed's
# accelerators' visible_devices_envs()); CPU slots are not devices.
VISIBLE_DEVICES_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "hpu": "HABANA_VISIBLE_MODULES"}
# DeepSpeed's PDSHRunner pastes user arguments into the remote shell's command line, wrapping
# only those with a space in "...": any other shell character would arrive changed, and pdsh
# itself replaces %h, %n and %u.
DEEPSPEED_SAFE_ARG_RE = re.compile(r"^[\w@+=:,./ -]+$")


# Seconds the launcher gets to end by itself once a node is lost (launch_watch.py), before
# it and the job's processes on the other nodes are ended.
LOST_NODE_GRACE = 10
# Every ssh the launchers start (pdsh, mpirun) notices a node that stopped answering in
# about 15 s instead of TCP's hours, and gives up connecting after 10 s.
SSH_LIVENESS_ARGS = "-o ServerAliveInterval=5 -o ServerAliveCountMax=3 -o ConnectTimeout=10"


class Raw(str):
    """A word the head's shell expands (our own, never a user's): left unquoted."""


# The head's clock when launch.sh starts the launcher (the smoke job's `--launch-time`).
LAUNCH_TIME = Raw('"$DSCLUSTER_LAUNCH_TIME"')


def shell_join(words: Sequence[str]) -> str:
    return " ".join(w if isinstance(w, Raw) else shlex.quote(w) for w in words)


def render_mpi_hostfile(resources: Mapping[str, Sequence[int]]) -> str:
    """OpenMPI's hostfile format: `host slots=N`, one line per selected host."""
    return render_hostfile((host, len(slots)) for host, slots in resources.items())


def check_deepspeed_args(program: Sequence[str]) -> None:
    for arg in program:
        if not isinstance(arg, Raw) and not DEEPSPEED_SAFE_ARG_RE.fullmatch(arg):
            raise DsclusterError(
                f"argument {arg!r} would reach the nodes changed: the deepspeed launcher passes "
                "arguments to the remote shell unquoted; use --launcher torchrun or mpi (they "
                "pass arguments exactly) or move the value into a file"
            )


def deepspeed_argv(
    *,
    venv: str,
    master: str,
    master_port: int,
    program: Sequence[str],
    include: str = "",
    exclude: str = "",
    num_nodes: int | None = None,
    num_gpus: int | None = None,
) -> list[str]:
    """The deepspeed launcher over pdsh; filters in DeepSpeed's own syntax, verbatim."""
    check_deepspeed_args(program)
    argv = [f"{venv}/bin/deepspeed", "--hostfile", "hostfile", "--launcher", "pdsh"]
    argv += ["--master_addr", master, "--master_port", str(master_port)]
    if include:
        argv += ["--include", include]
    if exclude:
        argv += ["--exclude", exclude]
    if num_nodes is not None:
        argv += ["--num_nodes", str(num_nodes)]
    if num_gpus is not None:
        argv += ["--num_gpus", str(num_gpus)]
    return argv + list(program)


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


def visible_devices(accelerator: str, slots: Sequence[int], total: int) -> dict[str, str]:
    """The env that pins a node's ranks to its selected slots (none when it has them all)."""
    var = VISIBLE_DEVICES_ENV.get(accelerator)
    if var is None or list(slots) == list(range(total)):
        return {}
    return {var: ",".join(str(s) for s in slots)}


def render_torchrun_node_script(
    *,
    run_id: str,
    job_dir: str,
    env: Mapping[str, str],
    nodes: Mapping[str, tuple[list[str], Mapping[str, str]]],
) -> str:
    """The script pdsh runs on every node as `torchrun_node.sh <its name> <launch time>`.

    nodes: host -> (its torchrun argv, extra env). The `.deepspeed_env` keys are exported
    here, as DeepSpeed's PDSH runner does; arguments are quoted for this shell alone.
    """
    lines = [
        "#!/bin/bash",
        f"# dscluster launch {run_id}: one torchrun agent per node, started by pdsh on the head.",
        "set -eu",
        'export DSCLUSTER_LAUNCH_TIME="${2:-}"',
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
        f"cd {shlex.quote(job_dir)}",
        'case "$1" in',
    ]
    for host, (argv, extra) in nodes.items():
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in extra.items())
        lines.append(f"  {host}) {exports}exec {shell_join(argv)} ;;")
    lines += [
        '  *) echo "torchrun_node.sh: node $1 is not part of this job" >&2; exit 2 ;;',
        "esac",
    ]
    return "\n".join(lines) + "\n"


def torchrun_pdsh_argv(hosts: Sequence[str], job_dir: str) -> list[str]:
    """pdsh from the head: every selected node runs the node script with its own name (%h)."""
    return [
        "pdsh",
        "-S",
        "-f",
        str(PDSH_MAX_FAN_OUT),
        "-w",
        ",".join(hosts),
        "bash",
        f"{job_dir}/torchrun_node.sh",
        "%h",
        LAUNCH_TIME,
    ]


def render_mpi_rank_wrapper(venv: str) -> str:
    return (
        "#!/bin/sh\n"
        "# dscluster: OpenMPI's rank variables as torch.distributed's env:// init reads them,\n"
        "# so DeepSpeed's init_distributed needs no mpi4py. mpirun runs this once per rank.\n"
        'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE"\n'
        'export LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" '
        'LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"\n'
        f'exec {shlex.quote(venv + "/bin/python")} -u "$@"\n'
    )


def mpi_argv(
    *,
    master: str,
    master_port: int,
    job_dir: str,
    world_size: int,
    env: Mapping[str, str],
    program: Sequence[str],
    interface: str = "",
) -> list[str]:
    """mpirun over ssh with the job's MPI hostfile; every `.deepspeed_env` key exported.

    `--bind-to none`: OpenMPI binds each rank to one core by default, which would squeeze
    torch's threads onto it. Ranks fill each host's slots in hostfile order (`--map-by slot`).
    """
    argv = ["mpirun", "--hostfile", "mpi_hostfile", "-np", str(world_size)]
    argv += ["--map-by", "slot", "--bind-to", "none", "--wdir", job_dir]
    argv += ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", SSH_LIVENESS_ARGS]
    if interface:
        argv += ["--mca", "oob_tcp_if_include", interface, "--mca", "btl_tcp_if_include", interface]
    for key, value in env.items():
        argv += ["-x", f"{key}={value}"]
    argv += ["-x", f"MASTER_ADDR={master}", "-x", f"MASTER_PORT={master_port}"]
    argv += ["-x", "DSCLUSTER_LAUNCH_TIME", "./mpi_rank.sh", *program]
    return argv


def render_launch_script(
    run_id: str,
    launcher: str,
    venv: str,
    argv: Sequence[str],
    *,
    hosts: Sequence[str] = (),
    grace: float = LOST_NODE_GRACE,
) -> str:
    """What launch.yml runs on the head, in the job directory, as the training user.

    The launcher runs under launch_watch.py, which ends it `grace` seconds after a node is
    lost and kills the job's processes left on the other `hosts` (those whose environment
    holds this launch's DSCLUSTER_LAUNCH_TIME, which is not exported to anything else).
    """
    lines = [
        "#!/bin/bash",
        f"# dscluster launch {run_id} ({launcher}): run on the head by playbooks/launch.yml.",
        "set -eu",
        f"export PATH={shlex.quote(venv + '/bin:' + SYSTEM_PATH)}",
        "export PDSH_RCMD_TYPE=ssh",
        f"export PDSH_SSH_ARGS_APPEND={shlex.quote(SSH_LIVENESS_ARGS)}",
        'DSCLUSTER_LAUNCH_TIME="$(date +%s.%N)"',
    ]
    if launcher == "deepspeed":
        # The deepspeed launcher reads ./.deepspeed_env on the head and exports it to ranks.
        lines.append('echo "DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME" >> .deepspeed_env')
    watch = [f"{venv}/bin/python", "-u", "launch_watch.py", "--grace", f"{grace:g}"]
    watch += ["--marker", Raw('"DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME"')]
    watch += ["--hosts", ",".join(hosts), "--"]
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
    files: dict[str, tuple[str, str]]

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


def build_plan(  # noqa: PLR0913 - build_plan takes every input of a plan, each a keyword
    *,
    launcher: str,
    run_id: str,
    job_dir: str,
    head: str,
    venv: str,
    pool: Mapping[str, int],
    accelerators: Mapping[str, str],
    hostfile_text: str,
    env_text: str,
    program: Sequence[str],
    include: str = "",
    exclude: str = "",
    num_nodes: int | None = None,
    num_gpus: int | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    interface: str = "",
) -> Plan:
    """Pure: the launch of `program` (script + args, relative to the job dir or absolute).

    pool/accelerators: host -> slots / accelerator kind, in hostfile order, head first.
    """
    if launcher not in LAUNCHERS:
        raise DsclusterError(f"launcher {launcher!r} is unknown; use one of {', '.join(LAUNCHERS)}")
    if not program:
        raise DsclusterError("no script to run; put it after '--': dscluster launch -- train.py")
    if not 1 <= master_port <= 65535:
        raise DsclusterError(f"--master-port {master_port} is not a TCP port; use 1-65535")
    resources = select_resources(
        pool, include=include, exclude=exclude, num_nodes=num_nodes, num_gpus=num_gpus
    )
    # As DeepSpeed: the first selected host (the head unless filtered out) is the master.
    master = next(iter(resources))
    env = parse_env_file(env_text, ".deepspeed_env")
    files: dict[str, tuple[str, str]] = {"hostfile": (hostfile_text, "0644")}
    files[".deepspeed_env"] = (env_text, "0644")
    if launcher == "deepspeed":
        argv = deepspeed_argv(
            venv=venv,
            master=master,
            master_port=master_port,
            program=program,
            include=include,
            exclude=exclude,
            num_nodes=num_nodes,
            num_gpus=num_gpus,
        )
    elif launcher == "torchrun":
        nodes = {
            host: (
                torchrun_argv(
                    venv=venv,
                    master=master,
                    master_port=master_port,
                    run_id=run_id,
                    nnodes=len(resources),
                    nproc=len(slots),
                    is_master=host == master,
                    program=program,
                ),
                visible_devices(accelerators.get(host, "cpu"), slots, pool[host]),
            )
            for host, slots in resources.items()
        }
        files["torchrun_node.sh"] = (
            render_torchrun_node_script(run_id=run_id, job_dir=job_dir, env=env, nodes=nodes),
            "0755",
        )
        argv = torchrun_pdsh_argv(list(resources), job_dir)
    else:
        for host, slots in resources.items():
            if visible_devices(accelerators.get(host, "cpu"), slots, pool[host]):
                raise DsclusterError(
                    f"--launcher mpi cannot pin ranks to slots {slots} on {host}; select whole "
                    "hosts or the first N slots (--num-gpus), or use torchrun/deepspeed"
                )
        files["mpi_hostfile"] = (render_mpi_hostfile(resources), "0644")
        files["mpi_rank.sh"] = (render_mpi_rank_wrapper(venv), "0755")
        argv = mpi_argv(
            master=master,
            master_port=master_port,
            job_dir=job_dir,
            world_size=sum(len(s) for s in resources.values()),
            env=env,
            program=program,
            interface=interface,
        )
    files["launch.sh"] = (
        render_launch_script(run_id, launcher, venv, argv, hosts=list(resources)),
        "0755",
    )
    files["launch_watch.py"] = (watch_source(), "0644")
    return Plan(
        launcher=launcher,
        run_id=run_id,
        job_dir=job_dir,
        head=head,
        resources=resources,
        argv=argv,
        files=files,
    )

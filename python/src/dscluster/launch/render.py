"""The argv and the scripts staged with a job, per launcher (deepspeed over pdsh, torchrun
and accelerate with one agent per node over pdsh, OpenMPI's mpirun, optimum-habana's
gaudi_spawn.py), and the Plan that holds them; pure.

What each rank finds in its environment (Lightning picks TorchElasticEnvironment when
TORCHELASTIC_RUN_ID is set, else SLURMEnvironment under srun, else LightningEnvironment, which
computes the global rank as NODE_RANK/GROUP_RANK * devices + LOCAL_RANK):
- deepspeed: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, CROSS_RANK/CROSS_SIZE/LOCAL_SIZE
  from DeepSpeed's launch.py, plus NODE_RANK, GROUP_RANK, LOCAL_WORLD_SIZE from ds_rank.sh
  (DeepSpeed's `--no_python` runs it in place of python);
- torchrun, accelerate: torchrun's full set (RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK,
  LOCAL_WORLD_SIZE, TORCHELASTIC_RUN_ID, ...);
- mpi: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK from mpi_rank.sh;
- gaudi_spawn: DeepSpeed's set (gaudi_spawn.py runs the deepspeed launcher itself).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from importlib import resources

from ..deepspeed_env import parse_env_file
from ..errors import DsclusterError
from ..hostfile import render_hostfile
from ..inventory import DEFAULT_MASTER_PORT
from ..launch_env import SYSTEM_PATH
from ..storage import SOURCE_SECRETS
from .select import select_resources

LAUNCHERS = ("deepspeed", "torchrun", "mpi", "accelerate", "gaudi_spawn")
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
    # DeepSpeed's launch.py runs ds_rank.sh (in the job dir) in place of python, per rank.
    return [*argv, "--no_python", DS_RANK_WRAPPER, *program]


DS_RANK_WRAPPER = "./ds_rank.sh"


def render_deepspeed_rank_wrapper(python: str) -> str:
    """What DeepSpeed's launch.py runs per rank under `--no_python`: the rank variables it
    leaves out that Lightning (and torch's LOCAL_WORLD_SIZE users) read, then python -u.

    `python` is a word for the shell (a quoted path, or "$VENV/bin/python" in sbatch). The
    ranks are not Slurm tasks even when the launcher runs inside an allocation: Slurm's task
    ids are dropped so Lightning does not take them for the ranks (SLURMEnvironment).
    """
    return (
        "#!/bin/sh\n"
        "# dscluster: DeepSpeed's launcher sets RANK, LOCAL_RANK, WORLD_SIZE and CROSS_RANK/\n"
        "# CROSS_SIZE/LOCAL_SIZE; Lightning reads the node's rank from NODE_RANK/GROUP_RANK.\n"
        'export NODE_RANK="$CROSS_RANK" GROUP_RANK="$CROSS_RANK" LOCAL_WORLD_SIZE="$LOCAL_SIZE"\n'
        "unset SLURM_NTASKS SLURM_NPROCS SLURM_PROCID SLURM_LOCALID SLURM_NODEID\n"
        "# The CPU profile's ACCELERATE_USE_CPU switches accelerate's DeepSpeed plugin off\n"
        "# (an HF Trainer given --deepspeed would train plain DDP).\n"
        "unset ACCELERATE_USE_CPU\n"
        "# Job secrets come from the node's own 0600 file, never from a command line.\n"
        f"{SOURCE_SECRETS}\n"
        "# launch.py puts --local_rank=N right after its 'script' (this file): move it back\n"
        "# behind the user's script, where it lands without --no_python.\n"
        "if [ $# -ge 2 ]; then\n"
        '  case "$1" in --local_rank=*)\n'
        '    lr=$1 script=$2; shift 2; set -- "$script" "$lr" "$@" ;;\n'
        "  esac\n"
        "fi\n"
        f'exec {python} -u "$@"\n'
    )


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


def render_mpi_rank_wrapper(venv: str, slots: Sequence[int] = ()) -> str:
    """`slots`: ranks per host in hostfile order (mpirun --map-by slot fills them in turn),
    from which each rank's node index (NODE_RANK/GROUP_RANK, read by Lightning) follows."""
    counts = " ".join(str(n) for n in slots)
    python = shlex.quote(venv + "/bin/python")
    return (
        "#!/bin/sh\n"
        "# dscluster: OpenMPI's rank variables as torch.distributed's env:// init reads them,\n"
        "# so DeepSpeed's init_distributed needs no mpi4py. mpirun runs this once per rank.\n"
        'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE"\n'
        'export LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" '
        'LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"\n'
        "node=0 first=0\n"
        f"for n in {counts}; do\n"
        '  [ "$RANK" -lt $((first + n)) ] && break\n'
        "  first=$((first + n)) node=$((node + 1))\n"
        "done\n"
        'export NODE_RANK="$node" GROUP_RANK="$node"\n'
        f"{SOURCE_SECRETS}\n"
        "# launch_watch.py rank: says when the rank exits non-zero, naming it (mpirun may not)\n"
        f'exec {python} -S -u launch_watch.py rank -- {python} -u "$@"\n'
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
    checks: Sequence[str] = (),
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
    lines += checks  # shell lines that refuse to start (exit 2) what cannot work here
    if launcher in ("deepspeed", "gaudi_spawn"):
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


def accelerate_argv(  # noqa: PLR0913 - one node's accelerate launch, each a keyword
    *,
    venv: str,
    config: str,
    machine_rank: int,
    master: str,
    master_port: int,
    num_machines: int,
    num_processes: int,
    extra: Sequence[str],
    program: Sequence[str],
) -> list[str]:
    """One node's `accelerate launch`: static rendezvous on the master (node rank
    `machine_rank`), `num_processes / num_machines` ranks per node (launch/accelerate.py)."""
    return [
        f"{venv}/bin/accelerate",
        "launch",
        "--config_file",
        config,
        "--machine_rank",
        str(machine_rank),
        "--main_process_ip",
        master,
        "--main_process_port",
        str(master_port),
        "--num_machines",
        str(num_machines),
        "--num_processes",
        str(num_processes),
        "--rdzv_backend",
        "static",
        "--same_network",
        "--max_restarts",
        "0",
        *extra,
        *program,
    ]


# gaudi_spawn.py's DeepSpeed runs on DistributedRunner's default port; it takes no other.
GAUDI_SPAWN_PORT = 29500


def gaudi_spawn_argv(
    *, venv: str, gaudi_spawn: str, world_size: int, program: Sequence[str]
) -> list[str]:
    """optimum-habana's gaudi_spawn.py: DeepSpeed over the job's (selected) hostfile; the
    first host there is the master (DistributedRunner.process_hostfile)."""
    check_deepspeed_args(program)  # gaudi_spawn joins them into a bash command line
    return [
        f"{venv}/bin/python",
        gaudi_spawn,
        "--world_size",
        str(world_size),
        "--hostfile",
        "gaudi_hostfile",
        "--use_deepspeed",
        *program,
    ]


def hccl_env(env: Mapping[str, str], interface: str) -> str:
    """.deepspeed_env lines HCCL (Gaudi's collectives) needs beyond the inventory's: the
    interface the nodes reach each other on, unless the inventory sets it."""
    if interface and "HCCL_SOCKET_IFNAME" not in env:
        return f"HCCL_SOCKET_IFNAME={interface}\n"
    return ""


@dataclasses.dataclass(frozen=True)
class _Job:
    """What build_plan hands every launcher's files: the selection and the job's settings."""

    run_id: str
    job_dir: str
    venv: str
    master: str
    master_port: int
    pool: Mapping[str, int]
    accelerators: Mapping[str, str]
    resources: dict[str, list[int]]
    env: dict[str, str]
    program: Sequence[str]


def _whole_slots_only(job: _Job, launcher: str, *, prefix: bool = False) -> None:
    """Refuse slot selections a hostfile cannot express (`prefix`: the first N slots can be,
    the launcher pins them itself as DeepSpeed does)."""
    for host, slots in job.resources.items():
        if prefix and slots == list(range(len(slots))):
            continue
        if visible_devices(job.accelerators.get(host, "cpu"), slots, job.pool[host]):
            raise DsclusterError(
                f"--launcher {launcher} cannot pin ranks to slots {slots} on {host}; select "
                "whole hosts or the first N slots (--num-gpus), or use torchrun/deepspeed"
            )


def _torchrun_files(job: _Job, files: dict[str, tuple[str, str]]) -> list[str]:
    nodes = {
        host: (
            torchrun_argv(
                venv=job.venv,
                master=job.master,
                master_port=job.master_port,
                run_id=job.run_id,
                nnodes=len(job.resources),
                nproc=len(slots),
                is_master=host == job.master,
                program=job.program,
            ),
            visible_devices(job.accelerators.get(host, "cpu"), slots, job.pool[host]),
        )
        for host, slots in job.resources.items()
    }
    files["torchrun_node.sh"] = (
        render_torchrun_node_script(
            run_id=job.run_id, job_dir=job.job_dir, env=job.env, nodes=nodes
        ),
        "0755",
    )
    return torchrun_pdsh_argv(list(job.resources), job.job_dir)


def _accelerate_files(
    job: _Job,
    files: dict[str, tuple[str, str]],
    *,
    config_text: str,
    config_name: str,
    config_kind: str,
) -> list[str]:
    from . import accelerate  # noqa: PLC0415

    counts = {len(s) for s in job.resources.values()}
    if len(counts) > 1:
        shown = ", ".join(f"{h} ({len(s)})" for h, s in job.resources.items())
        raise DsclusterError(
            f"--launcher accelerate runs the same number of ranks on every node, not {shown}; "
            "even them out with --num-gpus N or --include"
        )
    world = sum(len(s) for s in job.resources.values())
    kinds = {job.accelerators.get(h, "cpu") for h in job.resources}
    if config_text:
        config = accelerate.parse_config(config_text, config_name)
        if kinds == {"cpu"}:
            accelerate.check_cpu_config(config, config_name)
    else:
        config_name = accelerate.CONFIG_NAME
        config_text = accelerate.render_config(
            config_kind,
            kinds.pop() if len(kinds) == 1 else "cuda",
            num_machines=len(job.resources),
            num_processes=world,
        )
        config = accelerate.parse_config(config_text, config_name)
    files[config_name] = (config_text, "0644")
    extra = accelerate.extra_args(config, world)
    nodes = {
        host: (
            accelerate_argv(
                venv=job.venv,
                config=config_name,
                machine_rank=rank,
                master=job.master,
                master_port=job.master_port,
                num_machines=len(job.resources),
                num_processes=world,
                extra=extra,
                program=job.program,
            ),
            visible_devices(job.accelerators.get(host, "cpu"), slots, job.pool[host]),
        )
        for rank, (host, slots) in enumerate(job.resources.items())
    }
    files["accelerate_node.sh"] = (
        render_torchrun_node_script(
            run_id=job.run_id,
            job_dir=job.job_dir,
            env=job.env,
            nodes=nodes,
            name="accelerate_node.sh",
            agent="accelerate",
        ),
        "0755",
    )
    return torchrun_pdsh_argv(list(job.resources), job.job_dir, "accelerate_node.sh")


def _mpi_files(job: _Job, files: dict[str, tuple[str, str]], interface: str) -> list[str]:
    _whole_slots_only(job, "mpi")
    files["mpi_hostfile"] = (render_mpi_hostfile(job.resources), "0644")
    files["mpi_rank.sh"] = (
        render_mpi_rank_wrapper(job.venv, [len(s) for s in job.resources.values()]),
        "0755",
    )
    return mpi_argv(
        master=job.master,
        master_port=job.master_port,
        job_dir=job.job_dir,
        world_size=sum(len(s) for s in job.resources.values()),
        env=job.env,
        program=job.program,
        interface=interface,
    )


def _gaudi_files(
    job: _Job, files: dict[str, tuple[str, str]], *, gaudi_spawn: str, interface: str
) -> list[str]:
    if not gaudi_spawn:
        raise DsclusterError(
            "--launcher gaudi_spawn needs --gaudi-spawn PATH: optimum-habana's "
            "examples/gaudi_spawn.py (a local file to stage, or its absolute path on the nodes)"
        )
    if job.master_port != GAUDI_SPAWN_PORT:
        raise DsclusterError(
            f"--master-port {job.master_port}: gaudi_spawn.py starts DeepSpeed on port "
            f"{GAUDI_SPAWN_PORT} and takes no other; drop --master-port (or set "
            f"dscluster_master_port: {GAUDI_SPAWN_PORT})"
        )
    _whole_slots_only(job, "gaudi_spawn", prefix=True)
    files["gaudi_hostfile"] = (render_mpi_hostfile(job.resources), "0644")
    env_text, mode = files[".deepspeed_env"]
    files[".deepspeed_env"] = (env_text + hccl_env(job.env, interface), mode)
    return gaudi_spawn_argv(
        venv=job.venv,
        gaudi_spawn=gaudi_spawn,
        world_size=sum(len(s) for s in job.resources.values()),
        program=job.program,
    )


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
    accelerate_config: str = "",
    accelerate_config_name: str = "",
    accelerate_config_kind: str = "ddp",
    gaudi_spawn: str = "",
) -> Plan:
    """Pure: the launch of `program` (script + args, relative to the job dir or absolute).

    pool/accelerators: host -> slots / accelerator kind, in hostfile order, head first.
    accelerate_config(_name): the text and file name of the user's accelerate config, else
    one of accelerate_config_kind is generated. gaudi_spawn: gaudi_spawn.py's path in the job.
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
    job = _Job(
        run_id, job_dir, venv, master, master_port, pool, accelerators, resources, env, program
    )
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
        files["ds_rank.sh"] = (
            render_deepspeed_rank_wrapper(shlex.quote(f"{venv}/bin/python")),
            "0755",
        )
    elif launcher == "torchrun":
        argv = _torchrun_files(job, files)
    elif launcher == "accelerate":
        argv = _accelerate_files(
            job,
            files,
            config_text=accelerate_config,
            config_name=accelerate_config_name or "accelerate_config.yaml",
            config_kind=accelerate_config_kind,
        )
    elif launcher == "gaudi_spawn":
        argv = _gaudi_files(job, files, gaudi_spawn=gaudi_spawn, interface=interface)
    else:
        argv = _mpi_files(job, files, interface)
    checks = []
    if launcher == "gaudi_spawn" and gaudi_spawn.startswith("/"):
        where = shlex.quote(gaudi_spawn)
        checks.append(
            f"[ -f {where} ] || {{ printf 'dscluster: --gaudi-spawn %s is not a file on %s; "
            "give the path of examples/gaudi_spawn.py from optimum-habana there, or a local "
            f'copy to stage\\n\' {where} "$(hostname)" >&2; exit 2; }}'
        )
    files["launch.sh"] = (
        render_launch_script(run_id, launcher, venv, argv, hosts=list(resources), checks=checks),
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

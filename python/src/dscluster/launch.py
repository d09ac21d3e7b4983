"""`dscluster launch`: run a script across the cluster with the deepspeed launcher (pdsh),
torchrun (c10d rendezvous, one agent per node over pdsh) or OpenMPI's mpirun.

Pure builders here (resource selection, argv, hostfiles, the scripts staged with the job);
`run_job` is the one place that does I/O: it stages the job through playbooks/launch.yml,
which runs `launch.sh` on the head in the job directory with a bounded `timeout`.

`--include/--exclude/--num-nodes/--num-gpus` follow DeepSpeed's launcher
(deepspeed/launcher/runner.py: parse_node_config, parse_resource_filter,
parse_inclusion_exclusion, apply_num_nodes_and_gpus) for every launcher: the deepspeed
launcher gets them verbatim, torchrun and mpi get the hosts and slots they select.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import pathlib
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence

from rich.console import Console

from . import storage
from .errors import DsclusterError
from .hostfile import (
    SYSTEM_PATH,
    LaunchFiles,
    parse_env_file,
    render_hostfile,
    write_launch_files,
)
from .inventory import DEFAULT_MASTER_PORT, Inventory
from .jobs.launch_watch import (
    MPI_LOST_DAEMON_RE,
    MPI_RANK_RE,
    MPI_SSH_ERROR_RE,
    PDSH_EXIT_RE,
    RANK_EXIT_RE,
    SSH_ERROR_RE,
    TORCHRUN_EXIT_RE,
)
from .paths import cache_dir
from .runner import PlaybookResult, run_playbook
from .util import atomic_write, print_warnings

LAUNCHERS = ("deepspeed", "torchrun", "mpi")
PDSH_MAX_FAN_OUT = 1024  # as DeepSpeed's PDSHRunner
# Environment naming the devices a process may use, per accelerator kind (DeepSpeed's
# accelerators' visible_devices_envs()); CPU slots are not devices.
VISIBLE_DEVICES_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "hpu": "HABANA_VISIBLE_MODULES"}
# DeepSpeed's PDSHRunner pastes user arguments into the remote shell's command line, wrapping
# only those with a space in "...": any other shell character would arrive changed, and pdsh
# itself replaces %h, %n and %u.
DEEPSPEED_SAFE_ARG_RE = re.compile(r"^[\w@+=:,./ -]+$")

# "  Process name: [[27718,1],2]" then "  Exit code:    3": the first rank that failed.
MPI_PROCESS_RE = re.compile(r"^\s*Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]")
MPI_EXIT_CODE_RE = re.compile(r"^\s*Exit code:\s+(?P<code>-?\d+)")
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


def lost_nodes(log_lines: Sequence[str], rank_hosts: Sequence[str] = ()) -> dict[str, str]:
    """Nodes the launcher log shows lost, with why, in the order the log shows them.

    rank_hosts: the host of each global rank (mpirun names a failed rank, not its node).

    Nodes that could not be reached (ssh failures, pdsh's exit 255) are the cause when
    present; ranks elsewhere that then fail at rendezvous or in a collective are not blamed.
    Otherwise the nodes where a rank or the node's launcher was killed by a signal (a negative
    return code, or a remote exit above 128): ranks on other nodes then fail in a collective
    with a plain error. Otherwise the nodes whose ranks exited non-zero, the first one first.
    """
    unreachable: dict[str, str] = {}
    signalled: dict[str, str] = {}
    ranks: dict[str, str] = {}
    mpi_rank: int | None = None
    for line in log_lines:
        if m := MPI_PROCESS_RE.match(line):
            mpi_rank = int(m["rank"])
        elif (m := MPI_EXIT_CODE_RE.match(line)) and mpi_rank is not None:
            if mpi_rank < len(rank_hosts):
                host = rank_hosts[mpi_rank]
                ranks.setdefault(host, f"rank {mpi_rank} exited with code {m['code']}")
            mpi_rank = None
        elif m := SSH_ERROR_RE.match(line):
            unreachable[m["host"]] = f"ssh: {m['msg']}"
        elif m := MPI_SSH_ERROR_RE.match(line):
            unreachable.setdefault(m["host"], f"ssh: {m['msg']}")
        elif m := MPI_LOST_DAEMON_RE.match(line):
            unreachable.setdefault(m["host"], "mpirun lost its daemon on the node")
        elif (m := PDSH_EXIT_RE.match(line)) and m["code"] == "255":
            unreachable.setdefault(m["host"], "ssh exited with code 255")
        elif (m := RANK_EXIT_RE.match(line) or TORCHRUN_EXIT_RE.match(line)) and m["code"] != "0":
            why = f"a rank exited with code {m['code']}"
            (signalled if int(m["code"]) < 0 else ranks).setdefault(m["host"], why)
        elif m := MPI_RANK_RE.search(line):
            signalled.setdefault(m["host"], f"a rank was killed by signal {m['sig']}")
        elif (m := PDSH_EXIT_RE.match(line)) and int(m["code"]) > 128:
            code = int(m["code"])
            # 129-192: the shell's 128+signal; above: DeepSpeed's launch.py passing on a rank's
            # negative return code (sys.exit(-9) is 247).
            why = (
                f"remote command killed by signal {code - 128}"
                if code <= 192
                else f"a rank was killed by signal {256 - code}"
            )
            signalled.setdefault(m["host"], why)
        elif m := PDSH_EXIT_RE.match(line):
            ranks.setdefault(m["host"], f"remote command exited with code {m['code']}")
    return unreachable or signalled or ranks


# --- resource selection (DeepSpeed's rules) -------------------------------------------------


def parse_node_specs(text: str, flag: str) -> dict[str, list[int]]:
    """`NAME[:SLOT[,SLOT ...]][@NAME...]` -> {name: sorted slots}; [] means the whole host.

    As DeepSpeed's parse_node_config_list: a host named twice gets the union of its slots.
    """
    specs: dict[str, list[int]] = collections.defaultdict(list)
    for spec in text.split("@"):
        if ":" not in spec:
            specs[spec] += []
            continue
        parts = spec.split(":")
        if len(parts) != 2:
            raise DsclusterError(
                f"{flag} {text!r}: {spec!r} has more than one ':'; write NAME[:SLOT[,SLOT...]], "
                "hosts joined by '@'"
            )
        try:
            slots = [int(s) for s in parts[1].split(",")]
        except ValueError:
            raise DsclusterError(
                f"{flag} {text!r}: slots in {spec!r} are not integers; write NAME:0,1"
            ) from None
        specs[parts[0]] += slots
    return {host: sorted(set(slots)) for host, slots in specs.items()}


def select_resources(
    pool: Mapping[str, int],
    *,
    include: str = "",
    exclude: str = "",
    num_nodes: int | None = None,
    num_gpus: int | None = None,
) -> dict[str, list[int]]:
    """The slots each host runs, in hostfile order, as DeepSpeed's launcher resolves them.

    pool: host -> slots, in hostfile order (head first). Raises DsclusterError, naming the
    host or slot, where DeepSpeed raises ValueError; also where DeepSpeed would go on with
    nothing (everything excluded) or with more ranks than a host has slots (--num-gpus).
    """
    include, exclude = include or "", exclude or ""
    if include and exclude:
        raise DsclusterError("--include and --exclude are mutually exclusive; pass one of them")
    if (include or exclude) and (num_nodes is not None or num_gpus is not None):
        raise DsclusterError(
            "--num-nodes/--num-gpus cannot be combined with --include/--exclude; pass one kind"
        )
    hosts = {host: list(range(slots)) for host, slots in pool.items()}
    flag, text = ("--include", include) if include else ("--exclude", exclude)
    if text:
        chosen: dict[str, list[int]] = {} if include else {h: list(s) for h, s in hosts.items()}
        for host, slots in parse_node_specs(text, flag).items():
            if host not in hosts:
                known = ", ".join(hosts)
                raise DsclusterError(
                    f"{flag} names host {host!r}, which is not in the hostfile ({known})"
                )
            for slot in slots:
                if slot not in hosts[host]:
                    raise DsclusterError(
                        f"{flag} names slot {slot} on {host}, which has slots "
                        f"0-{len(hosts[host]) - 1}; use a slot the host has"
                    )
            if include:
                chosen[host] = slots or list(hosts[host])
            elif slots:
                chosen[host] = [s for s in chosen[host] if s not in slots]
            else:
                chosen[host] = []
        hosts = {h: chosen[h] for h in hosts if chosen.get(h)}
    if num_nodes is not None:
        if num_nodes < 1:
            raise DsclusterError(f"--num-nodes {num_nodes}: run on at least one node")
        hosts = dict(list(hosts.items())[:num_nodes])
    if num_gpus is not None:
        if num_gpus < 1:
            raise DsclusterError(f"--num-gpus {num_gpus}: run at least one rank per node")
        short = [f"{h} ({len(s)})" for h, s in hosts.items() if len(s) < num_gpus]
        if short:
            raise DsclusterError(
                f"--num-gpus {num_gpus} is more than the slots of {', '.join(short)}; "
                "lower it or exclude those hosts"
            )
        hosts = {h: list(range(num_gpus)) for h in hosts}
    if not hosts:
        raise DsclusterError(f"{flag} {text!r} leaves no slot to run on; keep at least one host")
    return hosts


# --- builders -------------------------------------------------------------------------------


def render_mpi_hostfile(resources: Mapping[str, Sequence[int]]) -> str:
    """OpenMPI's hostfile format: `host slots=N`, one line per selected host."""
    return render_hostfile((host, len(slots)) for host, slots in resources.items())


def check_deepspeed_args(program: Sequence[str]) -> None:
    for arg in program:
        if not isinstance(arg, Raw) and not DEEPSPEED_SAFE_ARG_RE.match(arg):
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
    return (pathlib.Path(__file__).parent / "jobs" / "launch_watch.py").read_text()


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


def build_plan(
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


# --- I/O ------------------------------------------------------------------------------------


def new_run_id(prefix: str) -> str:
    return dt.datetime.now(dt.UTC).strftime(f"{prefix}-%Y%m%dT%H%M%S%f")


def job_dir_for(inv: Inventory, run_id: str) -> str:
    return f"{storage.inventory_paths(inv).jobs_dir}/{run_id}"


def plan_for(
    inv: Inventory,
    files: LaunchFiles,
    *,
    launcher: str,
    run_id: str,
    program: Sequence[str],
    **filters,
) -> Plan:
    """build_plan from the inventory and the launch files `write_launch_files` wrote."""
    head_facts = files.facts[0]
    interfaces = {f.interface for f in files.facts}
    return build_plan(
        launcher=launcher,
        run_id=run_id,
        job_dir=job_dir_for(inv, run_id),
        head=inv.head,
        venv=head_facts.venv,
        pool={f.host: f.slots for f in files.facts},
        accelerators={f.host: f.accelerator for f in files.facts},
        hostfile_text=files.hostfile.read_text(),
        env_text=files.env_file.read_text(),
        program=program,
        interface=interfaces.pop() if len(interfaces) == 1 else "",
        **filters,
    )


@dataclasses.dataclass
class JobResult:
    rc: int
    log_lines: list[str]
    log_path: pathlib.Path
    fetched: dict[str, str]  # name -> text of each file fetched besides the log
    lost_nodes: dict[str, str]
    playbook: PlaybookResult


def run_job(
    inv: Inventory,
    plan: Plan,
    *,
    stage_files: Mapping[str, pathlib.Path] | None = None,
    fetch: Sequence[str] = (),
    timeout: int = 3600,
    console: Console | None = None,
    playbook: str = "launch.yml",
) -> JobResult:
    """Stage the plan's files (+ stage_files: name -> local path) into the job directory,
    run launch.sh on the head within `timeout` seconds, fetch the log (+ `fetch`)."""
    console = console or Console(stderr=True)
    if timeout < 1:
        raise DsclusterError(f"--timeout {timeout}: give the job at least one second")
    stage = pathlib.Path(tempfile.mkdtemp(prefix="launch-", dir=cache_dir()))
    try:
        entries = []
        for name, (text, mode) in plan.files.items():
            (stage / name).write_text(text)
            entries.append({"name": name, "mode": mode})
        for name, path in (stage_files or {}).items():
            shutil.copy(path, stage / name)
            entries.append({"name": name, "mode": "0644"})
        fetched_dir = stage / "fetched"
        fetched_dir.mkdir()
        result = run_playbook(
            playbook,
            inv,
            extravars={
                "launch_stage_dir": str(stage),
                "launch_fetch_dir": str(fetched_dir),
                "launch_job_dir": plan.job_dir,
                "launch_files": entries,
                "launch_fetch": ["launcher.log", "exit_status", *fetch],
                "launch_timeout": timeout,
            },
            # Only the job's nodes: a node left out (--exclude, degraded.json) is not touched.
            limit=",".join(dict.fromkeys([plan.head, *plan.resources])),
            timeout=timeout + 180,
            console=console,
        )
        texts = {
            name: (fetched_dir / name).read_text(errors="replace")
            for name in ("launcher.log", "exit_status", *fetch)
            if (fetched_dir / name).is_file()
        }
        log_text = texts.pop("launcher.log", "")
        # .txt: Ansible reads every other file under an inventory directory as inventory.
        log_path = inv.directory / "logs" / f"{plan.run_id}.log.txt"
        atomic_write(log_path, log_text)
        status = texts.pop("exit_status", "").strip()
        rc = int(status) if status.lstrip("-").isdigit() else 1
        if result.rc != 0 and rc == 0:
            rc = 1  # the play failed around a job that did not (staging, fetching)
        lines = log_text.splitlines()
        return JobResult(
            rc=rc,
            log_lines=lines,
            log_path=log_path,
            fetched=texts,
            lost_nodes=lost_nodes(lines, plan.rank_hosts) if rc else {},
            playbook=result,
        )
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_mpi_hostfile(inv: Inventory, files: LaunchFiles) -> pathlib.Path:
    """Every slot in OpenMPI's format beside the inventory, for the user's own mpirun
    (the job's own, filtered copy is staged with the job)."""
    path = inv.directory / "mpi_hostfile"
    atomic_write(path, render_mpi_hostfile({f.host: range(f.slots) for f in files.facts}))
    return path


def describe(plan: Plan) -> str:
    """The dry run: the head's command, then every launch file it uses."""
    parts = [
        f"# {plan.launcher} on {len(plan.resources)} nodes, {plan.world_size} ranks, "
        f"from {plan.head} in {plan.job_dir}",
        plan.command,
    ]
    for name in ("hostfile", "mpi_hostfile", "torchrun_node.sh", "mpi_rank.sh"):
        if name in plan.files:
            parts += [f"# --- {name}", plan.files[name][0].rstrip("\n")]
    return "\n".join(parts) + "\n"


def program_for(script: str, args: Sequence[str], *, stage: bool) -> tuple[list[str], dict]:
    """The program words and the local files to stage for `script`."""
    if not stage:
        if not script.startswith("/"):
            raise DsclusterError(
                f"--no-stage needs the script's absolute path on the nodes, not {script!r}"
            )
        return [script, *args], {}
    path = pathlib.Path(script).expanduser()
    if not path.is_file():
        raise DsclusterError(
            f"script {script} not found here; give a local file to stage, or an absolute "
            "path on the nodes with --no-stage"
        )
    reserved = {"launch.sh", "hostfile", ".deepspeed_env", "mpi_hostfile", "mpi_rank.sh"}
    reserved |= {"launch_watch.py"}
    if path.name in reserved | {"torchrun_node.sh", "launcher.log", "exit_status"}:
        raise DsclusterError(f"script name {path.name} is used by dscluster's job files; rename it")
    return [path.name, *args], {path.name: path}


def launch(
    inv: Inventory,
    *,
    launcher: str,
    script: str,
    args: Sequence[str],
    stage: bool = True,
    dry_run: bool = False,
    timeout: int = 3600,
    master_port: int = DEFAULT_MASTER_PORT,
    include: str = "",
    exclude: str = "",
    num_nodes: int | None = None,
    num_gpus: int | None = None,
    out: Console | None = None,
    console: Console | None = None,
    preflight: Callable[[], None] | None = None,
) -> tuple[Plan, JobResult | None]:
    """Plan, then (unless dry_run) run `preflight` (doctor) and the job."""
    out = out or Console()
    console = console or Console(stderr=True)
    files = write_launch_files(inv)
    print_warnings(console, files.warnings)
    program, stage_files = program_for(script, args, stage=stage)
    plan = plan_for(
        inv,
        files,
        launcher=launcher,
        run_id=new_run_id("launch"),
        program=program,
        include=include,
        exclude=exclude,
        num_nodes=num_nodes,
        num_gpus=num_gpus,
        master_port=master_port,
    )
    if launcher == "mpi":
        console.print(f"wrote {write_mpi_hostfile(inv, files)}", markup=False, highlight=False)
    if dry_run:
        out.print(describe(plan), markup=False, highlight=False, end="")
        return plan, None
    console.print(
        f"launch: {plan.launcher}, {len(plan.resources)} nodes, {plan.world_size} ranks, "
        f"head {plan.head}, run {plan.run_id}",
        markup=False,
        highlight=False,
    )
    if preflight is not None:
        preflight()
    result = run_job(inv, plan, stage_files=stage_files, timeout=timeout, console=console)
    return plan, result

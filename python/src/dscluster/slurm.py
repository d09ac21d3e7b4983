"""Slurm: an inventory from an allocation, and batch scripts for every launch mode.

`dscluster inventory slurm` runs inside an allocation (salloc / sbatch) or takes --nodelist:
the node list (`gpu-[001-004,010],cpu7`) is expanded with python-hostlist (Slurm's own
`scontrol show hostnames` where python-hostlist refuses a list, or where no list is given
but scontrol is there), slots per node come from what Slurm says about the allocation, and
`inventories/<name>/hosts.yml` + `hostfile` are written, head = the first node.

`dscluster sbatch` writes a bash batch script that derives everything from the allocation it
runs in (nodes, head, slots per node, job id) and starts the user's script with one of three
launchers (`--launcher`; works with Debian's slurm-wlm 22.05 and CPU-only clusters; nothing
assumes GPUs):

- `deepspeed`: a hostfile is written inside the job and DeepSpeed's launcher runs on the
  batch host, reaching every node over pdsh/ssh (the ranks start outside Slurm's steps, as
  with `dscluster smoke`; prefer torchrun or srun on nodes shared with other jobs);
- `torchrun`: one `srun` task per node runs torchrun with c10d rendezvous on the first node;
- `srun`: one Slurm task per slot; each exports RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/
  MASTER_PORT from Slurm's own ids (MPI-style ranks) before exec'ing Python.

The pure parts (`expand_nodelist`, `parse_cpus_per_node`, `slots_from_env`, `render_sbatch`)
do no I/O, so tests and scripts/bench_nodelist.py call them directly.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import hostlist

from . import static
from .errors import DsclusterError
from .hostfile import SYSTEM_PATH, check_env_value, parse_env_file, render_env
from .inventory import DEFAULT_MASTER_PORT, master_port_var, plain_var
from .util import atomic_write

MODES = ("deepspeed", "torchrun", "srun")
DEFAULT_VENV = "/opt/dscluster/venv"
# One item of SLURM_JOB_CPUS_PER_NODE / SLURM_TASKS_PER_NODE: `72`, or `36(x2)` (two nodes).
CPUS_ITEM_RE = re.compile(r"^(?P<count>[0-9]+)(?:\(x(?P<repeat>[0-9]+)\))?$")
# Slurm's --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or unlimited.
TIME_RE = re.compile(
    r"^(?:[0-9]+(?::[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(?::[0-9]{1,2}){0,2}|unlimited|infinite)$",
    re.IGNORECASE,
)
# #SBATCH values and the job script's own paths: no blanks, quotes or shell specials.
SBATCH_VALUE_RE = re.compile(r"^[A-Za-z0-9_@%+=:,./~%-]+$")
POSINT_RE = re.compile(r"^[0-9]+$")


# ---- Node lists and slots (pure) ---------------------------------------------------------


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed node list -> host names, in Slurm's order, with python-hostlist.

    `gpu-[001-004,010],cpu7` -> gpu-001 … gpu-004, gpu-010, cpu7. A repeated node is an error
    (Slurm never lists one twice; a hand-written --nodelist might).
    """
    text = (nodelist or "").strip()
    if not text:
        raise DsclusterError(
            "the node list is empty; run inside an allocation (salloc/sbatch) or pass --nodelist"
        )
    try:
        nodes = list(hostlist.expand_hostlist(text, allow_duplicates=True))
    except hostlist.BadHostlist as exc:
        raise DsclusterError(
            f"cannot expand node list {text!r} ({exc}); pass it as Slurm prints it, "
            "e.g. gpu-[001-004,010],cpu7"
        ) from exc
    if len(set(nodes)) != len(nodes):
        seen: set[str] = set()
        for node in nodes:
            if node in seen:
                raise DsclusterError(
                    f"node {node} appears twice in node list {text!r}; list it once"
                )
            seen.add(node)
    return nodes


def parse_cpus_per_node(value: str) -> list[int]:
    """Slurm's per-node count format (SLURM_JOB_CPUS_PER_NODE): `2(x3),1` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for item in (value or "").split(","):
        m = CPUS_ITEM_RE.match(item.strip())
        if not m:
            raise DsclusterError(
                f"cannot read per-node counts {value!r}: {item!r} is not N or N(xM); "
                "pass --slots instead"
            )
        counts.extend([int(m["count"])] * int(m["repeat"] or 1))
    return counts


def gpu_count(value: str) -> int:
    """GPUs in SLURM_GPUS_PER_NODE / gres form: `4`, `a100:4`, `gpu:a100:4`, `a100:2,v100:2`."""
    total = 0
    for item in value.split(","):
        # gres may carry an index suffix: gpu:a100:4(IDX:0-3)
        last = item.split("(")[0].strip().split(":")[-1]
        if not POSINT_RE.match(last):
            raise DsclusterError(f"cannot read a GPU count from {value!r}; pass --slots instead")
        total += int(last)
    return total


def _positive(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "").strip()
    return int(value) if POSINT_RE.match(value) and int(value) > 0 else None


def slots_and_source(env: Mapping[str, str], nodes: Sequence[str]) -> tuple[list[int], str]:
    """Slots per node from Slurm's environment, and the variable they came from.

    GPUs first (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, SLURM_GPUS_PER_NODE), then tasks per
    node, then CPUs per node (SLURM_JOB_CPUS_PER_NODE, heterogeneous where Slurm says so),
    else one slot per node.
    """
    count = len(nodes)
    if n := _positive(env, "SLURM_GPUS_ON_NODE"):
        return [n] * count, "SLURM_GPUS_ON_NODE"
    job_gpus = env.get("SLURM_JOB_GPUS", "").strip()
    if job_gpus:
        ids = [g for g in job_gpus.split(",") if g.strip()]
        if ids:
            return [len(ids)] * count, "SLURM_JOB_GPUS"
    per_node = env.get("SLURM_GPUS_PER_NODE", "").strip()
    if per_node and (n := gpu_count(per_node)) > 0:
        return [n] * count, "SLURM_GPUS_PER_NODE"
    if n := _positive(env, "SLURM_NTASKS_PER_NODE"):
        return [n] * count, "SLURM_NTASKS_PER_NODE"
    cpus = env.get("SLURM_JOB_CPUS_PER_NODE", "").strip()
    if cpus:
        per = parse_cpus_per_node(cpus)
        if len(per) != count:
            raise DsclusterError(
                f"SLURM_JOB_CPUS_PER_NODE={cpus} describes {len(per)} nodes but the node list "
                f"has {count}; pass --slots N"
            )
        if min(per) < 1:
            raise DsclusterError(
                f"SLURM_JOB_CPUS_PER_NODE={cpus} gives a node 0 CPUs; pass --slots"
            )
        return per, "SLURM_JOB_CPUS_PER_NODE"
    return [1] * count, "default"


def slots_from_env(env: Mapping[str, str], nodes: Sequence[str]) -> list[int]:
    """Slots per node (one entry per node, in order); see slots_and_source."""
    return slots_and_source(env, nodes)[0]


def nodelist_from_env(env: Mapping[str, str]) -> str | None:
    return env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or None


# ---- dscluster inventory slurm -----------------------------------------------------------


def scontrol_hostnames(nodelist: str | None) -> list[str]:
    """Slurm's own expansion (`scontrol show hostnames`), where scontrol is installed."""
    scontrol = shutil.which("scontrol")
    if not scontrol:
        raise DsclusterError("scontrol is not installed")
    argv = [scontrol, "show", "hostnames", *([nodelist] if nodelist else [])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DsclusterError(f"'scontrol show hostnames' failed: {exc}") from exc
    hosts = proc.stdout.split()
    if proc.returncode != 0 or not hosts:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise DsclusterError(f"'scontrol show hostnames' failed: {last}")
    return hosts


def discover_nodes(nodelist: str | None, env: Mapping[str, str]) -> list[str]:
    """--nodelist, else SLURM_JOB_NODELIST/SLURM_NODELIST, else `scontrol show hostnames`."""
    text = nodelist or nodelist_from_env(env)
    if text:
        try:
            return expand_nodelist(text)
        except DsclusterError:
            if not shutil.which("scontrol"):
                raise
            nodes = scontrol_hostnames(text)  # Slurm's own parser has the last word
            static.check_hosts([(n, 1) for n in nodes])
            return nodes
    if shutil.which("scontrol"):
        try:
            return scontrol_hostnames(None)
        except DsclusterError:
            pass
    raise DsclusterError(
        "no Slurm node list: run inside an allocation (salloc or sbatch) or pass "
        "--nodelist 'gpu-[001-004]'"
    )


def slurm_spec(
    name: str,
    *,
    nodes: list[str],
    slots: list[int],
    source: str,
    env: Mapping[str, str],
    ssh: Mapping[str, Any],
) -> static.ClusterSpec:
    all_vars: dict[str, Any] = {}
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job_id:
        all_vars["dscluster_slurm_job_id"] = str(job_id)
    all_vars.update(ssh)
    return static.ClusterSpec(
        name=name,
        source="slurm",
        entries=list(zip(nodes, slots, strict=True)),
        all_vars=all_vars,
        # GPU counts are detected on the nodes; CPU slot counts must be configured.
        cpu_slots="GPU" not in source,
    )


@dataclasses.dataclass(frozen=True)
class WrittenInventory:
    hosts_yml: pathlib.Path
    hostfile: pathlib.Path
    nodes: list[str]
    slots: list[int]
    slots_source: str  # what the slot counts came from (--slots, SLURM_JOB_GPUS...)


def write_inventory(
    name: str,
    *,
    nodelist: str | None,
    slots: int | None,
    ssh: static.SshOptions,
    out: pathlib.Path | None,
    env: Mapping[str, str],
) -> WrittenInventory:
    """`dscluster inventory slurm`: the allocation's (or `nodelist`'s) nodes, written."""
    static.check_name(name)
    if slots is not None and slots < 1:
        raise DsclusterError(f"--slots {slots} is out of range; use 1 or more")
    nodes = discover_nodes(nodelist, env)
    if slots is not None:
        counts, source = [slots] * len(nodes), "--slots"
    else:
        counts, source = slots_and_source(env, nodes)
    spec = slurm_spec(name, nodes=nodes, slots=counts, source=source, env=env, ssh=ssh.vars())
    target = out or static.default_out(name)
    job = spec.all_vars.get("dscluster_slurm_job_id")
    header = (
        "---\n"
        f"# Written by `dscluster inventory slurm`{f' in Slurm job {job}' if job else ''}: "
        f"{len(nodes)} nodes\n"
        f"# ({hostlist.collect_hostlist(nodes)}), head {nodes[0]}; slots from {source}.\n"
        "# Host keys are checked (StrictHostKeyChecking=yes): the nodes of a Slurm site usually\n"
        "# know each other already; --known-hosts FILE points UserKnownHostsFile at a file.\n"
    )
    hosts_yml, hostfile = static.write_cluster(spec, target, header)
    return WrittenInventory(hosts_yml, hostfile, nodes, counts, source)


# ---- dscluster sbatch --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SbatchOptions:
    launcher: str
    command: list[str]  # the user's script and its arguments
    nodes: int | None = None
    slots: int | None = None  # per node
    partition: str | None = None
    time: str | None = None
    job_name: str | None = None
    slurm_output: str | None = None  # Slurm's log file (#SBATCH --output)
    chdir: str | None = None
    gres: str | None = None
    venv: str = DEFAULT_VENV
    master_port: int | None = None  # None: DEFAULT_MASTER_PORT
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # from .deepspeed_env
    origin: str = "dscluster sbatch"  # the command line, for the header comment

    @property
    def port(self) -> int:
        return DEFAULT_MASTER_PORT if self.master_port is None else self.master_port


def _check_value(flag: str, value: str | None) -> None:
    if value is not None and not SBATCH_VALUE_RE.match(value):
        raise DsclusterError(
            f"{flag} {value!r} has blanks, quotes or shell characters; use a plain value "
            "(letters, digits, '_', '-', '.', '/', ':')"
        )


def validate(opts: SbatchOptions) -> None:
    if opts.launcher not in MODES:
        raise DsclusterError(
            f"--launcher {opts.launcher!r} is not a launch mode; use {', '.join(MODES)}"
        )
    if not opts.command:
        raise DsclusterError("no script to run; end the command with: -- script.py [args...]")
    if opts.nodes is not None and opts.nodes < 1:
        raise DsclusterError(f"--nodes {opts.nodes} is out of range; use 1 or more")
    if opts.slots is not None and opts.slots < 1:
        raise DsclusterError(f"--slots {opts.slots} is out of range; use 1 or more")
    if not 1 <= opts.port <= 65535:
        raise DsclusterError(f"--master-port {opts.port} is out of range; use 1 to 65535")
    if opts.time is not None and not TIME_RE.match(opts.time):
        raise DsclusterError(
            f"--time {opts.time!r} is not a Slurm time; use minutes, HH:MM:SS or D-HH:MM:SS"
        )
    for flag, value in (
        ("--partition", opts.partition),
        ("--job-name", opts.job_name),
        ("--slurm-output", opts.slurm_output),
        ("--chdir", opts.chdir),
        ("--gres", opts.gres),
        ("--venv", opts.venv),
    ):
        _check_value(flag, value)
    if not opts.venv.startswith("/"):
        raise DsclusterError(f"--venv {opts.venv} is not an absolute path; pass the nodes' venv")
    for key, value in opts.env.items():
        check_env_value(key, value)


def launch_env(opts: SbatchOptions) -> dict[str, str]:
    """What every rank gets: the inventory's .deepspeed_env, PATH defaulting to the venv."""
    env = {"PATH": f"{opts.venv}/bin:{SYSTEM_PATH}", "PYTHONUNBUFFERED": "1"}
    env.update(opts.env)
    return env


def _sbatch_header(opts: SbatchOptions) -> list[str]:
    lines = ["#!/bin/bash"]
    for flag, value in (
        ("--job-name", opts.job_name),
        ("--nodes", opts.nodes),
        ("--ntasks-per-node", opts.slots),
        ("--gres", opts.gres),
        ("--partition", opts.partition),
        ("--time", opts.time),
        ("--output", opts.slurm_output),
        ("--chdir", opts.chdir),
    ):
        if value is not None:
            lines.append(f"#SBATCH {flag}={value}")
    return lines


# Shared body: everything derived from the allocation the script runs in.
_PRELUDE = r"""
if [[ -z "${SLURM_JOB_ID:-}" || -z "${SLURM_JOB_NODELIST:-}" ]]; then
  echo "dscluster: not inside a Slurm job; submit this script with sbatch" >&2
  exit 2
fi
nodelist=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
mapfile -t nodes <<<"$nodelist"
num_nodes=${#nodes[@]}
if (( num_nodes < 1 )) || [[ -z "${nodes[0]}" ]]; then
  echo "dscluster: scontrol shows no nodes for SLURM_JOB_NODELIST=$SLURM_JOB_NODELIST" >&2
  exit 1
fi
head_node=${nodes[0]}
# Slots per node: the GPUs Slurm gave this job on a node, else the configured count.
if [[ "${SLURM_GPUS_ON_NODE:-}" =~ ^[0-9]+$ ]] && (( SLURM_GPUS_ON_NODE > 0 )); then
  slots=$SLURM_GPUS_ON_NODE
elif [[ -n "$SLOTS_PER_NODE" ]]; then
  slots=$SLOTS_PER_NODE
elif [[ "${SLURM_NTASKS_PER_NODE:-}" =~ ^[0-9]+$ ]] && (( SLURM_NTASKS_PER_NODE > 0 )); then
  slots=$SLURM_NTASKS_PER_NODE
else
  slots=1
fi
# CPUs every node has in this job (SLURM_JOB_CPUS_PER_NODE is like "4(x2),2"): the least.
node_cpus=
IFS=, read -ra cpus_items <<<"${SLURM_JOB_CPUS_PER_NODE:-1}"
for item in "${cpus_items[@]}"; do
  count=${item%%(*}
  if [[ -z "$node_cpus" ]] || (( count < node_cpus )); then node_cpus=$count; fi
done
export MASTER_ADDR=$head_node MASTER_PORT=$PORT
echo "dscluster: job $SLURM_JOB_ID mode $MODE: $num_nodes nodes (${nodes[*]}), $slots slots" \
  "per node, head $head_node:$PORT, $node_cpus CPUs per node"
"""

_DEEPSPEED = r"""
# DeepSpeed's launcher runs here, on the batch host, and pdsh-es to every node; the ranks get
# their environment from the .deepspeed_env this job writes (pdsh carries no PATH).
if ! command -v pdsh >/dev/null; then
  echo "dscluster: pdsh is not installed on $(hostname); the deepspeed mode needs it" >&2
  exit 1
fi
job_dir=$JOB_DIR
mkdir -p "$job_dir"
hostfile="$job_dir/hostfile.$SLURM_JOB_ID"
for node in "${nodes[@]}"; do printf '%s slots=%s\n' "$node" "$slots"; done >"$hostfile.tmp"
mv -f "$hostfile.tmp" "$hostfile"
export DS_ENV_FILE="$job_dir/deepspeed_env.$SLURM_JOB_ID"
cat >"$DS_ENV_FILE" <<'DSCLUSTER_ENV'
@ENV_FILE@DSCLUSTER_ENV
export PDSH_RCMD_TYPE=ssh
"$VENV/bin/deepspeed" --hostfile "$hostfile" --launcher pdsh \
  --master_addr "$head_node" --master_port "$PORT" \
  @COMMAND@
"""

_TORCHRUN = r"""
# One torchrun per node (an srun task each); c10d rendezvous on the first node.
srun --nodes="$num_nodes" --ntasks="$num_nodes" --ntasks-per-node=1 \
  --cpus-per-task="$node_cpus" --kill-on-bad-exit=1 \
  "$VENV/bin/torchrun" --nnodes="$num_nodes" --nproc-per-node="$slots" \
  --rdzv-backend=c10d --rdzv-endpoint="$head_node:$PORT" --rdzv-id="$SLURM_JOB_ID" \
  @COMMAND@
"""

_SRUN = r"""
# One Slurm task per slot; each rank takes its ids from Slurm (MPI-style) and execs Python.
task_cpus=$(( node_cpus / slots ))
(( task_cpus >= 1 )) || task_cpus=1
export LOCAL_WORLD_SIZE=$slots
srun_extra=()
(( slots <= node_cpus )) || srun_extra+=(--overcommit)  # more ranks than CPUs (GPU nodes)
RANK_ENV='export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID;'
srun --nodes="$num_nodes" --ntasks="$(( num_nodes * slots ))" --ntasks-per-node="$slots" \
  --cpus-per-task="$task_cpus" --kill-on-bad-exit=1 "${srun_extra[@]}" \
  bash -c "$RANK_ENV"' exec "$@"' dscluster-rank "$VENV/bin/python" -u @COMMAND@
"""


def render_sbatch(opts: SbatchOptions) -> str:
    """The batch script text (validated first); pure."""
    validate(opts)
    env = launch_env(opts)
    env_file = render_env(env)  # the same rules DeepSpeed's launcher applies
    q = shlex.quote
    lines = _sbatch_header(opts)
    lines += [
        f"# Written by `{opts.origin}`.",
        "# Submit with: sbatch <this file>. Nodes, head, slots and job id come from the",
        "# allocation; the values below are the defaults baked in when it was written.",
        "set -euo pipefail",
        "",
        f"MODE={opts.launcher}",
        f"VENV={q(opts.venv)}",
        f"PORT={opts.port}",
        f"SLOTS_PER_NODE={opts.slots or ''}",
        f"JOB_DIR={q(opts.chdir) if opts.chdir else '${SLURM_SUBMIT_DIR:-$PWD}'}",
        "",
        "# The ranks' environment (the inventory's .deepspeed_env, venv first on PATH).",
    ]
    for key, value in env.items():
        if key == "PATH":  # keep the submitter's PATH behind it: scontrol/srun live there
            lines.append(f'export PATH={q(value)}:"$PATH"')
        else:
            lines.append(f"export {key}={q(value)}")
    command = " ".join(q(a) for a in opts.command)
    body = {"deepspeed": _DEEPSPEED, "torchrun": _TORCHRUN, "srun": _SRUN}[opts.launcher]
    fill = {"@ENV_FILE@": env_file, "@COMMAND@": command}
    body = re.sub("@ENV_FILE@|@COMMAND@", lambda m: fill[m.group(0)], body)
    return "\n".join(lines) + "\n" + _PRELUDE + body


def default_script_path(mode: str) -> pathlib.Path:
    return pathlib.Path(f"dscluster-{mode}.sbatch")


def inventory_defaults(source: str) -> tuple[str | None, int | None, dict[str, str]]:
    """(venv, port, .deepspeed_env) from an inventory: dscluster_venv, dscluster_master_port
    and the .deepspeed_env written beside its hostfile by `dscluster hostfile`."""
    from .inventory import load  # noqa: PLC0415 (runs ansible-inventory)

    inv = load(source)
    venv = plain_var(inv, "dscluster_venv")
    port = master_port_var(inv)
    env_path = inv.directory / ".deepspeed_env"
    env = parse_env_file(env_path.read_text(), str(env_path)) if env_path.is_file() else {}
    return (str(venv) if venv else None), port, env


def write_sbatch(opts: SbatchOptions, out: pathlib.Path | None = None) -> pathlib.Path:
    """Render the batch script (nothing written on any error), then write it, executable."""
    text = render_sbatch(opts)
    path = out or default_script_path(opts.launcher)
    atomic_write(path, text, mode=0o755)
    return path

"""`dscluster sbatch`: a bash batch script that derives everything from the allocation it
runs in (nodes, head, slots per node, job id) and starts the user's script with one of three
launchers (`--launcher`; works with Debian's slurm-wlm 22.05 and CPU-only clusters; nothing
assumes GPUs):

- `deepspeed`: a hostfile is written inside the job and DeepSpeed's launcher runs on the
  batch host, reaching every node over pdsh/ssh (the ranks start outside Slurm's steps, as
  with `dscluster smoke`; prefer torchrun or srun on nodes shared with other jobs);
- `torchrun`: one `srun` task per node runs torchrun with c10d rendezvous on the first node;
- `srun`: one Slurm task per slot; each exports RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/
  MASTER_PORT from Slurm's own ids (MPI-style ranks) before exec'ing Python;
- `accelerate`: one `srun` task per node runs `accelerate launch` (seed 003's form): static
  rendezvous on the first node, --machine_rank from SLURM_NODEID, --num_processes = nodes *
  slots; the config (the user's --accelerate-config, or one generated of
  --accelerate-config-kind: GPUs when --gres names them, else CPU) travels in the environment
  and each node writes it into a private directory mktemp makes in its ${TMPDIR:-/tmp}
  (launch/accelerate.py says why MULTI_CPU configs get --multi_gpu).

What a rank finds, for Lightning (TorchElasticEnvironment when TORCHELASTIC_RUN_ID is set,
else SLURMEnvironment when SLURM_NTASKS is, else LightningEnvironment: NODE_RANK/GROUP_RANK):
- torchrun, accelerate: torchrun's variables (TORCHELASTIC_RUN_ID, RANK, GROUP_RANK, ...);
- srun: SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID/SLURM_NTASKS_PER_NODE, so
  Lightning's SLURMEnvironment takes over (its ranks equal RANK/WORLD_SIZE/LOCAL_RANK here;
  give the Trainer devices=<slots> and num_nodes=<nodes>: it checks ntasks-per-node);
- deepspeed: DeepSpeed's RANK/LOCAL_RANK/WORLD_SIZE/CROSS_RANK/LOCAL_SIZE and, from the
  ds_rank wrapper written into the job directory (which every node must see, as it must the
  script), NODE_RANK/GROUP_RANK/LOCAL_WORLD_SIZE, with Slurm's task ids dropped (the ranks
  are not Slurm tasks; a one-node job runs them in the batch step's environment).

Restarts (`--max-restarts N [--min-nodes M] [--checkpoint-dir DIR]`, launch's restart.py in
Slurm's terms). Slurm, not dscluster, sees a node fail, so the script leaves the restart to
it rather than looping inside the allocation (`--no-kill` keeps an allocation with a dead
node in it, and every launcher here would have to be started again on a node list it
trims by itself): with `#SBATCH --requeue` (JobRequeue=1, Slurm's default, does the same
unless the site turned it off) slurmctld puts the job back in the queue when one of its
nodes fails, keeps its job id, and runs this script again from the top on a new
allocation, with SLURM_RESTART_COUNT one higher. The script derives nodes, head and slots
from the allocation it finds, so each attempt runs on whatever Slurm gave it;
`--nodes=M-N` lets an attempt start on as few as M nodes (Slurm allocates as many as it
can up to N "without delaying the initiation of the job" -- the first attempt too, so M is
the fewest the job may ever run on, not only after a loss); fewer than M free keeps the
requeued job pending where launch would stop. Each attempt exports to every rank (the
batch step's environment, which srun hands to its tasks and DeepSpeed's launcher to a
one-node job; in the deepspeed mode also appended to the job's DS_ENV_FILE for pdsh):

    DSCLUSTER_RESTART          ${SLURM_RESTART_COUNT:-0}; past N the script stops in one
                               line and exits 1, which Slurm does not requeue (a non-zero
                               exit is requeued only when the site's RequeueExit names it)
    DSCLUSTER_CHECKPOINT_DIR   --checkpoint-dir, else <base>/$SLURM_JOB_ID: the job id is
                               the same in every attempt, so is the directory; <base> is
                               the inventory's dscluster_checkpoint_dir on shared storage,
                               else $JOB_DIR/checkpoints (the submit dir or --chdir)
    DSCLUSTER_CHECKPOINT_TAG   the tag DeepSpeed's `latest` there names, when that tag's
                               directory has entries (restart.complete_tag); else empty

The script reads `latest` itself, before any rank starts, as the job's own user, who
owns the checkpoint directory (these are that user's own files, not another user's, so
no privilege is at stake); neither `latest` nor the tag directory is followed through a
link, as in launch_watch.py. The tag must be a plain name (letters, digits, _ . @ % + = :
, -), which DeepSpeed's `global_step<n>` is; anything else counts as no checkpoint. A
script error is never restarted: Slurm requeues on a node failure, not on an exit code
(launch's --retry-on-error has no Slurm form here).

`render_sbatch` is pure; `write_sbatch` writes the script atomically.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex
from collections.abc import Mapping

from .deepspeed_env import check_env_value, parse_env_file, render_env
from .errors import DsclusterError
from .inventory import DEFAULT_MASTER_PORT, master_port_var, plain_var
from .launch import accelerate
from .launch.launchers.deepspeed import check_deepspeed_args, render_deepspeed_rank_wrapper
from .launch.restart import check_checkpoint_dir
from .launch_env import SYSTEM_PATH
from .storage import SOURCE_SECRETS, inventory_paths
from .util import atomic_write
from .validate import MAX_RESTARTS, read_text

MODES = ("deepspeed", "torchrun", "srun", "accelerate")
DEFAULT_VENV = "/opt/dscluster/venv"
# Slurm's --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or unlimited.
TIME_RE = re.compile(
    r"^(?:[0-9]+(?::[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(?::[0-9]{1,2}){0,2}|unlimited|infinite)$",
    re.IGNORECASE,
)
# #SBATCH values and the job script's own paths: no blanks, quotes or shell specials.
SBATCH_VALUE_RE = re.compile(r"^[A-Za-z0-9_@%+=:,./~%-]+$")


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
    accelerate_config: str = ""  # the user's accelerate config text ("": generated)
    accelerate_config_name: str = accelerate.CONFIG_NAME  # .json for a JSON config
    accelerate_config_kind: str = "ddp"
    max_restarts: int | None = None  # None: no restart block, the script as before
    min_nodes: int | None = None  # #SBATCH --nodes=MIN-nodes
    checkpoint_dir: str = ""  # "" -> <checkpoint_base>/$SLURM_JOB_ID
    checkpoint_base: str = ""  # the inventory's shared dscluster_checkpoint_dir; "" -> job dir

    @property
    def port(self) -> int:
        return DEFAULT_MASTER_PORT if self.master_port is None else self.master_port

    @property
    def restarts(self) -> bool:
        return self.max_restarts is not None or bool(self.checkpoint_dir)


def _check_value(flag: str, value: str | None) -> None:
    if value is not None and not SBATCH_VALUE_RE.fullmatch(value):
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
    if opts.time is not None and not TIME_RE.fullmatch(opts.time):
        raise DsclusterError(
            f"--time {opts.time!r} is not a Slurm time; use minutes, HH:MM:SS or D-HH:MM:SS "
            "(e.g. --time 1-00:00:00)"
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
    if opts.chdir is not None and not opts.chdir.startswith("/"):
        raise DsclusterError(
            f"--chdir {opts.chdir} is not an absolute path; give the job's directory on the "
            "nodes, e.g. --chdir /shared/jobs/run1"
        )
    for key, value in opts.env.items():
        check_env_value(key, value)
    _check_restarts(opts)
    _check_mode(opts)


def _check_restarts(opts: SbatchOptions) -> None:
    """--max-restarts, --min-nodes, --checkpoint-dir: the ranges launch's flags have."""
    if opts.max_restarts is not None and not 0 <= opts.max_restarts <= MAX_RESTARTS:
        raise DsclusterError(
            f"--max-restarts {opts.max_restarts} is out of range; give a restart count from "
            f"0 to {MAX_RESTARTS}, e.g. 3"
        )
    if opts.checkpoint_dir:
        check_checkpoint_dir(opts.checkpoint_dir)
    if opts.min_nodes is None:
        return
    if opts.min_nodes < 1:
        raise DsclusterError(f"--min-nodes {opts.min_nodes} is out of range; give 1 or more")
    if not opts.max_restarts:
        raise DsclusterError(
            f"--min-nodes {opts.min_nodes} is the fewest nodes a requeued job starts on, and "
            "--max-restarts is not given or 0; give --max-restarts N"
        )
    if opts.nodes is None or opts.min_nodes > opts.nodes:
        raise DsclusterError(
            f"--min-nodes {opts.min_nodes} is above --nodes {opts.nodes or '(not given: 1)'}; "
            f"give --nodes {max(opts.min_nodes, opts.nodes or 1)} or more, or a smaller "
            "--min-nodes"
        )


def _check_mode(opts: SbatchOptions) -> None:
    if opts.launcher == "deepspeed":
        # The deepspeed launcher hands the arguments to a remote shell (pdsh), as in launch.
        check_deepspeed_args(opts.command)
    if opts.launcher == "accelerate":
        accelerate_config(opts)


# Ends the accelerate config's here-document in the batch script.
CONFIG_END = "DSCLUSTER_ACCELERATE_CONFIG_END"


def accelerate_config(opts: SbatchOptions) -> tuple[str, dict]:
    """The config's text (the user's, else generated) and its parsed form, checked."""
    if opts.accelerate_config:
        text, name = opts.accelerate_config, opts.accelerate_config_name
    else:
        kind = "cuda" if opts.gres and "gpu" in opts.gres else "cpu"
        name = accelerate.CONFIG_NAME
        text = accelerate.render_config(
            opts.accelerate_config_kind, kind, num_machines=opts.nodes or 1, num_processes=1
        )
    config = accelerate.parse_config(text, name)
    if CONFIG_END in text.splitlines():
        raise DsclusterError(
            f"--accelerate-config has a line {CONFIG_END}, which ends the batch script's copy "
            "of it; remove that line"
        )
    return text if text.endswith("\n") else text + "\n", config


def launch_env(opts: SbatchOptions) -> dict[str, str]:
    """What every rank gets: the inventory's .deepspeed_env, PATH defaulting to the venv."""
    env = {"PATH": f"{opts.venv}/bin:{SYSTEM_PATH}", "PYTHONUNBUFFERED": "1"}
    env.update(opts.env)
    return env


def _sbatch_header(opts: SbatchOptions) -> list[str]:
    lines = ["#!/bin/bash"]
    nodes: str | int | None = opts.nodes
    if opts.min_nodes is not None and opts.min_nodes != opts.nodes:
        nodes = f"{opts.min_nodes}-{opts.nodes}"  # a requeued job may start on fewer
    for flag, value in (
        ("--job-name", opts.job_name),
        ("--nodes", nodes),
        ("--ntasks-per-node", opts.slots),
        ("--gres", opts.gres),
        ("--partition", opts.partition),
        ("--time", opts.time),
        ("--output", opts.slurm_output),
        ("--chdir", opts.chdir),
    ):
        if value is not None:
            lines.append(f"#SBATCH {flag}={value}")
    if opts.max_restarts:
        lines.append("#SBATCH --requeue")
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
# Each rank runs through this wrapper (--no_python): Lightning's NODE_RANK and the rest.
rank_wrapper="$job_dir/ds_rank.$SLURM_JOB_ID.sh"
cat >"$rank_wrapper" <<'DSCLUSTER_RANK'
@RANK_WRAPPER@DSCLUSTER_RANK
chmod 0755 "$rank_wrapper"
@RESTART_ENV@export PDSH_RCMD_TYPE=ssh
"$VENV/bin/deepspeed" --hostfile "$hostfile" --launcher pdsh \
  --master_addr "$head_node" --master_port "$PORT" --no_python "$rank_wrapper" \
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


_ACCELERATE = r"""
# One `accelerate launch` per node (an srun task each): static rendezvous on the first node,
# machine rank = the node's Slurm id. Each node writes the config into a directory of its own
# that mktemp makes (0700, a name nobody can guess or make first), with noclobber: another
# user's file or link at a predictable /tmp path is never written through.
DSCLUSTER_ACCELERATE_CONFIG=$(cat <<'DSCLUSTER_ACCELERATE_CONFIG_END'
@CONFIG@DSCLUSTER_ACCELERATE_CONFIG_END
)
export DSCLUSTER_ACCELERATE_CONFIG
num_processes=$(( num_nodes * slots ))
accelerate_extra=()
# MULTI_CPU alone starts one process per node: --multi_gpu starts every rank (torch's run).
if [[ -n "@MULTI_CPU@" ]] && (( num_processes > 1 )); then accelerate_extra+=(--multi_gpu); fi
NODE_CMD='dir=$(mktemp -d "${TMPDIR:-/tmp}/dscluster-accelerate.$SLURM_JOB_ID.XXXXXXXX") || exit 1
cfg="$dir/config@SUFFIX@"
(set -C; umask 077; printf "%s
" "$DSCLUSTER_ACCELERATE_CONFIG" >"$cfg") || exit 1
exec "$0" launch --config_file "$cfg" --machine_rank "$SLURM_NODEID" "$@"'
srun --nodes="$num_nodes" --ntasks="$num_nodes" --ntasks-per-node=1 \
  --cpus-per-task="$node_cpus" --kill-on-bad-exit=1 \
  bash -c "$NODE_CMD" "$VENV/bin/accelerate" \
  --main_process_ip "$head_node" --main_process_port "$PORT" \
  --num_machines "$num_nodes" --num_processes "$num_processes" \
  --rdzv_backend static --same_network --max_restarts 0 "${accelerate_extra[@]}" \
  @COMMAND@
"""


# Restarts: one block after the prelude (the module docstring says what and why).
_RESTART = r"""
DSCLUSTER_RESTART=${SLURM_RESTART_COUNT:-0}
if [[ ! "$DSCLUSTER_RESTART" =~ ^(0|[1-9][0-9]{0,8})$ ]] ||
  ((DSCLUSTER_RESTART > MAX_RESTARTS)); then
  echo "dscluster: job $SLURM_JOB_ID restart $DSCLUSTER_RESTART is past --max-restarts" \
    "$MAX_RESTARTS; not starting it again (checkpoints in $CHECKPOINT_DIR)" >&2
  exit 1
fi
# DeepSpeed's `latest` and the tag it names: this user's own files, no link followed.
DSCLUSTER_CHECKPOINT_TAG=
if [ -f "$CHECKPOINT_DIR/latest" ] && [ ! -L "$CHECKPOINT_DIR/latest" ]; then
  tag=$(cat -- "$CHECKPOINT_DIR/latest") || tag=
  case $tag in '' | . | .. | *[!A-Za-z0-9_.@%+=:,-]*) tag= ;; esac
  if [ -n "$tag" ] && [ -d "$CHECKPOINT_DIR/$tag" ] && [ ! -L "$CHECKPOINT_DIR/$tag" ] &&
    [ -n "$(ls -A -- "$CHECKPOINT_DIR/$tag")" ]; then
    DSCLUSTER_CHECKPOINT_TAG=$tag
  fi
fi
export DSCLUSTER_RESTART DSCLUSTER_CHECKPOINT_DIR=$CHECKPOINT_DIR DSCLUSTER_CHECKPOINT_TAG
echo "dscluster: restart $DSCLUSTER_RESTART of --max-restarts $MAX_RESTARTS, checkpoints in" \
  "$CHECKPOINT_DIR, resuming from ${DSCLUSTER_CHECKPOINT_TAG:-no checkpoint}"
"""

# The deepspeed mode: pdsh carries only DS_ENV_FILE's lines to the other nodes.
_RESTART_DS_ENV = r"""printf 'DSCLUSTER_%s\n' "RESTART=$DSCLUSTER_RESTART" \
  "CHECKPOINT_DIR=$DSCLUSTER_CHECKPOINT_DIR" "CHECKPOINT_TAG=$DSCLUSTER_CHECKPOINT_TAG" \
  >>"$DS_ENV_FILE"
"""


def render_restart(opts: SbatchOptions) -> str:
    """The restart block (after the prelude, before the launcher); "" without restarts."""
    if not opts.restarts:
        return ""
    q = shlex.quote
    if opts.checkpoint_dir:
        where = q(check_checkpoint_dir(opts.checkpoint_dir))
    else:
        base = q(opts.checkpoint_base) if opts.checkpoint_base else '"$JOB_DIR"/checkpoints'
        where = f'{base}/"$SLURM_JOB_ID"'
    head = [
        "",
        "# Restarts (--max-restarts): Slurm requeues this job when a node of it fails and runs",
        "# this script again from the top, SLURM_RESTART_COUNT one higher, the job id the same.",
        f"MAX_RESTARTS={opts.max_restarts or 0}",
        f"CHECKPOINT_DIR={where}",
    ]
    return "\n".join(head) + _RESTART


def _fill(opts: SbatchOptions, env_file: str) -> dict[str, str]:
    """What the mode's body template gets."""
    fill = {
        "@ENV_FILE@": env_file,
        "@RESTART_ENV@": _RESTART_DS_ENV if opts.restarts else "",
        "@COMMAND@": " ".join(shlex.quote(a) for a in opts.command),
        "@RANK_WRAPPER@": render_deepspeed_rank_wrapper(shlex.quote(f"{opts.venv}/bin/python")),
    }
    if opts.launcher == "accelerate":
        text, config = accelerate_config(opts)
        fill["@CONFIG@"] = text
        fill["@MULTI_CPU@"] = "1" if accelerate.extra_args(config, 2) else ""
        fill["@SUFFIX@"] = pathlib.PurePath(opts.accelerate_config_name).suffix or ".yaml"
    return fill


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
    # Job secrets from the node's own 0600 file: srun's tasks inherit them, ds_rank.sh sources
    # them again on the nodes pdsh reaches.
    lines.append(SOURCE_SECRETS)
    modes = {"deepspeed": _DEEPSPEED, "torchrun": _TORCHRUN, "srun": _SRUN}
    body = (modes | {"accelerate": _ACCELERATE})[opts.launcher]
    fill = _fill(opts, env_file)
    body = re.sub("|".join(fill), lambda m: fill[m.group(0)], body)
    return "\n".join(lines) + "\n" + _PRELUDE + render_restart(opts) + body


def default_script_path(mode: str) -> pathlib.Path:
    return pathlib.Path(f"dscluster-{mode}.sbatch")


def inventory_defaults(source: str) -> tuple[str | None, int | None, dict[str, str], str]:
    """(venv, port, .deepspeed_env, checkpoint base) from an inventory: dscluster_venv,
    dscluster_master_port, the .deepspeed_env written beside its hostfile by `dscluster
    hostfile`, and dscluster_checkpoint_dir when it is on shared storage ("" when it is
    node-local: a requeued job's batch host may be another node)."""
    from .inventory import load  # noqa: PLC0415 (runs ansible-inventory)

    inv = load(source)
    venv = plain_var(inv, "dscluster_venv")
    port = master_port_var(inv)
    env_path = inv.directory / ".deepspeed_env"
    env = (
        parse_env_file(read_text(env_path, ".deepspeed_env"), str(env_path))
        if env_path.is_file()
        else {}
    )
    paths = inventory_paths(inv)
    return (str(venv) if venv else None), port, env, paths.checkpoint_dir if paths.shared else ""


def write_sbatch(opts: SbatchOptions, out: pathlib.Path | None = None) -> pathlib.Path:
    """Render the batch script (nothing written on any error), then write it, executable."""
    text = render_sbatch(opts)
    path = out or default_script_path(opts.launcher)
    atomic_write(path, text, mode=0o755)
    return path

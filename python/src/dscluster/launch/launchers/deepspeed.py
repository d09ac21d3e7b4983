"""--launcher deepspeed: DeepSpeed's runner over pdsh, its filters verbatim; each rank runs
ds_rank.sh, which adds the rank variables DeepSpeed's launch.py leaves out."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from ...errors import DsclusterError
from ...storage import SOURCE_SECRETS
from .base import Files, HeadCommand, Job, Raw

# DeepSpeed's PDSHRunner pastes user arguments into the remote shell's command line, wrapping
# only those with a space in "...": any other shell character would arrive changed, and pdsh
# itself replaces %h, %n and %u.
DEEPSPEED_SAFE_ARG_RE = re.compile(r"^[\w@+=:,./ -]+$")
DS_RANK_WRAPPER = "./ds_rank.sh"
# The deepspeed launcher reads ./.deepspeed_env on the head and exports it to ranks.
EXPORT_LAUNCH_TIME = 'echo "DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME" >> .deepspeed_env'


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
    """The deepspeed launcher over pdsh; filters in DeepSpeed's own syntax, verbatim.

    --force_multi: over pdsh even on one node. Without it DeepSpeed's runner starts a
    one-node run locally and reads no .deepspeed_env (it is read for pdsh's exports only),
    so the ranks would miss the site's variables and the job's own (DSCLUSTER_CHECKPOINT_DIR,
    DSCLUSTER_LAUNCH_TIME), and their lines pdsh's "host: " prefix the watcher reads."""
    check_deepspeed_args(program)
    argv = [f"{venv}/bin/deepspeed", "--hostfile", "hostfile", "--launcher", "pdsh"]
    argv += ["--force_multi"]
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


def render(job: Job, files: Files) -> HeadCommand:
    request, venv = job.request, job.site.venv
    argv = deepspeed_argv(
        venv=venv,
        master=job.master,
        master_port=request.master_port,
        program=request.program,
        include=request.include,
        exclude=request.exclude,
        num_nodes=request.num_nodes,
        num_gpus=request.num_gpus,
    )
    files["ds_rank.sh"] = (render_deepspeed_rank_wrapper(shlex.quote(f"{venv}/bin/python")), "0755")
    return HeadCommand(argv, [EXPORT_LAUNCH_TIME])

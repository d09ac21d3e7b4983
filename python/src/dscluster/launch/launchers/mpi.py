"""--launcher mpi: OpenMPI's mpirun over ssh with the job's own MPI hostfile; each rank runs
mpi_rank.sh, which turns OpenMPI's rank variables into torch.distributed's."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ...hostfile import render_hostfile
from ...storage import SOURCE_SECRETS
from .base import SSH_LIVENESS_ARGS, Files, HeadCommand, Job, whole_slots_only


def render_mpi_hostfile(resources: Mapping[str, Sequence[int]]) -> str:
    """OpenMPI's hostfile format: `host slots=N`, one line per selected host."""
    return render_hostfile((host, len(slots)) for host, slots in resources.items())


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


def render(job: Job, files: Files) -> HeadCommand:
    whole_slots_only(job)
    files["mpi_hostfile"] = (render_mpi_hostfile(job.resources), "0644")
    files["mpi_rank.sh"] = (
        render_mpi_rank_wrapper(job.site.venv, [len(s) for s in job.resources.values()]),
        "0755",
    )
    argv = mpi_argv(
        master=job.master,
        master_port=job.request.master_port,
        job_dir=job.site.job_dir,
        world_size=job.world_size,
        env=job.env,
        program=job.request.program,
        interface=job.site.interface,
    )
    return HeadCommand(argv)

"""--launcher gaudi_spawn: optimum-habana's gaudi_spawn.py, which runs DeepSpeed's launcher
itself over the job's (selected) hostfile, on HCCL's interface."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ...errors import DsclusterError
from .base import Files, HeadCommand, Job, whole_slots_only
from .deepspeed import EXPORT_LAUNCH_TIME, check_deepspeed_args
from .mpi import render_mpi_hostfile

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


def render(job: Job, files: Files) -> HeadCommand:
    gaudi_spawn, port = job.request.gaudi_spawn, job.request.master_port
    if not gaudi_spawn:
        raise DsclusterError(
            "--launcher gaudi_spawn needs --gaudi-spawn PATH: optimum-habana's "
            "examples/gaudi_spawn.py (a local file to stage, or its absolute path on the nodes)"
        )
    if port != GAUDI_SPAWN_PORT:
        raise DsclusterError(
            f"--master-port {port}: gaudi_spawn.py starts DeepSpeed on port "
            f"{GAUDI_SPAWN_PORT} and takes no other; drop --master-port (or set "
            f"dscluster_master_port: {GAUDI_SPAWN_PORT})"
        )
    whole_slots_only(job, prefix=True)
    files["gaudi_hostfile"] = (render_mpi_hostfile(job.resources), "0644")
    env_text, mode = files[".deepspeed_env"]
    files[".deepspeed_env"] = (env_text + hccl_env(job.env, job.site.interface), mode)
    argv = gaudi_spawn_argv(
        venv=job.site.venv,
        gaudi_spawn=gaudi_spawn,
        world_size=job.world_size,
        program=job.request.program,
    )
    prelude = []
    if gaudi_spawn.startswith("/"):
        where = shlex.quote(gaudi_spawn)
        prelude.append(
            f"[ -f {where} ] || {{ printf 'dscluster: --gaudi-spawn %s is not a file on %s; "
            "give the path of examples/gaudi_spawn.py from optimum-habana there, or a local "
            f'copy to stage\\n\' {where} "$(hostname)" >&2; exit 2; }}'
        )
    return HeadCommand(argv, [*prelude, EXPORT_LAUNCH_TIME])

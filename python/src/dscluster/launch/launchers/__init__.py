"""One module per launcher, behind one table: each renders, for a Job, the head's command
and the files it stages with the job (`render(job, files) -> HeadCommand`).

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

from collections.abc import Callable

from . import accelerate, deepspeed, gaudi_spawn, mpi, torchrun
from .base import Files, HeadCommand, Job

Launcher = Callable[[Job, Files], HeadCommand]

# --launcher NAME -> its module's render; the order is the one --help and errors list.
TABLE: dict[str, Launcher] = {
    "deepspeed": deepspeed.render,
    "torchrun": torchrun.render,
    "mpi": mpi.render,
    "accelerate": accelerate.render,
    "gaudi_spawn": gaudi_spawn.render,
}
LAUNCHERS = tuple(TABLE)

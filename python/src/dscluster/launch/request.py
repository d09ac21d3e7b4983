"""What build_plan takes: the launch a caller asks for (LaunchRequest, built once by the CLI
or smoke) and where the job runs (JobSite, from the inventory's launch files); pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from ..inventory import DEFAULT_MASTER_PORT


@dataclasses.dataclass(frozen=True)
class LaunchRequest:
    """One launch as asked for.

    program: script + args, relative to the job dir or absolute. include/exclude/num_nodes/
    num_gpus: DeepSpeed's resource filters. accelerate_config(_name): the text and file name
    of the user's accelerate config, else one of accelerate_config_kind is generated.
    gaudi_spawn: gaudi_spawn.py's path in the job. nnodes: torchrun's elastic mode
    (--nnodes MIN:MAX; None: every selected node, fixed), whose agents restart the workers
    up to torchrun_max_restarts times, on the nodes left when one is lost.
    """

    launcher: str
    program: Sequence[str] = ()
    include: str = ""
    exclude: str = ""
    num_nodes: int | None = None
    num_gpus: int | None = None
    master_port: int = DEFAULT_MASTER_PORT
    accelerate_config: str = ""
    accelerate_config_name: str = ""
    accelerate_config_kind: str = "ddp"
    gaudi_spawn: str = ""
    nnodes: tuple[int, int] | None = None
    torchrun_max_restarts: int = 0


@dataclasses.dataclass(frozen=True)
class JobSite:
    """Where the job runs: pool/accelerators are host -> slots / accelerator kind, in
    hostfile order, head first; interface is the one the nodes share ("" when they differ).
    job_env: this run's own variables (launch --max-restarts: DSCLUSTER_RESTART, ...), set in
    the job's `.deepspeed_env` over env_text's, an empty value allowed (restart.py)."""

    run_id: str
    job_dir: str
    head: str
    venv: str
    pool: Mapping[str, int]
    accelerators: Mapping[str, str]
    hostfile_text: str
    env_text: str
    interface: str = ""
    job_env: Mapping[str, str] = dataclasses.field(default_factory=dict)

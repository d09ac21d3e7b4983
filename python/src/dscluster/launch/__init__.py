"""`dscluster launch`: run a script across the cluster with the deepspeed launcher (pdsh),
torchrun (c10d rendezvous, one agent per node over pdsh), accelerate (one `accelerate launch`
per node over pdsh; accelerate.py: its config), OpenMPI's mpirun or optimum-habana's
gaudi_spawn.py.

request.py: LaunchRequest (what a caller asks for) and JobSite (where the job runs);
select.py: resource selection; launchers/: one module per launcher (its argv, hostfiles and
the scripts staged with the job) behind launchers.TABLE; render.py: build_plan, the head's
launch.sh and the Plan; watch.py: which node a failed launch lost; signatures.py: the known
failure signatures a failed job's log is matched against, each with its fix; exclude.py: the
run's site and request without the nodes `--exclude-unhealthy` leaves out; restart.py:
`--max-restarts`, a job that lost nodes run again without them from its last complete
checkpoint (the `DSCLUSTER_STEP <n>` line, the run record); run.py:
`run_job`, the one place that does I/O: it stages the job through playbooks/launch.yml, which
runs `launch.sh` on the head in the job directory with a bounded `timeout`. All pure but
run.py.

`--include/--exclude/--num-nodes/--num-gpus` follow DeepSpeed's launcher
(deepspeed/launcher/runner.py: parse_node_config, parse_resource_filter,
parse_inclusion_exclusion, apply_num_nodes_and_gpus) for every launcher: the deepspeed
launcher gets them verbatim, torchrun and mpi get the hosts and slots they select.
"""

from __future__ import annotations

from .launchers import LAUNCHERS
from .launchers.accelerate import accelerate_argv
from .launchers.base import (
    LAUNCH_TIME,
    SSH_LIVENESS_ARGS,
    VISIBLE_DEVICES_ENV,
    Raw,
    shell_join,
    visible_devices,
)
from .launchers.deepspeed import (
    DEEPSPEED_SAFE_ARG_RE,
    DS_RANK_WRAPPER,
    check_deepspeed_args,
    deepspeed_argv,
    render_deepspeed_rank_wrapper,
)
from .launchers.gaudi_spawn import GAUDI_SPAWN_PORT, gaudi_spawn_argv
from .launchers.mpi import mpi_argv, render_mpi_hostfile, render_mpi_rank_wrapper
from .launchers.torchrun import (
    ELASTIC_RESTART_BOUND,
    PDSH_MAX_FAN_OUT,
    render_torchrun_node_script,
    torchrun_argv,
    torchrun_pdsh_argv,
)
from .render import LOST_NODE_GRACE, Plan, build_plan, render_launch_script, watch_source
from .request import JobSite, LaunchRequest
from .run import (
    JobResult,
    describe,
    job_dir_for,
    launch,
    new_run_id,
    plan_for,
    program_for,
    run_job,
    write_launch_set,
)
from .select import parse_node_specs, select_resources
from .watch import MPI_EXIT_CODE_RE, MPI_PROCESS_RE, lost_nodes

__all__ = [
    "DEEPSPEED_SAFE_ARG_RE",
    "DS_RANK_WRAPPER",
    "ELASTIC_RESTART_BOUND",
    "GAUDI_SPAWN_PORT",
    "LAUNCHERS",
    "LAUNCH_TIME",
    "LOST_NODE_GRACE",
    "MPI_EXIT_CODE_RE",
    "MPI_PROCESS_RE",
    "PDSH_MAX_FAN_OUT",
    "SSH_LIVENESS_ARGS",
    "VISIBLE_DEVICES_ENV",
    "JobResult",
    "JobSite",
    "LaunchRequest",
    "Plan",
    "Raw",
    "accelerate_argv",
    "build_plan",
    "check_deepspeed_args",
    "deepspeed_argv",
    "describe",
    "gaudi_spawn_argv",
    "job_dir_for",
    "launch",
    "lost_nodes",
    "mpi_argv",
    "new_run_id",
    "parse_node_specs",
    "plan_for",
    "program_for",
    "render_deepspeed_rank_wrapper",
    "render_launch_script",
    "render_mpi_hostfile",
    "render_mpi_rank_wrapper",
    "render_torchrun_node_script",
    "run_job",
    "select_resources",
    "shell_join",
    "torchrun_argv",
    "torchrun_pdsh_argv",
    "visible_devices",
    "watch_source",
    "write_launch_set",
]

"""`dscluster smoke`: a real DeepSpeed job across every slot, checked and reported.

The job goes through `dscluster launch`'s path (launch/, playbooks/smoke.yml = launch.yml)
with any of its launchers: deepspeed (pdsh), torchrun (c10d) or mpi (mpirun). One launch runs
the whole matrix of ZeRO stages x offload (jobs/smoke_job.py, with the modules staged beside it:
jobs.SMOKE_JOB_FILES) and a pairwise bandwidth pass; the straggler maths here is pure and runs
on the controller over the job's report.

devices.py: the slow-device judge over every rank's device benchmark (pure); ceilings.py:
the published bandwidth ceilings per interconnect, with sources (data); fabric.py: grading
the all-reduce and point-to-point figures against them or the measured raw TCP (pure);
stragglers.py: the straggler maths (pure; the bandwidth rules are the job's own,
jobs/smoke_checks.py, which the job asks before measuring again); run.py: staging, launching
and checking the job; tables.py: the report's tables; figure.py: its PNG (matplotlib, loaded
only to draw).
"""

from __future__ import annotations

from ..jobs.smoke_checks import link_bandwidths
from ..launch import lost_nodes
from .devices import DEFAULT_DEVICE_THRESHOLD, SlowDevice, report_slow_devices, slow_devices
from .fabric import DEFAULT_MIN_FABRIC_FRACTION, FabricContext, grade
from .run import job_sources, run_smoke
from .stragglers import (
    DEFAULT_STRAGGLER_FACTOR,
    Straggler,
    find_stragglers,
    host_step_times,
    report_stragglers,
)
from .tables import (
    bandwidth_table,
    config_table,
    configs_label,
    device_table,
    fabric_table,
    link_table,
    rank_table,
)

__all__ = [
    "DEFAULT_DEVICE_THRESHOLD",
    "DEFAULT_MIN_FABRIC_FRACTION",
    "DEFAULT_STRAGGLER_FACTOR",
    "FabricContext",
    "SlowDevice",
    "Straggler",
    "bandwidth_table",
    "config_table",
    "configs_label",
    "device_table",
    "fabric_table",
    "find_stragglers",
    "grade",
    "host_step_times",
    "job_sources",
    "link_bandwidths",
    "link_table",
    "lost_nodes",
    "rank_table",
    "report_slow_devices",
    "report_stragglers",
    "run_smoke",
    "slow_devices",
]

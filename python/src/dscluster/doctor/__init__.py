"""`dscluster doctor`: every node and every pair of nodes checked before a job starts.

playbooks/doctor.yml (role `doctor`) gathers findings on the nodes and hands them to the
controller as the play's custom stats (host -> findings); `evaluate` judges them here, as
pure functions: a table of check x node (pass / warn / fail / skip), one line per problem
naming the node and the fix.

Attribution for pairwise checks (SSH, ports): a target that no node reaches is the target's
fault (sshd down, a firewall on it); a source that reaches no target is the source's; other
failed pairs are the source's, naming the target. A node the controller cannot reach fails
`reach`, and nothing else is blamed on it or on the nodes that could not reach it.

report.py: the table, problem lines and summary; findings.py: reading one node's findings;
network.py: checks between nodes (ssh, pdsh, memlock, resolve, ports, clock); node.py: checks
on each node (shm, disk, shared, libaio, ifname, versions, slots); health/: the node health
checks on the vendor tools' recorded outputs (health/registry.py: CHECKS and JUDGES);
record.py: those outputs from a live run, `--record DIR` and `--replay DIR`; evaluate.py: all
of them over every node; run.py: gathering the findings with playbooks/doctor.yml, preflight;
exclude.py: the nodes `--exclude-unhealthy` leaves out of a run, acting on the report.
"""

from __future__ import annotations

from .evaluate import evaluate
from .exclude import Excluded, check_left, unhealthy
from .findings import attribute, load_json, stdout_json, step_error
from .network import judge_clock, judge_pdsh_memlock, judge_ports, judge_resolve, judge_ssh
from .node import RDMA_PROFILES, VERSION_FIELDS, judge_local, judge_slots, judge_versions
from .record import read_record, replay, write_record
from .report import (
    CHECKS,
    CLUSTER_CHECKS,
    GIB,
    HEALTH_CHECKS,
    MIB,
    STATUS_ORDER,
    STYLE,
    Cell,
    DoctorReport,
    Thresholds,
    problem_lines,
    skip_lines,
    summary_line,
    table,
)
from .run import preflight, require_healthy, run_doctor

__all__ = [
    "CHECKS",
    "CLUSTER_CHECKS",
    "GIB",
    "HEALTH_CHECKS",
    "MIB",
    "RDMA_PROFILES",
    "STATUS_ORDER",
    "STYLE",
    "VERSION_FIELDS",
    "Cell",
    "DoctorReport",
    "Excluded",
    "Thresholds",
    "attribute",
    "check_left",
    "evaluate",
    "judge_clock",
    "judge_local",
    "judge_pdsh_memlock",
    "judge_ports",
    "judge_resolve",
    "judge_slots",
    "judge_ssh",
    "judge_versions",
    "load_json",
    "preflight",
    "problem_lines",
    "read_record",
    "replay",
    "require_healthy",
    "run_doctor",
    "skip_lines",
    "stdout_json",
    "step_error",
    "summary_line",
    "table",
    "unhealthy",
    "write_record",
]

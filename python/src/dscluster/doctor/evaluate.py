"""`evaluate`: every check over every node's findings, as pure functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..inventory import DEFAULT_MASTER_PORT
from .findings import stdout_json, step_error
from .network import judge_clock, judge_pdsh_memlock, judge_ports, judge_resolve, judge_ssh
from .node import judge_local, judge_slots, judge_versions
from .record import Recording, judge_health, recordings
from .report import CHECKS, DoctorReport, Thresholds


def evaluate(  # noqa: PLR0913 - every finding the judges read, each a keyword
    hosts: Sequence[str],
    head: str,
    findings: Mapping[str, Mapping[str, Any]],
    *,
    unreachable: Mapping[str, str] | None = None,
    hostfile_slots: Mapping[str, int] | None = None,
    expected_slots: Mapping[str, int] | None = None,
    cpu_slots: Mapping[str, int] | None = None,
    recorded: Mapping[str, Mapping[str, Any]] | None = None,
    shared_storage: bool = False,
    token: str = "",
    master_port: int = DEFAULT_MASTER_PORT,
    user: str = "ds",
    thresholds: Thresholds | None = None,
    instance_types: Mapping[str, str] | None = None,
    expected_efa: Mapping[str, int] | None = None,
    health: Mapping[str, Recording] | None = None,
) -> DoctorReport:
    """Judge the findings. findings: host -> the JSON the doctor role wrote for it.
    recorded: host -> its recorded facts (facts/<host>.json from provision), for the NCCL
    profile, the accelerator kind and the versions provision installed. health: the live
    nodes' health outputs (record.recordings of the same findings; made here when None)."""
    t = thresholds or Thresholds()
    unreachable = dict(unreachable or {})
    recorded = recorded or {}
    report = DoctorReport(hosts=list(hosts), head=head, cells={c: {} for c in CHECKS})
    live: list[str] = []
    node: dict[str, dict[str, Any]] = {}
    for host in hosts:
        finding = findings.get(host)
        if host in unreachable or finding is None:
            why = unreachable.get(host) or "no findings came back (the play stopped on it)"
            report.cell("reach", host).add(
                "fail",
                f"not reachable from the controller: {why}",
                f"start {host} or fix SSH to it; 'dscluster provision --allow-degraded' "
                "leaves it out of the hostfile",
            )
            for check in CHECKS:
                if check != "reach":
                    report.cell(check, host).add("skip", "node not reachable")
            continue
        report.cell("reach", host)
        live.append(host)
        data = stdout_json(finding, "node")
        if data is None:
            report.cell("versions", host).add("fail", step_error(finding, "node"))
            data = {}
        node[host] = data

    judge_ssh(report, live, findings, user)
    judge_pdsh_memlock(report, live, head, findings, recorded=recorded, t=t)
    judge_resolve(report, live, node)
    judge_ports(report, live, head, findings, master_port)
    judge_clock(report, live, head, findings, t)
    judge_local(report, live, node, t=t, shared_storage=shared_storage, token=token)
    judge_versions(report, live, head, node, recorded)
    judge_slots(
        report,
        live,
        node,
        hostfile_slots=hostfile_slots,
        expected_slots=expected_slots,
        cpu_slots=cpu_slots,
    )
    if health is None:
        health = recordings(
            live,
            findings,
            recorded=recorded,
            expected_slots=expected_slots,
            instance_types=instance_types,
            expected_efa=expected_efa,
        )
    judge_health(report, {h: r for h, r in health.items() if h in live})
    return report

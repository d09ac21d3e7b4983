"""The health checks: each check's tool, its one-line description and its judge, as a table.

A judge lives in the module of its tool's family (nvidia.py, hpu.py, xid.py, nvlink.py,
topology.py, fabric.py, dcgm.py); JUDGES maps each check to it. `judge_node` runs every
check on one node's recorded outputs; `add_cells` turns the findings into the report's
cells: the worst status wins and only its findings are shown, each detail led by its
action ("isolate: GPU 3 (0000:5d:00.0) fell off the bus (Xid 79)").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import (
    FILES,
    STATUS_ORDER,
    Expect,
    Finding,
    NodeOutputs,
    Unreadable,
    dcgm,
    fabric,
    hpu,
    nvidia,
    nvlink,
    topology,
    xid,
)

if TYPE_CHECKING:
    from ..report import DoctorReport

Judge = Callable[[NodeOutputs, Expect], list[Finding]]


@dataclasses.dataclass(frozen=True)
class Check:
    description: str  # one line, for report.CHECKS
    tool: str  # the tool(s) whose recorded output it reads (README's health table)


def _gpu_count(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    if expect.accelerator == "nvidia":
        return nvidia.judge_gpu_count(outputs, expect)
    if expect.accelerator == "gaudi":
        return hpu.judge_hpu_count(outputs, expect)
    return [Finding("skip", "no accelerators expected (cpu node)")]


CHECKS: dict[str, Check] = {
    "gpu_count": Check(
        "every GPU/HPU the node should have is present (nvidia-smi -q / hl-smi -q)",
        "nvidia-smi -q -x, hl-smi -q",
    ),
    "xid": Check(
        "no NVIDIA Xid/SXid errors in the kernel log since boot",
        "kernel log",
    ),
    "ecc": Check(
        "no uncorrectable ECC errors, no pending or failed row remaps",
        "nvidia-smi -q -x",
    ),
    "pcie": Check(
        "GPU PCIe links at their full width and generation",
        "nvidia-smi -q -x",
    ),
    "throttle": Check(
        "no thermal/power slowdown or hardware throttling",
        "nvidia-smi -q -x",
    ),
    "nvlink": Check(
        "every NVLink up, no error counters rising",
        "nvidia-smi nvlink -s / -e",
    ),
    "topology": Check(
        "GPUs near a NIC of their own NUMA node; no PCIe ACS redirect above GPUs/NICs",
        "nvidia-smi topo -m, lspci -vvv",
    ),
    "fabric": Check(
        "EFA/InfiniBand devices present and their ports active",
        "fi_info -p efa, ibv_devinfo",
    ),
    "dcgm": Check(
        "DCGM diagnostic passes (doctor --gpu-diag-budget)",
        "dcgmi diag -j",
    ),
    "hpu": Check("Gaudi HPUs healthy (hl-smi -q)", "hl-smi -q"),
}


JUDGES: dict[str, Judge] = {
    "gpu_count": _gpu_count,
    "xid": xid.judge_xid,
    "ecc": nvidia.judge_ecc,
    "pcie": nvidia.judge_pcie,
    "throttle": nvidia.judge_throttle,
    "nvlink": nvlink.judge_nvlink,
    "topology": topology.judge_topology,
    "fabric": fabric.judge_fabric,
    "dcgm": dcgm.judge_dcgm,
    "hpu": hpu.judge_hpu,
}


def unreadable_line(host: str, exc: Unreadable) -> str:
    """One line naming the node and the file: "<host>: <file> cannot be read: <why>; ..."."""
    name, _, why = str(exc).partition(": ")
    what = f"{name} cannot be read: {why}" if name in FILES else f"cannot be read: {exc}"
    return f"{host}: {what}; record again with 'dscluster doctor --record DIR'"


def judge_node(outputs: NodeOutputs, expect: Expect) -> dict[str, list[Finding]]:
    """Every health check on one node. A file a judge cannot parse fails the first check that
    reads it in one line naming the node and the file (the others skip); a judge's own error
    (a bug) fails its check, not the run."""
    results: dict[str, list[Finding]] = {}
    said: dict[str, str] = {}  # an unreadable file -> the check that failed on it first
    for check in CHECKS:
        try:
            results[check] = list(JUDGES[check](outputs, expect))
        except Unreadable as exc:
            name = str(exc).partition(": ")[0]
            if name in said:
                # one line per node and file: the other checks that read it skip
                results[check] = [Finding("skip", f"{name} cannot be read (see {said[name]})")]
                continue
            said[name] = check
            results[check] = [Finding("fail", unreadable_line(outputs.host, exc))]
        except Exception as exc:  # one judge's bug must not stop the others
            results[check] = [
                Finding(
                    "fail",
                    f"{outputs.host}: the {check} judge failed ({type(exc).__name__}: {exc})",
                    fix="a dscluster bug: report it with 'dscluster doctor --record DIR' attached",
                )
            ]
    return results


def detail(finding: Finding) -> str:
    return f"{finding.action}: {finding.detail}" if finding.action else finding.detail


def add_cells(report: DoctorReport, host: str, results: dict[str, list[Finding]]) -> None:
    """Findings into cells: the worst status wins and only its findings are listed."""
    for check, findings in results.items():
        cell = report.cell(check, host)
        if not findings:
            continue
        worst = max((f.status for f in findings), key=STATUS_ORDER.__getitem__)
        for finding in findings:
            if finding.status == worst:
                cell.add(finding.status, detail(finding), finding.fix, finding.evidence)

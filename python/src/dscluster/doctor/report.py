"""The doctor report: its checks, cells (check x node), table, problem lines, summary."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .health import STATUS_ORDER
from .health.registry import CHECKS as HEALTH

CLUSTER_CHECKS: dict[str, str] = {
    "reach": "the controller reaches the node (Ansible over SSH)",
    "ssh": "SSH to every node as the training user (BatchMode, StrictHostKeyChecking)",
    "pdsh": "pdsh from the head reaches the node (DeepSpeed's launcher path)",
    "resolve": "every cluster host name resolves to its address on this node",
    "rendezvous": "the head's rendezvous port is reachable from this node",
    "ports": "ephemeral TCP ports reachable between every pair of nodes",
    "clock": "clock offset from the head",
    "shm": "/dev/shm size",
    "memlock": "ulimit -l as the launcher's sessions see it (through pdsh)",
    "disk": "free disk on the venv and shared paths",
    "shared": "the shared path is really shared (a token written on the head)",
    "versions": "python/torch/deepspeed/ops/CUDA/NCCL/driver/SynapseAI/libfabric agree",
    "libaio": "libaio present and DeepSpeed's async_io op loadable",
    "slots": "hostfile slots match the accelerators detected now",
    "ifname": "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name an addressed interface",
}
# The node health checks (health/registry.py), judged on the vendor tools' recorded outputs.
HEALTH_CHECKS: dict[str, str] = {name: check.description for name, check in HEALTH.items()}
CHECKS: dict[str, str] = {**CLUSTER_CHECKS, **HEALTH_CHECKS}
STYLE = {"pass": "green", "skip": "dim", "warn": "yellow", "fail": "bold red"}


GIB = 1 << 30
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Thresholds:
    min_shm_bytes: int = GIB
    min_free_bytes: int = 2 * GIB
    warn_free_bytes: int = 10 * GIB
    clock_warn_s: float = 0.5
    clock_fail_s: float = 2.0
    # Where RDMA or accelerators pin memory (NCCL over EFA/IB, CUDA pinned buffers), memlock
    # must be unlimited; on CPU nodes over TCP a small limit only bounds pinned CPU buffers.
    min_memlock_kb_cpu: int = 64


@dataclasses.dataclass
class Cell:
    status: str = "pass"
    details: list[str] = dataclasses.field(default_factory=list)
    fixes: list[str] = dataclasses.field(default_factory=list)
    # the recorded lines a health finding came from (--json only; the table stays short)
    evidence: list[str] = dataclasses.field(default_factory=list)

    def add(self, status: str, detail: str, fix: str = "", evidence: str = "") -> None:
        if STATUS_ORDER[status] > STATUS_ORDER[self.status]:
            self.status = status
        if detail and detail not in self.details:
            self.details.append(detail)
        if fix and fix not in self.fixes:
            self.fixes.append(fix)
        if evidence and evidence not in self.evidence:
            self.evidence.append(evidence)


@dataclasses.dataclass
class DoctorReport:
    hosts: list[str]
    head: str
    cells: dict[str, dict[str, Cell]]  # check -> host -> cell
    # the checks this report holds, in table order (a replay holds the health checks only)
    checks: list[str] = dataclasses.field(default_factory=lambda: list(CHECKS))
    title: str = ""  # the table's title; default "doctor: N nodes, head H"

    def cell(self, check: str, host: str) -> Cell:
        return self.cells.setdefault(check, {}).setdefault(host, Cell())

    @property
    def ok(self) -> bool:
        return not self.problems("fail")

    def problems(self, status: str = "fail") -> list[tuple[str, str, Cell]]:
        """(host, check, cell) with that status, in host order then check order."""
        out = []
        for host in self.hosts:
            for check in self.checks:
                cell = self.cells.get(check, {}).get(host)
                if cell and cell.status == status:
                    out.append((host, check, cell))
        return out

    def failed(self) -> set[tuple[str, str]]:
        return {(host, check) for host, check, _ in self.problems("fail")}

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "head": self.head,
            "hosts": self.hosts,
            "checks": {
                check: {host: dataclasses.asdict(cell) for host, cell in self.cells[check].items()}
                for check in self.checks
                if check in self.cells
            },
            "failures": [
                {"host": h, "check": c, "detail": "; ".join(cell.details), "fix": cell.fixes}
                for h, c, cell in self.problems("fail")
            ],
            "warnings": [
                {"host": h, "check": c, "detail": "; ".join(cell.details), "fix": cell.fixes}
                for h, c, cell in self.problems("warn")
            ],
        }


def table(report: DoctorReport, width: int | None = None) -> Table:
    """The checks down, the nodes across; where that is wider than `width` (a console's; 80
    columns when not a terminal: 16 nodes were then cut to "p…" in every cell), one row per
    node instead: how many checks passed, were skipped, warned and failed, and which did not
    pass. Either way the problem lines below it say what and how to fix it."""
    wide = _wide_table(report)
    if width is None or _needed_width(wide) <= width:
        return wide
    return _node_table(report)


def _titled(report: DoctorReport) -> Table:
    title = report.title or f"doctor: {len(report.hosts)} nodes, head {report.head}"
    return Table(title=title, title_justify="left")


def _status(report: DoctorReport, check: str, host: str) -> str:
    """A cell's status without adding the cell (report.cell() would)."""
    return (report.cells.get(check, {}).get(host) or Cell()).status


def _wide_table(report: DoctorReport) -> Table:
    t = _titled(report)
    t.add_column("check")
    for host in report.hosts:
        t.add_column(host)
    for check in report.checks:
        if check == next(iter(HEALTH_CHECKS)) and check != report.checks[0]:
            t.add_section()  # the cluster's checks above, the node health checks below
        row: list[str | Text] = [check]
        for host in report.hosts:
            status = _status(report, check, host)
            row.append(Text(status, style=STYLE[status]))
        t.add_row(*row)
    return t


def _needed_width(t: Table) -> int:
    """Columns the table takes unwrapped and uncut (rich's own measure, on a console wide
    enough for any table)."""
    console = Console(width=10_000)
    return Measurement.get(console, console.options, t).maximum


def _node_table(report: DoctorReport) -> Table:
    t = _titled(report)
    t.add_column("node", no_wrap=True)
    for status in STATUS_ORDER:
        t.add_column(status, justify="right")
    # Skips are counted, not named: a CPU node skips every GPU check, and a list of them
    # would bury the failures in a narrow column.
    t.add_column(f"failed or warned (of {len(report.checks)} checks)")
    for host in report.hosts:
        statuses = {check: _status(report, check, host) for check in report.checks}
        counts = [str(sum(1 for s in statuses.values() if s == status)) for status in STATUS_ORDER]
        others = Text(", ").join(
            Text(f"{check} {status}", style=STYLE[status])
            for check, status in statuses.items()
            if status in ("fail", "warn")
        )
        t.add_row(host, *counts, others)
    return t


def problem_lines(report: DoctorReport) -> list[str]:
    lines = []
    for status in ("fail", "warn"):
        for host, check, cell in report.problems(status):
            fix = f" — fix: {'; '.join(cell.fixes)}" if cell.fixes else ""
            lines.append(f"{status.upper()} {host} {check}: {'; '.join(cell.details)}{fix}")
    return lines


def skip_lines(report: DoctorReport) -> list[str]:
    """One line per reason a check was skipped and the nodes it was skipped on, naming the
    checks: a CPU cluster skips every GPU check for the same reason on every node, and one
    line says so (the table shows only "skip")."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for check in report.checks:
        by_reason: dict[str, list[str]] = {}
        for host in report.hosts:
            cell = report.cells.get(check, {}).get(host)
            if cell is not None and cell.status == "skip":
                why = "; ".join(cell.details) or "no reason given"
                by_reason.setdefault(why, []).append(host)
        for why, skipped in by_reason.items():
            groups.setdefault((why, tuple(skipped)), []).append(check)
    lines = []
    for (why, hosts), checks in groups.items():
        where = "every node" if len(hosts) == len(report.hosts) > 1 else ", ".join(hosts)
        lines.append(f"SKIP {', '.join(checks)} on {where}: {why}")
    return lines


def summary_line(report: DoctorReport) -> str:
    fails = report.problems("fail")
    if not fails:
        warns = len(report.problems("warn"))
        extra = f" ({warns} warning(s))" if warns else ""
        return f"doctor: every check passed on {len(report.hosts)} nodes{extra}"
    where = sorted({h for h, _, _ in fails}, key=report.hosts.index)
    checks = sorted({c for _, c, _ in fails}, key=report.checks.index)
    return (
        f"doctor: {len(fails)} failure(s) on {', '.join(where)} ({', '.join(checks)}); "
        f"first: {problem_lines(report)[0]}"
    )

"""Acting on doctor's report: the nodes `smoke`/`launch --exclude-unhealthy` leave out of one
run, and the refusals where that cannot give a sound run; pure.

A node leaves when any of its cells fails: a health finding that asks to isolate, reboot or
reset it fails (health.DRASTIC), so warnings, for monitor only, keep it. Every cell already
belongs to one node, the pairwise checks' too: doctor blames a target no node reaches, a
source that reaches no node, else the source of the one failed pair (findings.attribute), so
leaving the blamed nodes out leaves no failed cell among the others.

The head cannot leave: jobs start from it (launch.sh, pdsh, the job directory), and doctor
probes the rendezvous port, pdsh, memlock and the clocks from it alone, so no other node has
been shown fit to take its place. A failing head refuses the run in one line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import DsclusterError
from .report import DoctorReport


@dataclasses.dataclass(frozen=True)
class Excluded:
    """A node left out of one run: the checks that put it out and why, in one line."""

    host: str
    checks: tuple[str, ...]
    why: str  # "check: detail; check: detail"

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "checks": list(self.checks), "why": self.why}


def unhealthy(report: DoctorReport) -> list[Excluded]:
    """The nodes to leave out, in the report's host order: those with a failed cell."""
    out = []
    for host in report.hosts:
        reasons: dict[str, list[str]] = {}
        for check in report.checks:
            cell = report.cells.get(check, {}).get(host)
            if cell is None:
                continue
            if cell.status == "fail":
                reasons[check] = cell.details or ["failed"]
        if reasons:
            why = "; ".join(f"{check}: {'; '.join(details)}" for check, details in reasons.items())
            out.append(Excluded(host, tuple(reasons), why))
    return out


def check_left(report: DoctorReport, excluded: list[Excluded], what: str) -> None:
    """Refuse, in one line, a run --exclude-unhealthy cannot make sound: every node out, or
    the head out (module doc)."""
    out = {e.host: e for e in excluded}
    if out and all(h in out for h in report.hosts):
        who = "; ".join(f"{e.host} ({', '.join(e.checks)})" for e in excluded)
        raise DsclusterError(
            f"--exclude-unhealthy: doctor fails every node ({who}); nothing is left to run on — "
            f"{what} not started (fix them, see 'dscluster doctor')"
        )
    if report.head in out:
        head = out[report.head]
        raise DsclusterError(
            f"--exclude-unhealthy cannot leave out the head {head.host} ({head.why}): jobs "
            f"start from it and doctor checked the rendezvous there alone — {what} not started "
            "(fix it, see 'dscluster doctor')"
        )


def excluded_line(e: Excluded, what: str) -> str:
    return f"{what}: leaving {e.host} out of this run (--exclude-unhealthy): {e.why}"

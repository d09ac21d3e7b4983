"""Stragglers: links and nodes slower than the median by a factor (pure)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DsclusterError

# The bandwidth rules live in the smoke job (it asks them before measuring again, on the
# nodes, where nothing of dscluster is installed); the report names what they name.
from ..jobs.smoke_checks import bandwidth_stragglers

DEFAULT_STRAGGLER_FACTOR = 2.0


@dataclasses.dataclass(frozen=True)
class Straggler:
    """One slow node or link: what was measured against the median it fell behind."""

    kind: str  # "link" | "node"
    nodes: tuple[str, ...]
    metric: str  # "bandwidth" | "step time"
    value: float
    median: float
    factor: float

    @property
    def message(self) -> str:
        if self.metric == "step time":
            return (
                f"straggler: node {self.nodes[0]}: mean step time {1000 * self.value:.1f} ms, "
                f"above the median {1000 * self.median:.1f} ms x {self.factor:g}"
            )
        if self.kind == "link":
            return (
                f"straggler: link {self.nodes[0]} <-> {self.nodes[1]}: {self.value:.3f} GB/s, "
                f"below the median link {self.median:.3f} GB/s / {self.factor:g}"
            )
        return (
            f"straggler: node {self.nodes[0]}: median link bandwidth {self.value:.3f} GB/s, "
            f"below the median node {self.median:.3f} GB/s / {self.factor:g}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "nodes": list(self.nodes), "message": self.message}


def find_stragglers(
    hosts: Sequence[str],
    gbps: Sequence[Sequence[float | None]],
    step_s: Mapping[str, float],
    factor: float = DEFAULT_STRAGGLER_FACTOR,
) -> list[Straggler]:
    """Links and nodes slower than the median by more than `factor`.

    - the bandwidth rules (smoke_checks.bandwidth_stragglers): a node whose median link
      bandwidth is below the median of the nodes' medians / factor; a link below the median
      link bandwidth / factor, unless one of its nodes is named already;
    - a node whose mean step time (step_s: host -> seconds) is above the median * factor.
    Exactly at the threshold is not a straggler. With two nodes every measure is shared by
    both (one link), so only a difference in step time can single one out.
    """
    if factor < 1:
        raise DsclusterError(f"--straggler-factor {factor:g} is below 1; use 2 for 'twice as slow'")
    slow = bandwidth_stragglers(hosts, gbps, factor)
    found = [
        Straggler("link", pair, "bandwidth", bw, slow.link_median, factor)
        for pair, bw in slow.links
    ]
    found += [
        Straggler("node", (host,), "bandwidth", bw, slow.node_median, factor)
        for host, bw in slow.nodes
    ]
    if step_s:
        median = statistics.median(step_s.values())
        found += [
            Straggler("node", (host,), "step time", s, median, factor)
            for host, s in step_s.items()
            if s > median * factor
        ]
    return found


def host_step_times(ranks: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """host -> mean of its ranks' mean step time, hosts in rank order."""
    per_host: dict[str, list[float]] = {}
    for r in sorted(ranks, key=lambda r: r["rank"]):
        per_host.setdefault(r["host"], []).append(r["mean_step_s"])
    return {host: sum(times) / len(times) for host, times in per_host.items()}


def report_stragglers(report: Mapping[str, Any], factor: float) -> list[Straggler]:
    p2p = report.get("p2p") or {}
    return find_stragglers(
        p2p.get("hosts", []),
        p2p.get("gbps", []),
        host_step_times(report.get("ranks", [])),
        factor,
    )

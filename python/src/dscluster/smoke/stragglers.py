"""Stragglers: links and nodes slower than the median by a factor (pure)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DsclusterError

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


def link_bandwidths(
    hosts: Sequence[str], gbps: Sequence[Sequence[float | None]]
) -> dict[tuple[str, str], float]:
    """Each measured link's bandwidth: the slower of its two directions (gbps[i][j] is
    node i -> node j). A link with a direction not measured is left out."""

    def at(i: int, j: int) -> float | None:
        return gbps[i][j] if i < len(gbps) and j < len(gbps[i]) else None

    links = {}
    for i, a in enumerate(hosts):
        for j in range(i + 1, len(hosts)):
            there, back = at(i, j), at(j, i)
            if there is not None and back is not None:
                links[(a, hosts[j])] = min(there, back)
    return links


def find_stragglers(
    hosts: Sequence[str],
    gbps: Sequence[Sequence[float | None]],
    step_s: Mapping[str, float],
    factor: float = DEFAULT_STRAGGLER_FACTOR,
) -> list[Straggler]:
    """Links and nodes slower than the median by more than `factor`.

    - a node whose median link bandwidth is below the median of the nodes' medians / factor;
    - a link whose bandwidth is below the median link bandwidth / factor, unless one of its
      nodes is a bandwidth straggler already (that node's line names the cause: one slow
      NIC slows every link it is on, and those are not reported once more each);
    - a node whose mean step time (step_s: host -> seconds) is above the median * factor.
    Exactly at the threshold is not a straggler. With two nodes every measure is shared by
    both (one link), so only a difference in step time can single one out.
    """
    if factor < 1:
        raise DsclusterError(f"--straggler-factor {factor:g} is below 1; use 2 for 'twice as slow'")
    found: list[Straggler] = []
    links = link_bandwidths(hosts, gbps)
    if links:
        per_node = {
            host: statistics.median(bw for pair, bw in links.items() if host in pair)
            for host in hosts
            if any(host in pair for pair in links)
        }
        node_median = statistics.median(per_node.values())
        slow_nodes = [
            Straggler("node", (host,), "bandwidth", bw, node_median, factor)
            for host, bw in per_node.items()
            if bw < node_median / factor
        ]
        explained = {s.nodes[0] for s in slow_nodes}
        median = statistics.median(links.values())
        found += [
            Straggler("link", pair, "bandwidth", bw, median, factor)
            for pair, bw in links.items()
            if bw < median / factor and not explained & set(pair)
        ]
        found += slow_nodes
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

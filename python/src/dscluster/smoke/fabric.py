"""Grading smoke's all-reduce and point-to-point figures against the fabric's ceiling (pure).

The ceiling comes from what the recorded facts know (FabricContext): the GPU model (NVLink
within one node), the instance type (EFA across nodes), the NCCL profile; or, where no
published figure applies (CPU ranks, plain Ethernet, the local cluster's containers), the
raw TCP throughput the job measured between the nodes (report["tcp"]). The grade is a
fraction of it; below `min_fraction` is a warning naming the all-reduce, a link or a node.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DsclusterError
from . import ceilings
from .ceilings import Ceiling

DEFAULT_MIN_FABRIC_FRACTION = 0.5


@dataclasses.dataclass(frozen=True)
class FabricContext:
    """What the recorded facts say about the fabric (run_smoke builds it)."""

    accelerator: str = "cpu"
    models: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()  # the nodes' NCCL profiles, distinct
    instance_types: tuple[str, ...] = ()  # distinct, unrecorded left out
    gpus_per_node: int = 1
    fabric: str = ""  # --fabric: a ceilings row by name, overriding the choice

    def as_dict(self) -> dict[str, Any]:
        """As JSON holds it (lists for the tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}


@dataclasses.dataclass(frozen=True)
class Choice:
    ceiling: Ceiling | None
    why: str
    measured: bool = False  # the raw TCP matrix, not a published row


def choose(  # noqa: PLR0911 - one answer per rule, in order
    context: FabricContext, nodes: int, *, tcp_measured: bool
) -> Choice:
    """The ceiling that applies to a run across `nodes` nodes, and why."""
    rows = ceilings.by_name()
    if context.fabric:
        if context.fabric not in rows:
            raise DsclusterError(
                f"--fabric {context.fabric} is not a known fabric; use one of {', '.join(rows)}"
            )
        row = rows[context.fabric]
        if row is ceilings.TCP:
            return _tcp(tcp_measured, "--fabric tcp")
        return Choice(row, f"--fabric {context.fabric}")
    if nodes <= 1:
        if context.accelerator == "cuda" and len(context.models) == 1:
            nvlink = ceilings.nvlink_for(context.models[0])
            if nvlink is not None:
                return Choice(nvlink, f"one node of {context.models[0]}")
        what = context.models[0] if len(context.models) == 1 else context.accelerator
        return Choice(None, f"one node of {what}: no published ceiling in the table")
    if context.accelerator == "cpu":
        return _tcp(tcp_measured, "CPU ranks")
    types, profiles = context.instance_types, set(context.profiles)
    if len(types) == 1 and types[0] in ceilings.EFA and profiles <= {"efa", ""}:
        return Choice(ceilings.EFA[types[0]], types[0])
    if set(context.profiles) & {"ib", "roce"}:
        return Choice(
            None,
            f"NCCL profile {'/'.join(sorted(context.profiles))}: the link rate is not recorded; "
            "name it with --fabric ib-hdr or ib-ndr",
        )
    return _tcp(tcp_measured, f"NCCL profile {'/'.join(sorted(context.profiles)) or 'unknown'}")


def _tcp(measured: bool, why: str) -> Choice:
    if not measured:
        return Choice(None, f"{why}: no raw TCP figures measured (--tcp-mb 0 or one node)")
    return Choice(ceilings.TCP, f"{why}: raw TCP measured between the nodes", measured=True)


def _fraction(value: float, ceiling: float) -> float | None:
    return value / ceiling if ceiling > 0 else None


def grade(  # noqa: C901, PLR0912 - one grade: the ceiling, the all-reduce, each link
    report: Mapping[str, Any],
    context: FabricContext,
    min_fraction: float = DEFAULT_MIN_FABRIC_FRACTION,
) -> dict[str, Any]:
    """The report's fabric_grade section: the ceiling and why, the all-reduce's best busbw
    and each point-to-point direction as a fraction of it, and the warnings: the all-reduce
    below `min_fraction` of a published ceiling; a node when every direction it is on is
    below it, else each link below it."""
    if not 0 < min_fraction <= 1:
        raise DsclusterError(
            f"--min-fabric-fraction {min_fraction:g} is not a fraction in (0, 1]; use 0.5 for "
            "'warn below half the ceiling'"
        )
    p2p = report.get("p2p") or {}
    hosts: list[str] = list(p2p.get("hosts") or [])
    tcp: list[list[float | None]] = (report.get("tcp") or {}).get("gbps") or []
    tcp_ok = any(v for row in tcp for v in row if v)
    choice = choose(context, max(1, len(hosts)), tcp_measured=tcp_ok)
    out: dict[str, Any] = {
        "context": context.as_dict(),
        "min_fraction": min_fraction,
        "why": choice.why,
        "ceiling": None,
        "allreduce": None,
        "links": [],
        "warnings": [],
    }
    row = choice.ceiling
    if row is None:
        return out
    tcp_dirs = [v for i, r in enumerate(tcp) for j, v in enumerate(r) if i != j and v]
    if choice.measured:
        node_gbps, link_gbps = statistics.median(tcp_dirs), None  # links: their own TCP
    elif row in ceilings.IB.values():
        node_gbps, link_gbps = row.node_gbps * max(1, context.gpus_per_node), row.link_gbps
    else:
        node_gbps, link_gbps = row.node_gbps, row.link_gbps
    out["ceiling"] = {
        "name": row.name,
        "fabric": row.fabric,
        "measured": choice.measured,
        "allreduce_gbps": node_gbps,
        "link_gbps": link_gbps,
        "typical": row.typical,
        "sources": list(row.sources),
    }
    warnings: list[str] = out["warnings"]
    sizes = [r for r in report.get("allreduce") or [] if r.get("busbw_gbps")]
    if sizes:
        best = max(sizes, key=lambda r: r["busbw_gbps"])
        fraction = _fraction(best["busbw_gbps"], node_gbps)
        out["allreduce"] = {
            "bytes": best["bytes"],
            "busbw_gbps": best["busbw_gbps"],
            "ceiling_gbps": node_gbps,
            "fraction": fraction,
        }
        # Against raw TCP the all-reduce is graded but not warned about: CPU ranks' all-reduce
        # is bound by the reduction and the copies on the host's cores as much as by the wire
        # (gloo reached ~20 % of loopback TCP at 32 MiB on a loaded 2-core host, while its
        # point-to-point reached 25-80 %); the links, like against like, carry the warning.
        if fraction is not None and fraction < min_fraction and not choice.measured:
            across = f"{len(hosts)} nodes" if len(hosts) > 1 else "one node"
            warnings.append(
                f"fabric: all-reduce across {across} reaches {best['busbw_gbps']:.3g} GB/s "
                f"busbw ({best['bytes'] / (1 << 20):g} MiB), {fraction:.0%} of the "
                f"{node_gbps:.3g} GB/s ceiling ({_ceiling_label(row, choice)}); below "
                f"--min-fabric-fraction {min_fraction:g}"
            )
    gbps = p2p.get("gbps") or []
    low: list[tuple[int, int]] = []
    for i, r in enumerate(gbps):
        for j, v in enumerate(r):
            if i == j or v is None:
                continue
            ceiling = link_gbps
            if choice.measured:
                ceiling = tcp[i][j] if i < len(tcp) and j < len(tcp[i]) else None
            if not ceiling:
                continue
            fraction = v / ceiling
            out["links"].append(
                {"from": hosts[i], "to": hosts[j], "gbps": v, "ceiling_gbps": ceiling,
                 "fraction": fraction}
            )  # fmt: skip
            if fraction < min_fraction:
                low.append((i, j))
    warnings += _link_warnings(hosts, out["links"], low, min_fraction, _ceiling_label(row, choice))
    return out


def _ceiling_label(row: Ceiling, choice: Choice) -> str:
    return "raw TCP between the nodes" if choice.measured else row.fabric


def _link_warnings(
    hosts: Sequence[str],
    links: Sequence[Mapping[str, Any]],
    low: Sequence[tuple[int, int]],
    min_fraction: float,
    label: str,
) -> list[str]:
    """A node when every direction it is on is low (and not every direction of the run is:
    with two nodes that is the one link); else each low direction; one line when every
    direction of more than two nodes is low (the stack or the hosts, not a link)."""
    graded = {(hosts.index(x["from"]), hosts.index(x["to"])): x for x in links}
    lows = set(low)
    if len(hosts) > 2 and lows and lows == set(graded):
        best = max(graded[d]["fraction"] for d in lows)
        return [
            f"fabric: every point-to-point direction ({len(lows)}) below {min_fraction:g} of "
            f"the ceiling ({label}); best {best:.0%}"
        ]
    nodes = []
    if lows and lows != set(graded):
        for n, host in enumerate(hosts):
            mine = {d for d in graded if n in d}
            if mine and mine <= lows:
                nodes.append(host)
    out = []
    for host in nodes:
        fractions = [graded[d]["fraction"] for d in lows if hosts.index(host) in d]
        out.append(
            f"fabric: node {host}: every link on it below {min_fraction:g} of the ceiling "
            f"({label}); best {max(fractions):.0%}"
        )
    for i, j in sorted(lows):
        if hosts[i] in nodes or hosts[j] in nodes:
            continue
        x = graded[(i, j)]
        out.append(
            f"fabric: link {hosts[i]} -> {hosts[j]}: point-to-point {x['gbps']:.3g} GB/s, "
            f"{x['fraction']:.0%} of the {x['ceiling_gbps']:.3g} GB/s ceiling ({label}); "
            f"below --min-fabric-fraction {min_fraction:g}"
        )
    return out


def context_from_facts(
    facts: Sequence[Any], instance_types: Mapping[str, str], fabric: str = ""
) -> FabricContext:
    """The FabricContext of the launch's nodes (node_facts.NodeFacts) and the inventory's
    dscluster_instance_type per host."""
    kinds = sorted({f.accelerator for f in facts}) or ["cpu"]
    return FabricContext(
        accelerator=kinds[0] if len(kinds) == 1 else "mixed",
        models=tuple(sorted({m for f in facts for m in f.models})),
        profiles=tuple(sorted({str((f.nccl_env or {}).get("profile") or "") for f in facts})),
        instance_types=tuple(sorted({t for t in instance_types.values() if t})),
        gpus_per_node=max((f.accelerator_count for f in facts), default=1) or 1,
        fabric=fabric,
    )

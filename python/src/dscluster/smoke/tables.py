"""The smoke report's tables (per rank, per configuration, per link, bandwidth)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table


def configs_label(report: Mapping[str, Any]) -> str:
    """`ZeRO-2` or `zero1, zero1+cpu, zero3+nvme (skipped)`: what the run covered."""
    configs = report.get("configs") or []
    if len(configs) <= 1:
        return f"ZeRO-{report.get('zero_stage', '?')}"
    return ", ".join(
        c["name"] + (" (skipped)" if c.get("status") == "skipped" else "") for c in configs
    )


def rank_table(report: dict[str, Any]) -> Table:
    """Every rank of every configuration that ran (one block per configuration)."""
    table = Table(
        title=(
            f"smoke {report.get('run_id', '')} ({report.get('launcher', 'deepspeed')}): "
            f"{configs_label(report)}, "
            f"{report.get('world_size', '?')} ranks, backend {report.get('backend', '?')}, "
            f"torch {report.get('torch', '?')}, deepspeed {report.get('deepspeed', '?')}"
        ),
        title_justify="left",
    )
    cols = ("config", "rank", "host", "first loss", "last loss", "step ms", "first step s")
    for col in (*cols, "checksum"):
        table.add_column(col, justify="left" if col in ("config", "host", "checksum") else "right")
    configs = report.get("configs") or [
        {"name": f"zero{report.get('zero_stage', '?')}", "ranks": report.get("ranks", [])}
    ]
    for config in configs:
        if config.get("status") == "skipped":
            continue
        for r in config.get("ranks", []):
            table.add_row(
                config["name"],
                str(r["rank"]),
                r["host"],
                f"{r['first_loss']:.4f}",
                f"{r['last_loss']:.4f}" + ("" if r.get("loss_decreased") else " ✗"),
                f"{1000 * r['mean_step_s']:.1f}",
                "-" if r.get("first_step_s") is None else f"{r['first_step_s']:.1f}",
                r["checksum"][:12],
            )
    return table


def config_table(report: dict[str, Any]) -> Table:
    """One row per configuration: passed, failed or skipped (with why)."""
    table = Table(title="configurations", title_justify="left")
    for col in ("config", "ZeRO", "offload", "status", "time s", "detail"):
        table.add_column(col, justify="right" if col in ("ZeRO", "time s") else "left")
    for c in report.get("configs", []):
        failed = [name for name, ok in (c.get("checks") or {}).items() if not ok]
        table.add_row(
            c["name"],
            str(c["zero_stage"]),
            c["offload"],
            c.get("status", "?"),
            "-" if c.get("wall_s") is None else f"{c['wall_s']:.1f}",
            c.get("skip") or ", ".join(failed),
        )
    return table


def link_table(report: dict[str, Any]) -> Table:
    """The node x node point-to-point matrix (row sends, column receives), in GB/s."""
    p2p = report.get("p2p") or {}
    hosts = p2p.get("hosts", [])
    size = p2p.get("bytes", 0) / (1 << 20)
    rechecked = p2p.get("rechecked") or []
    slow = sum(1 for r in rechecked if r.get("suspect"))
    again = f"; {slow} slow-looking: all measured again, longer" if rechecked else ""
    table = Table(
        title=(
            f"point-to-point GB/s (row -> column, {size:g} MiB, best of {p2p.get('iters', '?')}"
            f" x {p2p.get('passes', 1)} passes{again})"
        ),
        title_justify="left",
    )
    table.add_column("from \\ to", justify="left")
    for host in hosts:
        table.add_column(host, justify="right")
    for i, host in enumerate(hosts):
        row = p2p["gbps"][i]
        table.add_row(host, *("-" if v is None else f"{v:.3f}" for v in row))
    return table


def bandwidth_table(report: dict[str, Any]) -> Table:
    table = Table(title="all-reduce (busbw = algbw*2(n-1)/n)", title_justify="left")
    for col in ("size MiB", "time ms", "algbw GB/s", "busbw GB/s"):
        table.add_column(col, justify="right")
    for row in report.get("allreduce", []):
        table.add_row(
            f"{row['bytes'] / (1 << 20):.0f}",
            f"{1000 * row['time_s']:.2f}",
            f"{row['algbw_gbps']:.3f}",
            f"{row['busbw_gbps']:.3f}",
        )
    return table


def device_table(report: dict[str, Any]) -> Table:
    """Every rank's device figures (matmul TFLOPS, copy GB/s), the slow ones marked ✗."""
    bench = report.get("device_bench") or {}
    slow = {(d["rank"], d["metric"]) for d in bench.get("slow") or []}
    threshold = bench.get("threshold")
    below = f"; ✗ over {threshold:.0%} below the median" if threshold else ""
    table = Table(
        title=f"devices (all ranks at once, {bench.get('seconds', '?')} s a figure, best of "
        f"{bench.get('passes', 1)}{below})",
        title_justify="left",
    )
    for col in ("rank", "host", "local", "device", "matmul TFLOPS", "copy GB/s"):
        table.add_column(col, justify="left" if col in ("host", "device") else "right")

    def cell(d: dict[str, Any], metric: str, digits: str) -> str:
        value = d.get(metric)
        text = "-" if value is None else format(value, digits)
        return text + (" ✗" if (d.get("rank"), metric) in slow else "")

    for d in bench.get("devices") or []:
        table.add_row(
            str(d.get("rank", "?")),
            str(d.get("host", "?")),
            str(d.get("local_rank", "?")),
            f"{d.get('device', '?')} ({d.get('matmul_dtype', '?')})",
            cell(d, "matmul_tflops", ".3f"),
            cell(d, "copy_gbps", ".2f"),
        )
    return table


def fabric_table(report: dict[str, Any]) -> Table:
    """The all-reduce and each point-to-point direction as a share of the fabric's ceiling."""
    graded = report.get("fabric_grade") or {}
    ceiling = graded.get("ceiling") or {}
    name = "raw TCP between the nodes" if ceiling.get("measured") else ceiling.get("fabric", "")
    table = Table(
        title=f"fabric grade against {name} ({graded.get('why', '')}); "
        f"warn below {graded.get('min_fraction', '?'):g}",
        title_justify="left",
    )
    for col in ("what", "GB/s", "ceiling GB/s", "share"):
        table.add_column(col, justify="left" if col == "what" else "right")
    rows = []
    allreduce = graded.get("allreduce")
    if allreduce:
        size = allreduce["bytes"] / (1 << 20)
        rows.append((f"all-reduce busbw ({size:g} MiB)", allreduce["busbw_gbps"], allreduce))
    rows += [(f"{x['from']} -> {x['to']}", x["gbps"], x) for x in graded.get("links") or []]
    for what, value, x in rows:
        fraction = x.get("fraction")
        share = "-" if fraction is None else f"{fraction:.0%}"
        low = fraction is not None and fraction < graded.get("min_fraction", 0)
        table.add_row(
            what, f"{value:.3f}", f"{x['ceiling_gbps']:.3f}", share + (" ✗" if low else "")
        )
    return table

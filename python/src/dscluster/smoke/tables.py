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

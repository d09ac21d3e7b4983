"""The smoke report as a picture: node x node bandwidth heatmap and per-rank step time.

`build_figure` is pure (a report in, a matplotlib Figure out, Agg backend, no pyplot state);
`write_png` renders it and writes the file atomically beside the JSON report.
"""

from __future__ import annotations

import io
import math
import os
import pathlib
import statistics
import tempfile
from collections.abc import Mapping
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

SLOW = "#d62728"  # stragglers
BAR = "#1f77b4"


def _configs_title(report: Mapping[str, Any]) -> str:
    configs = report.get("configs") or []
    ran = [c["name"] for c in configs if c.get("status") != "skipped"]
    skipped = [c["name"] for c in configs if c.get("status") == "skipped"]
    text = ", ".join(ran) or f"zero{report.get('zero_stage', '?')}"
    return text + (f" (skipped: {', '.join(skipped)})" if skipped else "")


def build_figure(report: Mapping[str, Any]) -> Figure:  # noqa: PLR0915 - one figure, drawn panel by panel
    """Left: the point-to-point matrix (row sends to column, GB/s in each cell), straggler
    links outlined and straggler nodes' names in red. Right: each rank's mean step time as a
    bar labelled rank@host, red where its node is a straggler."""
    p2p = report.get("p2p") or {}
    hosts: list[str] = list(p2p.get("hosts", []))
    gbps = p2p.get("gbps") or [[None] * len(hosts) for _ in hosts]
    ranks = sorted(report.get("ranks", []), key=lambda r: r["rank"])
    stragglers = report.get("stragglers", [])
    slow_nodes = {s["nodes"][0] for s in stragglers if s["kind"] == "node"}
    slow_links = {tuple(s["nodes"]) for s in stragglers if s["kind"] == "link"}

    n = max(1, len(hosts))
    fig = Figure(figsize=(6 + 1.1 * n + 0.35 * len(ranks), 2.8 + 0.6 * n), dpi=100)
    FigureCanvasAgg(fig)
    heat, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})

    values = [[math.nan if v is None else float(v) for v in row] for row in gbps] or [[math.nan]]
    image = heat.imshow(values, cmap="viridis", vmin=0)
    fig.colorbar(image, ax=heat, label="GB/s", shrink=0.8)
    heat.set_xticks(range(len(hosts)), labels=hosts, rotation=30, ha="right")
    heat.set_yticks(range(len(hosts)), labels=hosts)
    heat.set_xlabel("to")
    heat.set_ylabel("from")
    size = p2p.get("bytes", 0) / (1 << 20)
    heat.set_title(f"point-to-point bandwidth ({size:g} MiB messages)")
    finite = [v for row in values for v in row if not math.isnan(v)]
    top = max(finite, default=0.0)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            text = "-" if math.isnan(v) else f"{v:.2f}"
            color = "black" if not math.isnan(v) and v > 0.6 * top else "white"
            heat.text(j, i, text, ha="center", va="center", color=color, fontsize=9)
            pair = (hosts[i], hosts[j]) if i < len(hosts) and j < len(hosts) else None
            if pair and (pair in slow_links or pair[::-1] in slow_links):
                heat.add_patch(
                    Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor=SLOW, linewidth=3)
                )
    for label in (*heat.get_xticklabels(), *heat.get_yticklabels()):
        if label.get_text() in slow_nodes:
            label.set_color(SLOW)
            label.set_fontweight("bold")

    labels = [f"{r['rank']}@{r['host']}" for r in ranks]
    times = [1000 * r["mean_step_s"] for r in ranks]
    colors = [SLOW if r["host"] in slow_nodes else BAR for r in ranks]
    bars.bar(range(len(ranks)), times, color=colors)
    bars.set_xticks(range(len(ranks)), labels=labels, rotation=30, ha="right")
    if times:
        factor = float(report.get("straggler_factor", 2.0))
        limit = statistics.median(times) * factor
        bars.axhline(limit, color=SLOW, linestyle="--", linewidth=1)
        bars.annotate(
            f"median x {factor:g}", (0, limit), xytext=(2, 2), textcoords="offset points",
            color=SLOW, fontsize=8, xycoords=("axes fraction", "data"),
        )  # fmt: skip
    bars.set_ylabel("mean step time (ms)")
    first = (report.get("configs") or [{}])[0].get("name", "")
    bars.set_title(f"per-rank step time {first}".strip())
    for label in bars.get_xticklabels():
        if label.get_text().split("@", 1)[-1] in slow_nodes:
            label.set_color(SLOW)

    title = (
        f"smoke {report.get('run_id', '')}: {_configs_title(report)}, "
        f"world size {report.get('world_size', '?')}"
    )
    if stragglers:
        names = sorted({name for s in stragglers for name in s["nodes"]})
        title += f"\nstragglers: {', '.join(names)}"
    fig.suptitle(title, color=SLOW if stragglers else "black")
    fig.tight_layout()
    return fig


def render_png(report: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    build_figure(report).savefig(buf, format="png")
    return buf.getvalue()


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Readers see the old file or the whole new one (util.atomic_write, for bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def write_png(report: Mapping[str, Any], *paths: pathlib.Path) -> None:
    """Render once, write to every path (the run's PNG and smoke-latest.png)."""
    data = render_png(report)
    for path in paths:
        write_atomic(path, data)

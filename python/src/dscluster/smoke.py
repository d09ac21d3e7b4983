"""`dscluster smoke`: a real DeepSpeed job across every slot, checked and reported.

The job goes through `dscluster launch`'s path (launch.py, playbooks/smoke.yml = launch.yml)
with any of its launchers: deepspeed (pdsh), torchrun (c10d) or mpi (mpirun). One launch runs
the whole matrix of ZeRO stages x offload (jobs/smoke_job.py) and a pairwise bandwidth pass;
the straggler maths here is pure and runs on the controller over the job's report.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any

from rich.console import Console
from rich.table import Table

from . import storage
from .dsconfig import OFFLOADS, ZERO_STAGES
from .errors import DsclusterError
from .hostfile import write_launch_files
from .inventory import DEFAULT_MASTER_PORT, Inventory
from .launch import (
    LAUNCH_TIME,
    lost_nodes,
    new_run_id,
    plan_for,
    run_job,
)
from .util import atomic_write, print_warnings

__all__ = [
    "Straggler",
    "bandwidth_table",
    "config_table",
    "find_stragglers",
    "link_bandwidths",
    "link_table",
    "lost_nodes",
    "rank_table",
    "run_smoke",
]

DEFAULT_STRAGGLER_FACTOR = 2.0


def job_source() -> pathlib.Path:
    return pathlib.Path(str(resources.files("dscluster.jobs") / "smoke_job.py"))


# --- stragglers (pure) ----------------------------------------------------------------------


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


# --- the run --------------------------------------------------------------------------------


def run_smoke(  # noqa: C901, PLR0912, PLR0913, PLR0915 - the smoke command's options and its one staged flow
    inv: Inventory,
    *,
    zero: int | Sequence[int] = 2,
    offload: str = "none",
    steps: int = 30,
    timeout: int = 600,
    dist_timeout: int = 120,
    launcher: str = "deepspeed",
    master_port: int = DEFAULT_MASTER_PORT,
    straggler_factor: float = DEFAULT_STRAGGLER_FACTOR,
    p2p_mb: float = 8.0,
    console: Console | None = None,
    preflight: Callable[[], None] | None = None,
    ds_config: pathlib.Path | None = None,
) -> tuple[dict[str, Any], pathlib.Path]:
    """Stage the job on the head, launch it across every slot with `launcher`, fetch the
    report, find stragglers, write the JSON and PNG reports. Returns (report, JSON path);
    raises DsclusterError when the job failed.

    With `ds_config` (a file from `dscluster dsconfig`) the job runs that one configuration
    instead of the ZeRO matrix, and also saves a checkpoint in dscluster_checkpoint_dir with
    the file's checkpoint settings, loads it back and compares the weights."""
    console = console or Console(stderr=True)
    staged: dict[str, pathlib.Path] = {"smoke_job.py": job_source()}
    if ds_config is not None:
        staged["ds_config.json"] = _checked_ds_config(ds_config)
    paths = storage.inventory_paths(inv)
    stages = (zero,) if isinstance(zero, int) else tuple(zero)
    if not stages or any(s not in (0, *ZERO_STAGES) for s in stages):
        raise DsclusterError(f"--zero {stages} is not a list of ZeRO stages; use 1, 2 or 3")
    if offload not in OFFLOADS:
        raise DsclusterError(f"--offload {offload} is unknown; use cpu or nvme")
    if straggler_factor < 1:
        raise DsclusterError(
            f"--straggler-factor {straggler_factor:g} is below 1; use 2 for 'twice as slow'"
        )
    files = write_launch_files(inv)
    print_warnings(console, files.warnings)
    if preflight is not None:
        preflight()  # doctor, against the hostfile just written
    run_id = new_run_id("smoke")
    zero_arg = ",".join(str(s) for s in stages)
    program = ["smoke_job.py", "--zero", zero_arg, "--steps", str(steps)]
    program += ["--report", "report.json", "--dist-timeout", str(dist_timeout)]
    program += ["--launch-time", LAUNCH_TIME, "--p2p-mb", f"{p2p_mb:g}"]
    # NVMe offload swaps to node-local scratch, one directory per run (the job removes it).
    nvme_dir = f"{paths.scratch_dir}/smoke-nvme/{run_id}"
    if ds_config is not None:
        program += ["--ds-config", "ds_config.json", "--nvme-dir", nvme_dir]
        program += ["--checkpoint-dir", f"{paths.checkpoint_dir}/{run_id}"]
    elif offload != "none":
        program += ["--offload", offload, "--nvme-dir", nvme_dir]
    plan = plan_for(
        inv, files, launcher=launcher, run_id=run_id, program=program, master_port=master_port
    )
    what = (
        f"config {ds_config}"
        if ds_config is not None
        else f"ZeRO-{zero_arg}{'' if offload == 'none' else ' offload ' + offload}"
    )
    console.print(
        f"smoke: {len(files.facts)} nodes, {files.world_size} ranks, {what}, "
        f"launcher {launcher}, head {inv.head}, run {run_id}",
        markup=False,
        highlight=False,
    )
    result = run_job(
        inv,
        plan,
        stage_files=staged,
        fetch=["report.json"],
        timeout=timeout,
        console=console,
        playbook="smoke.yml",
    )
    report: dict[str, Any]
    if "report.json" in result.fetched:
        report = json.loads(result.fetched["report.json"])
    else:
        report = {"ok": False, "checks": {"report_written": False}, "ranks": []}
    if report.get("world_size") not in (None, files.world_size):
        report["ok"] = False  # fewer ranks joined than the hostfile has slots
    report["run_id"] = run_id
    report["launcher"] = launcher
    report["hostfile"] = files.hostfile.read_text().splitlines()
    report["expected_world_size"] = files.world_size
    report["launcher_rc"] = result.rc
    report["launcher_log"] = str(result.log_path)
    report["straggler_factor"] = straggler_factor
    report["stragglers"] = [s.as_dict() for s in report_stragglers(report, straggler_factor)]
    if result.log_lines:
        report["launcher_log_tail"] = result.log_lines[-40:]
        report["lost_nodes"] = lost_nodes(result.log_lines, plan.rank_hosts)
    reports = inv.directory / "reports"
    out = reports / f"{run_id}.json"
    if report.get("ranks") or (report.get("p2p") or {}).get("hosts"):
        from .smoke_report import write_png  # noqa: PLC0415 - matplotlib only when drawing

        png = reports / f"{run_id}.png"
        write_png(report, png, reports / "smoke-latest.png")
        report["png"] = str(png)
    atomic_write(out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    atomic_write(reports / "smoke-latest.json", out.read_text())
    if not report.get("ok") or result.rc != 0:
        raise DsclusterError(_failure_line(report, result.playbook.failures, out))
    return report, out


def _checked_ds_config(path: pathlib.Path) -> pathlib.Path:
    """The --ds-config file, read and checked enough to fail here rather than on every rank."""
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise DsclusterError(
            f"--ds-config {path}: {exc.strerror}; write one with 'dscluster dsconfig'"
        ) from exc
    except json.JSONDecodeError as exc:
        raise DsclusterError(
            f"--ds-config {path} is not JSON ({exc}); write one with 'dscluster dsconfig'"
        ) from exc
    if not isinstance(config, dict) or not isinstance(config.get("zero_optimization", {}), dict):
        raise DsclusterError(
            f"--ds-config {path} is not a DeepSpeed config; write one with 'dscluster dsconfig'"
        )
    return path


def _rank_list(ranks: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{r['rank']}@{r['host']}" for r in ranks)


def _failure_line(
    report: dict[str, Any], failures: list[tuple[str, str, str]], out: pathlib.Path
) -> str:
    failed_configs = [c for c in report.get("configs", []) if c.get("status") == "failed"]
    if failed_configs:
        parts = []
        for config in failed_configs:
            failed = [name for name, ok in config.get("checks", {}).items() if not ok]
            bad = [r for r in config.get("ranks", []) if not r.get("loss_decreased")]
            where = f" (ranks {_rank_list(bad)})" if bad else ""
            parts.append(f"{config['name']}: {', '.join(failed)}{where}")
        return f"smoke job ran but failed {'; '.join(parts)}; report: {out}"
    checks = report.get("checks", {})
    failed = [name for name, ok in checks.items() if not ok]
    ranks = report.get("ranks", [])
    if failed and ranks:
        bad = [r for r in ranks if not r.get("loss_decreased")]
        where = f" (ranks {_rank_list(bad)})" if bad else ""
        return f"smoke job ran but failed {', '.join(failed)}{where}; report: {out}"
    lost = report.get("lost_nodes") or {}
    if lost:
        who = "; ".join(f"{host}: {why}" for host, why in lost.items())
        return f"smoke job failed, lost node(s) {', '.join(lost)} ({who}); report: {out}"
    tail = " ".join(report.get("launcher_log_tail", [])[-3:])[-300:]
    if failures:
        host, task, msg = failures[0]
        return f"smoke job failed: {task} on {host}: {msg[:200]} {tail}; report: {out}"
    return f"smoke job failed: {tail or 'no report written'}; report: {out}"


# --- tables ---------------------------------------------------------------------------------


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
    table = Table(
        title=f"point-to-point GB/s (row -> column, {size:g} MiB, best of {p2p.get('iters', '?')})",
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

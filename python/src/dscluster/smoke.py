"""`dscluster smoke`: a real DeepSpeed job across every slot, checked and reported.

The job goes through `dscluster launch`'s path (launch.py, playbooks/smoke.yml = launch.yml)
with any of its launchers: deepspeed (pdsh), torchrun (c10d) or mpi (mpirun).
"""

from __future__ import annotations

import json
import pathlib
from importlib import resources
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import DsclusterError
from .hostfile import write_launch_files
from .inventory import Inventory
from .launch import (
    DEFAULT_MASTER_PORT,
    LAUNCH_TIME,
    add_launcher_option,
    lost_nodes,
    new_run_id,
    plan_for,
    run_job,
)
from .util import atomic_write, print_warnings

__all__ = ["add_smoke_options", "bandwidth_table", "lost_nodes", "rank_table", "run_smoke"]


def job_source() -> pathlib.Path:
    return pathlib.Path(str(resources.files("dscluster.jobs") / "smoke_job.py"))


def add_smoke_options(parser) -> None:
    """The options `dscluster smoke` takes beyond those cli.py gives it (--launcher)."""
    add_launcher_option(parser)
    parser.add_argument(
        "--master-port", type=int, default=DEFAULT_MASTER_PORT, help="rendezvous port on the head"
    )


def run_smoke(
    inv: Inventory,
    *,
    zero: int = 2,
    steps: int = 30,
    timeout: int = 600,
    dist_timeout: int = 120,
    launcher: str = "deepspeed",
    master_port: int = DEFAULT_MASTER_PORT,
    console: Console | None = None,
) -> tuple[dict[str, Any], pathlib.Path]:
    """Stage the job on the head, launch it across every slot with `launcher`, fetch the
    report. Returns (report, report path); raises DsclusterError when the job failed."""
    console = console or Console(stderr=True)
    if zero not in (0, 1, 2, 3):
        raise DsclusterError(f"--zero {zero} is not a ZeRO stage; use 1, 2 or 3")
    files = write_launch_files(inv)
    print_warnings(console, files.warnings)
    run_id = new_run_id("smoke")
    program = ["smoke_job.py", "--zero", str(zero), "--steps", str(steps)]
    program += ["--report", "report.json", "--dist-timeout", str(dist_timeout)]
    program += ["--launch-time", LAUNCH_TIME]
    plan = plan_for(
        inv, files, launcher=launcher, run_id=run_id, program=program, master_port=master_port
    )
    console.print(
        f"smoke: {len(files.facts)} nodes, {files.world_size} ranks, ZeRO-{zero}, "
        f"launcher {launcher}, head {inv.head}, run {run_id}"
    )
    result = run_job(
        inv,
        plan,
        stage_files={"smoke_job.py": job_source()},
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
    if result.log_lines:
        report["launcher_log_tail"] = result.log_lines[-40:]
        report["lost_nodes"] = lost_nodes(result.log_lines, plan.rank_hosts)
    out = inv.directory / "reports" / f"{run_id}.json"
    atomic_write(out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    atomic_write(inv.directory / "reports" / "smoke-latest.json", out.read_text())
    if not report.get("ok") or result.rc != 0:
        raise DsclusterError(_failure_line(report, result.playbook.failures, out))
    return report, out


def _failure_line(
    report: dict[str, Any], failures: list[tuple[str, str, str]], out: pathlib.Path
) -> str:
    checks = report.get("checks", {})
    failed = [name for name, ok in checks.items() if not ok]
    ranks = report.get("ranks", [])
    if failed and ranks:
        bad = [r for r in ranks if not r.get("loss_decreased")]
        where = (
            f" (ranks {', '.join(str(r['rank']) + '@' + r['host'] for r in bad)})" if bad else ""
        )
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


def rank_table(report: dict[str, Any]) -> Table:
    table = Table(
        title=(
            f"smoke {report.get('run_id', '')} ({report.get('launcher', 'deepspeed')}): "
            f"ZeRO-{report.get('zero_stage', '?')}, "
            f"{report.get('world_size', '?')} ranks, backend {report.get('backend', '?')}, "
            f"torch {report.get('torch', '?')}, deepspeed {report.get('deepspeed', '?')}"
        ),
        title_justify="left",
    )
    for col in ("rank", "host", "first loss", "last loss", "step ms", "first step s", "checksum"):
        table.add_column(col, justify="left" if col in ("host", "checksum") else "right")
    for r in report.get("ranks", []):
        table.add_row(
            str(r["rank"]),
            r["host"],
            f"{r['first_loss']:.4f}",
            f"{r['last_loss']:.4f}" + ("" if r.get("loss_decreased") else " ✗"),
            f"{1000 * r['mean_step_s']:.1f}",
            "-" if r.get("first_step_s") is None else f"{r['first_step_s']:.1f}",
            r["checksum"][:12],
        )
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

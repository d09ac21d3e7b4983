"""`dscluster smoke`: a real DeepSpeed job across every slot, checked and reported."""

from __future__ import annotations

import datetime as dt
import json
import pathlib
import re
import shutil
import tempfile
from importlib import resources
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import DsclusterError
from .hostfile import write_launch_files
from .inventory import Inventory
from .runner import run_playbook
from .util import atomic_write, cache_dir

# pdsh reports a node it could not reach or whose remote command died:
#   "pdsh@head: node3: ssh exited with exit code 255"
PDSH_EXIT_RE = re.compile(r"^pdsh@\S+: (?P<host>[^:\s]+): ssh exited with exit code (?P<code>\d+)")
# ... and prefixes every remote line with "node: "; DeepSpeed's per-node launcher says
#   "node2: [...] [ERROR] [launch.py:...] ... exits with return code = -9"
RANK_EXIT_RE = re.compile(r"^(?P<host>[^:\s]+): .*exits with return code = (?P<code>-?\d+)")
SSH_ERROR_RE = re.compile(r"^(?P<host>[^:\s]+): ssh: (?P<msg>.+)$")


def lost_nodes(log_lines: list[str]) -> dict[str, str]:
    """Nodes the launcher log shows lost, with why, in the order the log shows them.

    Nodes pdsh could not reach (ssh failures, pdsh's exit 255) are the cause when present;
    ranks elsewhere that then fail at rendezvous or in a collective are not blamed. Otherwise
    the nodes whose ranks exited non-zero, the first one first.
    """
    unreachable: dict[str, str] = {}
    ranks: dict[str, str] = {}
    for line in log_lines:
        if m := SSH_ERROR_RE.match(line):
            unreachable[m["host"]] = f"ssh: {m['msg']}"
        elif (m := PDSH_EXIT_RE.match(line)) and m["code"] == "255":
            unreachable.setdefault(m["host"], "ssh exited with code 255")
        elif m := RANK_EXIT_RE.match(line):
            ranks.setdefault(m["host"], f"a rank exited with code {m['code']}")
        elif m := PDSH_EXIT_RE.match(line):
            ranks.setdefault(m["host"], f"remote command exited with code {m['code']}")
    return unreachable or ranks


def job_source() -> pathlib.Path:
    return pathlib.Path(str(resources.files("dscluster.jobs") / "smoke_job.py"))


def run_smoke(
    inv: Inventory,
    *,
    zero: int = 2,
    steps: int = 30,
    timeout: int = 600,
    dist_timeout: int = 120,
    console: Console | None = None,
) -> tuple[dict[str, Any], pathlib.Path]:
    """Stage the job on the head, launch it with the deepspeed launcher (pdsh), fetch the
    report. Returns (report, report path); raises DsclusterError when the job failed."""
    console = console or Console(stderr=True)
    if zero not in (0, 1, 2, 3):
        raise DsclusterError(f"--zero {zero} is not a ZeRO stage; use 1, 2 or 3")
    files = write_launch_files(inv)
    for warning in files.warnings:
        console.print(f"warning: {warning}", markup=False, highlight=False)
    run_id = dt.datetime.now(dt.UTC).strftime("smoke-%Y%m%dT%H%M%S")
    stage = pathlib.Path(tempfile.mkdtemp(prefix="smoke-", dir=cache_dir()))
    try:
        shutil.copy(job_source(), stage / "smoke_job.py")
        shutil.copy(files.hostfile, stage / "hostfile")
        shutil.copy(files.env_file, stage / ".deepspeed_env")
        fetch = stage / "fetched"
        fetch.mkdir()
        console.print(
            f"smoke: {len(files.facts)} nodes, {files.world_size} ranks, ZeRO-{zero}, "
            f"head {inv.head}, run {run_id}"
        )
        result = run_playbook(
            "smoke.yml",
            inv,
            extravars={
                "smoke_stage_dir": str(stage),
                "smoke_fetch_dir": str(fetch),
                "smoke_run_id": run_id,
                "smoke_venv": files.facts[0].venv,  # the head's, as recorded
                "smoke_zero": zero,
                "smoke_steps": steps,
                "smoke_timeout": timeout,
                "smoke_dist_timeout": dist_timeout,
            },
            timeout=timeout + 180,
            console=console,
        )
        report_file = fetch / "report.json"
        log_file = fetch / "launcher.log"
        report: dict[str, Any]
        if report_file.is_file():
            report = json.loads(report_file.read_text())
        else:
            report = {"ok": False, "checks": {"report_written": False}, "ranks": []}
        if report.get("world_size") not in (None, files.world_size):
            report["ok"] = False  # fewer ranks joined than the hostfile has slots
        report["run_id"] = run_id
        report["hostfile"] = files.hostfile.read_text().splitlines()
        report["expected_world_size"] = files.world_size
        report["launcher_rc"] = result.rc
        if log_file.is_file():
            log_lines = log_file.read_text().splitlines()
            report["launcher_log_tail"] = log_lines[-40:]
            report["lost_nodes"] = lost_nodes(log_lines)
        out = inv.directory / "reports" / f"{run_id}.json"
        atomic_write(out, json.dumps(report, indent=2, sort_keys=True) + "\n")
        atomic_write(inv.directory / "reports" / "smoke-latest.json", out.read_text())
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if not report.get("ok") or result.rc != 0:
        raise DsclusterError(_failure_line(report, result.failures, out))
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
            f"smoke {report.get('run_id', '')}: ZeRO-{report.get('zero_stage', '?')}, "
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

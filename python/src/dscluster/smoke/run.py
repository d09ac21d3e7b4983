"""`run_smoke`: stage the job on the head, launch it across every slot, fetch and check the
report, write the JSON and PNG reports.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from rich.console import Console

from .. import storage
from ..dsconfig import OFFLOADS, ZERO_STAGES, auto_keys
from ..errors import DsclusterError
from ..inventory import DEFAULT_MASTER_PORT, Inventory
from ..jobs import SMOKE_JOB_FILES, smoke_device
from ..launch import LAUNCH_TIME, LaunchRequest, lost_nodes, new_run_id, plan_for, run_job
from ..launch.run import Preflight, left_out_of, run_preflight
from ..launch_files import render_launch_files
from ..util import atomic_write, print_warnings
from ..validate import read_text
from . import ceilings
from .devices import DEFAULT_DEVICE_THRESHOLD, report_slow_devices
from .fabric import DEFAULT_MIN_FABRIC_FRACTION, choose, context_from_facts, grade
from .stragglers import DEFAULT_STRAGGLER_FACTOR, report_stragglers

DEFAULT_DEVICE_BENCH_S = smoke_device.DEFAULT_SECONDS


def job_sources() -> dict[str, pathlib.Path]:
    """The smoke job's files, name in the job directory -> this package's copy: the entry
    script and the modules it imports from beside it (jobs.SMOKE_JOB_FILES)."""
    jobs = resources.files("dscluster.jobs")
    return {name: pathlib.Path(str(jobs / name)) for name in SMOKE_JOB_FILES}


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
    preflight: Preflight | None = None,
    ds_config: pathlib.Path | None = None,
    device_bench_s: float = DEFAULT_DEVICE_BENCH_S,
    device_threshold: float = DEFAULT_DEVICE_THRESHOLD,
    min_fabric_fraction: float = DEFAULT_MIN_FABRIC_FRACTION,
    fabric: str = "",
) -> tuple[dict[str, Any], pathlib.Path]:
    """Stage the job on the head, launch it across every slot with `launcher`, fetch the
    report, find stragglers, write the JSON and PNG reports. Returns (report, JSON path);
    raises DsclusterError when the job failed.

    With `ds_config` (a file from `dscluster dsconfig`) the job runs that one configuration
    instead of the ZeRO matrix, and also saves a checkpoint in dscluster_checkpoint_dir with
    the file's checkpoint settings, loads it back and compares the weights.

    The nodes `preflight` leaves out (--exclude-unhealthy) are left out of this run: its own
    hostfile, never the inventory's (launch.plan_for); the report's `excluded` names them,
    with the checks they failed and why.

    Before the training every rank times a matmul and a copy at once (`device_bench_s`
    seconds each, 0 skips): a device more than `device_threshold` below its peers' median
    (and outside their spread) is named. The all-reduce and point-to-point figures are graded
    against the fabric's ceiling (smoke/fabric.py; `fabric` names a row of smoke/ceilings.py
    instead of the one the facts choose); below `min_fabric_fraction` is a warning."""
    console = console or Console(stderr=True)
    staged = job_sources()
    if ds_config is not None:
        staged["ds_config.json"] = checked_ds_config(ds_config)
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
    if fabric and fabric not in ceilings.by_name():
        raise DsclusterError(
            f"--fabric {fabric} is not a known fabric; use one of {', '.join(ceilings.by_name())}"
        )
    if not 0 < device_threshold < 1 or not 0 < min_fabric_fraction <= 1:
        raise DsclusterError(
            f"--device-bench-threshold {device_threshold:g} must lie in (0, 1) and "
            f"--min-fabric-fraction {min_fabric_fraction:g} in (0, 1]"
        )
    files = render_launch_files(inv)
    types = {f.host: inv.var(f.host, "dscluster_instance_type", "") for f in files.facts}
    context = context_from_facts(
        files.facts, {h: t for h, t in types.items() if isinstance(t, str)}, fabric
    )
    # Raw TCP only where it is the ceiling (a published row needs no measurement).
    tcp_needed = choose(context, len(files.facts), tcp_measured=True).measured
    run_id = new_run_id("smoke")
    zero_arg = ",".join(str(s) for s in stages)
    program = ["smoke_job.py", "--zero", zero_arg, "--steps", str(steps)]
    program += ["--report", "report.json", "--dist-timeout", str(dist_timeout)]
    program += ["--launch-time", LAUNCH_TIME, "--p2p-mb", f"{p2p_mb:g}"]
    program += ["--straggler-factor", f"{straggler_factor:g}"]
    program += ["--device-bench-s", f"{device_bench_s:g}"]
    if not tcp_needed:
        program += ["--tcp-mb", "0"]
    # NVMe offload swaps to node-local scratch, one directory per run (the job removes it).
    nvme_dir = f"{paths.scratch_dir}/smoke-nvme/{run_id}"
    if ds_config is not None:
        program += ["--ds-config", "ds_config.json", "--nvme-dir", nvme_dir]
        program += ["--checkpoint-dir", f"{paths.checkpoint_dir}/{run_id}"]
    elif offload != "none":
        program += ["--offload", offload, "--nvme-dir", nvme_dir]
    request = LaunchRequest(launcher=launcher, program=program, master_port=master_port)
    plan = plan_for(inv, files, request, run_id)
    # Every check passed: now the launch files, then doctor against them.
    files.write()
    print_warnings(console, files.warnings)
    excluded = run_preflight(preflight)
    if excluded:
        plan = plan_for(inv, files, request, run_id, left_out=left_out_of(excluded))
    what = (
        f"config {ds_config}"
        if ds_config is not None
        else f"ZeRO-{zero_arg}{'' if offload == 'none' else ' offload ' + offload}"
    )
    console.print(
        f"smoke: {len(plan.resources)} nodes, {plan.world_size} ranks, {what}, "
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
    report = job_report(result.fetched.get("report.json"))
    if report.get("world_size") not in (None, plan.world_size):
        report["ok"] = False  # fewer ranks joined than the hostfile has slots
    report["run_id"] = run_id
    report["launcher"] = launcher
    report["hostfile"] = plan.files["hostfile"][0].splitlines()  # the run's own
    report["excluded"] = [
        {"host": e.host, "checks": list(e.checks), "why": e.why} for e in excluded
    ]
    report["expected_world_size"] = plan.world_size
    report["launcher_rc"] = result.rc
    # The pass needs root's exit record as well as the job's word (SECURITY.md).
    report["sources"] = {
        "launcher_rc": "root's record of the job's exit status on the head",
        "report.json": "the job's own report, written as the training user",
    }
    report["launcher_log"] = str(result.log_path)
    report["straggler_factor"] = straggler_factor
    report["stragglers"] = [s.as_dict() for s in report_stragglers(report, straggler_factor)]
    if report.get("device_bench"):
        report["device_bench"]["threshold"] = device_threshold
        slow = report_slow_devices(report, device_threshold)
        report["device_bench"]["slow"] = [d.as_dict() for d in slow]
    if report.get("allreduce") or (report.get("p2p") or {}).get("gbps"):
        report["fabric_grade"] = grade(report, context, min_fabric_fraction)
    if result.log_lines:
        report["launcher_log_tail"] = result.log_lines[-40:]
        report["lost_nodes"] = lost_nodes(result.log_lines, plan.rank_hosts)
    if result.failure is not None:
        report["failure"] = dataclasses.asdict(result.failure)
    if result.signatures:
        report["signatures"] = [m.as_dict() for m in result.signatures]
    reports = inv.directory / "reports"
    out = reports / f"{run_id}.json"
    if report.get("ranks") or (report.get("p2p") or {}).get("hosts"):
        from .figure import write_png  # noqa: PLC0415 - matplotlib only when drawing

        png = reports / f"{run_id}.png"
        write_png(report, png, reports / "smoke-latest.png")
        report["png"] = str(png)
    atomic_write(out, json.dumps(report, indent=2, sort_keys=True) + "\n")
    atomic_write(reports / "smoke-latest.json", out.read_text())
    if report.get("ok") and result.rc != 0:
        # the job's word against root's record: the record decides, and the line says so
        raise DsclusterError(
            f"smoke job exited {result.rc} (root's record on the head) though its own report "
            f"says ok: {_log_tail(report) or 'no launcher output'}; report: {out}"
        )
    if not report.get("ok") or result.rc != 0:
        raise DsclusterError(_failure_line(report, result.playbook.failures, out))
    return report, out


# The sections of the job's report the controller reads, and their JSON types: the report is
# the training user's words (any job can rewrite it), so a section of another shape is not
# read at all and the run does not pass.
REPORT_SHAPES: dict[str, type] = {
    "ok": bool,
    "checks": dict,
    "ranks": list,
    "configs": list,
    "world_size": int,
    "device_bench": dict,
    "allreduce": list,
    "p2p": dict,
    "tcp": dict,
}


def job_report(text: str | None) -> dict[str, Any]:
    """The job's report.json as a dict the controller can read: none written, not JSON, not an
    object or a section of another shape gives a failing report that says which."""
    if text is None:
        return {"ok": False, "checks": {"report_written": False}, "ranks": []}
    try:
        report = json.loads(text)
    except ValueError:
        report = None
    if not isinstance(report, dict):
        return {"ok": False, "checks": {"report_readable": False}, "ranks": []}
    bad = [k for k, shape in REPORT_SHAPES.items() if k in report and not _shaped(report[k], shape)]
    if bad:
        return {"ok": False, "checks": {f"report_{k}_readable": False for k in bad}, "ranks": []}
    return report


def _shaped(value: object, shape: type) -> bool:
    # bool is an int to isinstance: a world size of true is no world size
    if not isinstance(value, shape) or (shape is int and isinstance(value, bool)):
        return False
    # the per-rank and per-config entries are read by name
    return not isinstance(value, list) or all(isinstance(item, dict) for item in value)


def checked_ds_config(path: pathlib.Path) -> pathlib.Path:
    """The --ds-config file, read and checked enough to fail here rather than on every rank."""
    text = read_text(path, "--ds-config")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DsclusterError(
            f"--ds-config {path} is not JSON ({exc.msg} at line {exc.lineno} column "
            f"{exc.colno}); fix it, or write one with 'dscluster dsconfig'"
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("zero_optimization", {}), dict):
        raise DsclusterError(
            f"--ds-config {path} is not a DeepSpeed config; write one with 'dscluster dsconfig'"
        )
    auto = auto_keys(config)
    if auto:
        more = f" and {len(auto) - 3} more" if len(auto) > 3 else ""
        raise DsclusterError(
            f'--ds-config {path} has "auto" values ({", ".join(auto[:3])}{more}), which the HF '
            "Trainer fills and the smoke job does not; write one with 'dscluster dsconfig' "
            "without --hf"
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
    fix = _fix(report.get("signatures") or [])
    failure = report.get("failure")  # ranks failed, every node reachable
    if failure and failure.get("error_lines"):
        ranks = ",".join(map(str, failure["ranks"]))
        error = failure["error_lines"][-1].strip()
        return (
            f"smoke job failed on rank{'s' if len(failure['ranks']) > 1 else ''} {ranks} "
            f"({', '.join(failure['hosts'])}); first error {failure['error_from']}: "
            f"{error}{fix}; report: {out}"
        )
    lost = report.get("lost_nodes") or {}
    if lost:
        who = "; ".join(f"{host}: {why}" for host, why in lost.items())
        return f"smoke job failed, lost node(s) {', '.join(lost)} ({who}){fix}; report: {out}"
    tail = _log_tail(report)
    unread = [name for name in failed if name.startswith("report_") and name != "report_written"]
    if failures and not unread:
        host, task, msg = failures[0]
        return f"smoke job failed: {task} on {host}: {msg[:200]} {tail}{fix}; report: {out}"
    what = f"its report.json is unreadable ({', '.join(unread)})" if unread else ""
    return f"smoke job failed: {what or tail or 'no report written'}{fix}; report: {out}"


def _log_tail(report: dict[str, Any]) -> str:
    """The launcher log's last three lines, as a failure line quotes them."""
    return " ".join(report.get("launcher_log_tail", [])[-3:])[-300:]


def _fix(signatures: Sequence[Mapping[str, Any]]) -> str:
    """The first known failure signature's fix, for the failure line."""
    if not signatures:
        return ""
    first = signatures[0]
    return f"; fix ({first['name']} on {first['where']}): {first['help']}"

"""The smoke job's report: the JSON rank 0 writes (after every configuration, so a later crash
keeps the earlier results), what each configuration adds to it and the verdict at the end.

Staged beside smoke_job.py and imported there as a top-level module; stdlib only.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # dscluster.jobs.smoke_report: imported by dscluster's tests
    from . import smoke_checks
else:  # on the nodes: a file of the job directory (sys.path[0]), no dscluster there
    import smoke_checks


def new_report(
    args, torch, deepspeed, accel, *, installed_ops: dict, p2p: dict, aio: dict | None
) -> dict[str, Any]:
    """The report before any configuration ran: the run's settings and versions, and the
    first bandwidth pass (`p2p`: hosts, ranks, bytes, iters, passes, gbps)."""
    dist = torch.distributed
    report: dict[str, Any] = {
        "ok": False,
        "checks": {},
        "world_size": dist.get_world_size(),
        "zero_stage": args.zero[0],
        "zero_stages": args.zero,
        "offload": args.offload,
        "backend": dist.get_backend(),
        "accelerator": accel.device_name(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "installed_ops": sorted(k for k, v in installed_ops.items() if v),
        "steps": args.steps,
        "ranks": [],
        "configs": [],
        "p2p": p2p,
    }
    if aio is not None:
        report["aio"] = aio
    return report


def add_skipped(report: dict, entry: dict) -> None:
    """A configuration DeepSpeed cannot run here (its `skip` says why)."""
    result = dict(entry)
    result["status"] = "skipped"
    report["configs"].append(result)


def add_config(
    report: dict, entry: dict, gathered: list[dict | None], *, args, started: float
) -> dict:
    """One configuration's result, from every rank's summary (`gathered`, run_config's), into
    the report: its checks (smoke_checks.config_checks), each folded into the report's own;
    the first configuration's ranks are the report's per-rank table. `started`: the
    perf_counter when the configuration began. Returns the result."""
    world = report["world_size"]
    result = dict(entry)
    ranks = sorted((r for r in gathered if r), key=lambda r: r["rank"])
    for r in ranks:
        at = r.pop("_first_step_at")
        r["first_step_s"] = (at - args.launch_time) if args.launch_time and at else None
    checks = smoke_checks.config_checks(ranks, world, checkpoint=bool(args.checkpoint_dir))
    result.pop("config", None)
    result.update(
        status="passed" if all(checks.values()) else "failed",
        ok=all(checks.values()),
        checks=checks,
        ranks=ranks,
        wall_s=time.perf_counter() - started,
    )
    report["configs"].append(result)
    for name, passed in checks.items():
        report["checks"][name] = report["checks"].get(name, True) and passed
    if not report["ranks"]:
        report["ranks"] = ranks  # the first configuration's: today's per-rank table
    return result


def finish(report: dict, ok: bool) -> bool:
    """The verdict, once the bandwidth passes are in report["p2p"]: `ok` (every configuration
    that ran passed), every direction between nodes measured, and some configuration ran."""
    matrix = report["p2p"]["gbps"]
    n = len(report["p2p"]["hosts"])
    report["checks"]["bandwidth_pass_complete"] = all(
        matrix[i][j] is not None for i in range(n) for j in range(n) if i != j
    )
    ok = ok and report["checks"]["bandwidth_pass_complete"] and bool(report["ranks"])
    report["ok"] = ok
    return ok


def write_report(path: str, report: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(report, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)

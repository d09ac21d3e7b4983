"""`dscluster smoke`: a DeepSpeed job across every slot, its tables and report."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from .. import validate
from ..errors import DsclusterError
from . import flags


def register(sub) -> None:
    from ..smoke import (  # noqa: PLC0415
        DEFAULT_DEVICE_THRESHOLD,
        DEFAULT_MIN_FABRIC_FRACTION,
        DEFAULT_STRAGGLER_FACTOR,
    )
    from ..smoke.ceilings import by_name  # noqa: PLC0415
    from ..smoke.run import DEFAULT_DEVICE_BENCH_S  # noqa: PLC0415

    smoke = sub.add_parser("smoke", help="run a DeepSpeed job across every slot")
    flags.inventory(smoke)
    flags.zero(
        smoke,
        help="ZeRO stage(s), comma-separated: 2 (default) or 1,2,3 (one launch runs them all)",
    )
    flags.offload(
        smoke,
        default=None,
        help="also run each stage with optimizer (and ZeRO-3 parameter) offload; nvme needs "
        "ZeRO-3 and DeepSpeed's async_io op on every node, else it is reported skipped "
        "(none: no offload, the default)",
    )
    smoke.add_argument(
        "--ds-config",
        type=validate.existing_file_type("--ds-config"),
        default=None,
        help="run this DeepSpeed config (from 'dscluster dsconfig') instead of --zero/--offload, "
        "with a checkpoint save and load in dscluster_checkpoint_dir; the loss must still fall "
        "within --steps (write it with e.g. --lr 3e-3)",
    )
    smoke.add_argument(
        "--steps",
        type=validate.count_type(1, validate.MAX_STEPS, "a step count", 30, flag="--steps"),
        default=30,
        help="training steps per configuration (default 30)",
    )
    flags.timeout(smoke, 600)
    flags.as_json(smoke)
    flags.no_doctor(smoke)
    flags.exclude_unhealthy(smoke)
    smoke.add_argument(
        "--straggler-factor",
        type=validate.real_type(1, 1000, "a slowdown factor", "2", flag="--straggler-factor"),
        default=DEFAULT_STRAGGLER_FACTOR,
        help="flag a link or node slower than the median by this factor (default 2)",
    )
    smoke.add_argument(
        "--fail-on-straggler", action="store_true", help="exit non-zero when a straggler is found"
    )
    smoke.add_argument(
        "--no-device-bench",
        action="store_true",
        help="skip the per-device benchmark (a matmul and a copy timed on every rank at once)",
    )
    smoke.add_argument(
        "--device-bench-s",
        type=validate.real_type(
            0, 60, "seconds", str(DEFAULT_DEVICE_BENCH_S), lo_open=True, flag="--device-bench-s"
        ),
        default=DEFAULT_DEVICE_BENCH_S,
        help=f"timed seconds per device figure (default {DEFAULT_DEVICE_BENCH_S:g})",
    )
    smoke.add_argument(
        "--device-bench-threshold",
        type=validate.real_type(
            0, 0.99, "a fraction", "0.2", lo_open=True, flag="--device-bench-threshold"
        ),
        default=DEFAULT_DEVICE_THRESHOLD,
        help="name a device more than this fraction below its peers' median (and outside "
        f"their spread: 3 x MAD) (default {DEFAULT_DEVICE_THRESHOLD:g})",
    )
    smoke.add_argument(
        "--min-fabric-fraction",
        type=validate.real_type(
            0, 1, "a fraction", "0.5", lo_open=True, flag="--min-fabric-fraction"
        ),
        default=DEFAULT_MIN_FABRIC_FRACTION,
        help="warn when the all-reduce or a link reaches less than this share of the fabric's "
        f"ceiling (default {DEFAULT_MIN_FABRIC_FRACTION:g})",
    )
    smoke.add_argument(
        "--fabric",
        choices=sorted(by_name()),
        default="",
        help="grade against this fabric's published ceiling instead of the one the facts "
        "choose (NVLink by GPU model, EFA by instance type, else raw TCP measured)",
    )
    flags.launcher(
        smoke,
        ("deepspeed", "torchrun", "mpi"),  # the smoke job is a DeepSpeed script
        default="deepspeed",
        help="deepspeed (pdsh), torchrun (c10d, one agent per node over pdsh) or mpi (mpirun)",
    )
    flags.master_port(smoke)
    smoke.set_defaults(func=cmd_smoke, check=check_smoke)


def check_smoke(args: argparse.Namespace) -> None:
    from ..smoke.run import checked_ds_config  # noqa: PLC0415

    flags.check_exclude_unhealthy(args)
    if args.ds_config is not None:
        if args.offload is not None:
            raise DsclusterError(
                f"--offload {args.offload} and --ds-config {args.ds_config} both set the "
                "offload; drop --offload (the config's own offload settings run)"
            )
        checked_ds_config(args.ds_config)


def cmd_smoke(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..inventory import load, master_port  # noqa: PLC0415
    from ..smoke import (  # noqa: PLC0415
        bandwidth_table,
        config_table,
        device_table,
        fabric_table,
        link_table,
        rank_table,
        run_smoke,
    )

    inv = load(args.inventory)
    port = master_port(inv, args.master_port)
    report, path = run_smoke(
        inv,
        zero=args.zero,
        offload=args.offload or "none",
        steps=args.steps,
        timeout=args.timeout,
        launcher=args.launcher,
        master_port=port,
        straggler_factor=args.straggler_factor,
        console=err,
        preflight=flags.preflight(args, inv, master_port=port, console=err, what="smoke"),
        ds_config=args.ds_config,
        device_bench_s=0 if args.no_device_bench else args.device_bench_s,
        device_threshold=args.device_bench_threshold,
        min_fabric_fraction=args.min_fabric_fraction,
        fabric=args.fabric,
    )
    stragglers = report.get("stragglers", [])
    failing = bool(stragglers) and args.fail_on_straggler
    if args.json:
        out.print_json(json.dumps(report))
    else:
        out.print(rank_table(report))
        if len(report.get("configs", [])) > 1:
            out.print(config_table(report))
        if (report.get("p2p") or {}).get("hosts"):
            out.print(link_table(report))
        out.print(bandwidth_table(report))
        if (report.get("device_bench") or {}).get("devices"):
            out.print(device_table(report))
        if (report.get("fabric_grade") or {}).get("ceiling"):
            out.print(fabric_table(report))
    for straggler in stragglers:
        err.print(f"warning: {straggler['message']}", markup=False, highlight=False)
    for slow in (report.get("device_bench") or {}).get("slow") or []:
        err.print(f"warning: {slow['message']}", markup=False, highlight=False)
    for line in (report.get("fabric_grade") or {}).get("warnings") or []:
        err.print(f"warning: {line}", markup=False, highlight=False)
    # stdout stays one JSON document with --json
    (err if args.json else out).print(
        f"smoke report: {path}" + (f" and {report['png']}" if report.get("png") else ""),
        markup=False,
        highlight=False,
    )
    if failing:
        names = sorted({n for s in stragglers for n in s["nodes"]})
        raise DsclusterError(
            f"{len(stragglers)} straggler(s) on {', '.join(names)} (--fail-on-straggler); "
            f"report: {path}"
        )
    if not args.json:
        left = [e["host"] for e in report.get("excluded", [])]
        without = f" without {', '.join(left)} (--exclude-unhealthy)" if left else ""
        out.print(
            f"smoke test passed: {report['world_size']} ranks{without}; report {path}",
            markup=False,
            highlight=False,
        )
    return 0

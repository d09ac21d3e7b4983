"""`dscluster doctor`: every node and every pair of nodes checked before a job (exit 0/1);
`--record DIR` keeps the nodes' health outputs, `--replay DIR` judges such a directory
again without contacting anything."""

from __future__ import annotations

import argparse
import json
import pathlib
import re

from rich.console import Console

from .. import validate
from . import flags

UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}
MAX_BUDGET = 24 * 3600


def budget_type(text: str) -> int:
    """A time budget: 0, 90, 90s, 2m, 1h (seconds when no unit), up to 24h."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([smh]?)\s*", str(text))
    if not m or not m[1].isascii():
        raise argparse.ArgumentTypeError(
            f"--gpu-diag-budget {text!r} is not a duration; give e.g. 2m, 30m, 90s or 0"
        )
    seconds = int(m[1]) * UNITS[m[2]]
    if seconds > MAX_BUDGET:
        raise argparse.ArgumentTypeError(
            f"--gpu-diag-budget {text} is more than 24h; give e.g. 2m (dcgmi diag level 2)"
        )
    return seconds


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check every node and every pair of nodes before a job (exit 0/1)"
    )
    flags.inventory(
        p, required=False, help="inventories/<name> or its hosts.yml (not with --replay)"
    )
    flags.as_json(p)
    flags.master_port(p, what="rendezvous port to probe on the head")
    for flag, default, what in (("--min-shm-gb", 1, "/dev/shm"), ("--min-free-gb", 2, "free disk")):
        p.add_argument(
            flag,
            type=validate.real_type(0, 1 << 20, "GiB", str(default), flag=flag),
            default=float(default),
            help=f"{what} below this fails (default {default})",
        )
    p.add_argument(
        "--gpu-diag-budget",
        type=budget_type,
        default=0,
        metavar="TIME",
        help="run dcgmi diag on nodes with DCGM, at the highest level that fits: under 2m "
        "level 1 (seconds), 2m level 2, 30m level 3, 2h level 4 (default 0: not run)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--record",
        type=pathlib.Path,
        metavar="DIR",
        help="also write every node's health outputs to DIR (new or empty; 0700) for --replay",
    )
    where.add_argument(
        "--replay",
        type=pathlib.Path,
        metavar="DIR",
        help="judge a --record directory again (the health checks), contacting nothing",
    )
    p.set_defaults(func=cmd_doctor, _parser=p)


def cmd_doctor(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..doctor import (  # noqa: PLC0415
        GIB,
        Thresholds,
        problem_lines,
        run_doctor,
        skip_lines,
        summary_line,
        table,
    )
    from ..doctor.record import check_record_dir, replay  # noqa: PLC0415
    from ..inventory import load, master_port  # noqa: PLC0415

    if args.replay is not None:
        if args.inventory is not None:
            args._parser.error("--replay judges a recorded directory; drop -i/--inventory")
        report = replay(args.replay)
    else:
        if args.inventory is None:
            args._parser.error(
                "the following arguments are required: -i/--inventory (or --replay DIR)"
            )
        if args.record is not None:
            check_record_dir(args.record)
        thresholds = Thresholds(
            min_shm_bytes=int(args.min_shm_gb * GIB), min_free_bytes=int(args.min_free_gb * GIB)
        )
        inv = load(args.inventory)
        report = run_doctor(
            inv,
            master_port=master_port(inv, args.master_port),
            thresholds=thresholds,
            console=err,
            gpu_diag_budget=args.gpu_diag_budget,
            record=args.record,
        )
    if args.json:
        out.print_json(json.dumps(report.to_json()))
    else:
        out.print(table(report, out.width))
        for line in skip_lines(report):
            out.print(line, style="dim", markup=False, highlight=False)
        for line in problem_lines(report):
            out.print(line, markup=False, highlight=False)
        out.print(summary_line(report), markup=False, highlight=False)
    return 0 if report.ok else 1

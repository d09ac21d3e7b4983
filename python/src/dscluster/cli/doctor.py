"""`dscluster doctor`: every node and every pair of nodes checked before a job (exit 0/1)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from .. import validate
from . import flags


def register(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check every node and every pair of nodes before a job (exit 0/1)"
    )
    flags.inventory(p)
    flags.as_json(p)
    flags.master_port(p, what="rendezvous port to probe on the head")
    for flag, default, what in (("--min-shm-gb", 1, "/dev/shm"), ("--min-free-gb", 2, "free disk")):
        p.add_argument(
            flag,
            type=validate.real_type(0, 1 << 20, "GiB", str(default), flag=flag),
            default=float(default),
            help=f"{what} below this fails (default {default})",
        )
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..doctor import GIB, Thresholds, problem_lines, run_doctor, summary_line, table  # noqa: PLC0415
    from ..inventory import load, master_port  # noqa: PLC0415

    thresholds = Thresholds(
        min_shm_bytes=int(args.min_shm_gb * GIB), min_free_bytes=int(args.min_free_gb * GIB)
    )
    inv = load(args.inventory)
    report = run_doctor(
        inv, master_port=master_port(inv, args.master_port), thresholds=thresholds, console=err
    )
    if args.json:
        out.print_json(json.dumps(report.to_json()))
    else:
        out.print(table(report, out.width))
        for line in problem_lines(report):
            out.print(line, markup=False, highlight=False)
        out.print(summary_line(report), markup=False, highlight=False)
    return 0 if report.ok else 1

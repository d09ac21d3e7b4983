"""`dscluster jobs`, `dscluster logs JOB`, `dscluster stop JOB`: the jobs that `launch` and
`smoke` started under the head's supervisor, read from its root-owned records."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import time

from rich.console import Console
from rich.table import Table

from .. import validate
from ..errors import DsclusterError
from . import flags


def register(sub) -> None:
    p = sub.add_parser(
        "jobs",
        help="list the jobs on the cluster: state, nodes, attempts, last step",
        description="dscluster jobs -i INV [--json]",
    )
    flags.inventory(p)
    p.add_argument("--json", action="store_true", help="print the jobs as JSON")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser(
        "logs",
        help="print or follow a job's output",
        description="dscluster logs -i INV JOB [-f] [--host H] [--tail N]",
    )
    flags.inventory(p)
    p.add_argument("job", help="the job's id (dscluster jobs lists them)")
    p.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    p.add_argument("--host", default="", help="only the lines of this node (pdsh's 'host: ')")
    p.add_argument(
        "--tail",
        type=validate.count_type(0, 10_000_000, "a line count", 100, flag="--tail"),
        default=None,
        help="only the last N lines (then follow, with -f)",
    )
    p.set_defaults(func=cmd_logs, check=check_job)

    p = sub.add_parser(
        "stop",
        help="stop a job: every rank on every node",
        description="dscluster stop -i INV JOB",
    )
    flags.inventory(p)
    p.add_argument("job", help="the job's id (dscluster jobs lists them)")
    p.set_defaults(func=cmd_stop, check=check_job)


def check_job(args: argparse.Namespace) -> None:
    from ..launch.jobs import check_job_id  # noqa: PLC0415

    check_job_id(args.job)


def _when(stamp: object) -> str:
    if not isinstance(stamp, int | float):
        return "-"
    return dt.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def cmd_jobs(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..inventory import load  # noqa: PLC0415
    from ..launch import jobs  # noqa: PLC0415

    launches = jobs.by_launch(jobs.list_jobs(load(args.inventory)))
    if args.json:
        print(json.dumps({"jobs": launches}, indent=2, sort_keys=True))
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("JOB", "LAUNCHER", "NODES", "STATE", "STARTED", "ATTEMPTS", "STEP"):
        table.add_column(col)
    for job in launches:
        state = str(job.get("state") or "-")
        if job.get("rc") is not None and state != "running":
            state += f" ({job['rc']})"
        table.add_row(
            job["id"],
            str(job.get("launcher") or "-"),
            ",".join(job.get("nodes") or []) or "-",
            state,
            _when(job["attempts"][0].get("started")),
            str(len(job["attempts"])),
            "-" if job.get("last_step") is None else str(job["last_step"]),
        )
    wide = out if out.is_terminal else Console(file=out.file, width=max(out.width, 200))
    wide.print(table)
    return 0


def cmd_logs(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..inventory import load  # noqa: PLC0415
    from ..launch import jobs  # noqa: PLC0415

    inv = load(args.inventory)
    prefix = f"{args.host}: " if args.host else ""

    def show(text: str, _at: float) -> None:
        if text.startswith(prefix):
            out.file.write(text + "\n")
            out.file.flush()

    kept: list[str] = []
    if args.tail is not None:
        # the node's lines first (--host), then the last N of them
        seen = jobs.follow(
            inv,
            args.job,
            wait=False,
            on_line=lambda t, _a: kept.append(t) if t.startswith(prefix) else None,
        )
        for text in kept[-args.tail :] if args.tail else []:
            show(text, 0.0)
    else:
        seen = jobs.follow(inv, args.job, wait=False, on_line=show)
    if args.follow and seen.end is None:
        try:
            seen = jobs.follow(inv, args.job, offset=seen.offset, on_line=show)
        except KeyboardInterrupt:
            return 0
    if seen.end is not None:
        _say_end(err, args.job, seen.end.state)
    return 0


def _say_end(err: Console, job_id: str, state: dict) -> None:
    took = ""
    if isinstance(state.get("started"), int | float) and isinstance(
        state.get("ended"), int | float
    ):
        took = f" after {dt.timedelta(seconds=round(state['ended'] - state['started']))}"
    attempts = state.get("attempts") or []
    if len(attempts) > 1:
        took += f"; {len(attempts)} attempts"
    if state.get("stopped"):
        took += f", stopped: {state['stopped']}"
    err.print(
        f"{job_id}: {state.get('state')}, exit {state.get('rc')}{took}",
        markup=False,
        highlight=False,
    )


def cmd_stop(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..inventory import load  # noqa: PLC0415
    from ..launch import jobs  # noqa: PLC0415

    inv = load(args.inventory)
    start = time.monotonic()
    state = jobs.stop(inv, args.job)
    if state.get("state") in jobs.RUNNING:
        raise DsclusterError(
            f"{args.job}: still running {round(time.monotonic() - start)} s after SIGTERM; "
            f"see dscluster logs -i {shlex.quote(str(inv.source))} {args.job} --tail 50"
        )
    _say_end(err, args.job, state)
    return 0

"""`dscluster launch -i INV [options] -- script.py [args...]`."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time

from rich.console import Console
from rich.table import Table

from .. import validate
from ..errors import DsclusterError
from ..launch import LAUNCHERS
from ..launch.jobs import Detached, attempt_of
from ..launch.signatures import Match
from ..launch.watch import ScriptFailure, time_limit_note
from . import flags

# Seconds between two status lines that only a new step would print.
STATUS_EVERY = 30.0


def register(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run your script across the cluster (deepspeed, torchrun, mpi, accelerate, gaudi)",
        description="dscluster launch -i INV [options] -- script.py [args...]",
    )
    flags.inventory(p)
    flags.launcher(
        p,
        LAUNCHERS,
        default="deepspeed",
        help="deepspeed (pdsh), torchrun (c10d, one agent per node over pdsh), mpi (mpirun), "
        "accelerate (accelerate launch per node over pdsh) or gaudi_spawn (optimum-habana)",
    )
    flags.accelerate_config(p)
    p.add_argument(
        "--gaudi-spawn",
        metavar="PATH",
        help="--launcher gaudi_spawn: optimum-habana's examples/gaudi_spawn.py, a local file "
        "(staged with the job) or its absolute path on the nodes",
    )
    p.add_argument("--include", default="", help="DeepSpeed syntax: host1:0,1@host2")
    p.add_argument("--exclude", default="", help="DeepSpeed syntax: host3@host1:1")
    p.add_argument(
        "--num-nodes",
        type=validate.count_type(1, validate.MAX_NODES, "a node count", 2, flag="--num-nodes"),
        default=None,
        help="the first N hosts",
    )
    p.add_argument(
        "--num-gpus",
        type=validate.count_type(1, validate.MAX_SLOTS, "a slot count", 1, flag="--num-gpus"),
        default=None,
        help="the first N slots per host",
    )
    flags.master_port(p)
    flags.timeout(p, None, what="the job (default: never; the job runs until it ends)")
    p.add_argument(
        "--detach",
        action="store_true",
        help="return once the job started; it runs on under the head's supervisor "
        "(dscluster jobs, logs, stop); Ctrl-C while the output streams does the same",
    )
    p.add_argument(
        "--no-stage",
        action="store_true",
        help="run an absolute path already on the nodes instead of copying the script",
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        default=None,
        help="ship this project directory (minus .gitignore'd files) and run in it; the "
        "script and its files are relative to DIR",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the command and launch files, run nothing"
    )
    flags.restart_options(
        p,
        max_default=0,
        min_default=1,
        max_help="when the job loses nodes, run it again on the nodes left (after doctor checks "
        "them), up to N times, resuming from the last complete checkpoint "
        "(DSCLUSTER_RESTART, DSCLUSTER_CHECKPOINT_DIR, DSCLUSTER_CHECKPOINT_TAG in every "
        "rank; rank 0 prints 'DSCLUSTER_STEP <n>' after each step); with --launcher "
        "torchrun --nnodes MIN:MAX, torchrun's agents restart the workers N times instead",
        min_help="stop instead of restarting when fewer nodes are left (default 1)",
        dir_help="checkpoint directory on the nodes, the same for every attempt (default: "
        "dscluster_checkpoint_dir/<launch id>, on shared storage where there is one)",
    )
    p.add_argument(
        "--retry-on-error",
        action="store_true",
        help="with --max-restarts: also restart after a script error (every node reachable)",
    )
    flags.no_doctor(p)
    flags.exclude_unhealthy(p)
    flags.nnodes(p)
    flags.program(p)
    p.set_defaults(func=cmd_launch, check=check_launch)


def check_launch(args: argparse.Namespace) -> None:
    """What can be refused from the command line alone: the program, the filters' syntax."""
    from ..launch import parse_node_specs  # noqa: PLC0415
    from ..launch.run import program_for  # noqa: PLC0415

    program = flags.after_dashes(args.program)
    if not program:
        raise DsclusterError("no script to run; put it after '--': dscluster launch -- train.py")
    flags.check_exclude_unhealthy(args)
    _check_restarts(args)
    flags.check_nnodes(args)
    if args.workdir is not None:
        words = _check_workdir(args, program)
    else:
        words, _ = program_for(program[0], program[1:], stage=not args.no_stage)
    from ..launch.modes import check_options  # noqa: PLC0415

    check_options(
        args.launcher,
        accelerate_config=args.accelerate_config,
        accelerate_config_kind=args.accelerate_config_kind,
        gaudi_spawn=args.gaudi_spawn,
    )
    if args.launcher in ("deepspeed", "gaudi_spawn"):
        from ..launch import check_deepspeed_args  # noqa: PLC0415

        check_deepspeed_args(words)
    for flag, text in (("--include", args.include), ("--exclude", args.exclude)):
        if text:
            parse_node_specs(text, flag)


def _check_restarts(args: argparse.Namespace) -> None:
    from ..launch.restart import check_checkpoint_dir  # noqa: PLC0415

    if args.retry_on_error and not args.max_restarts:
        raise DsclusterError(
            "--retry-on-error retries within --max-restarts N, which is 0; give --max-restarts"
        )
    if args.checkpoint_dir:
        check_checkpoint_dir(args.checkpoint_dir)


def _restart_policy(args: argparse.Namespace):
    from ..launch.restart import RestartPolicy, check_checkpoint_dir  # noqa: PLC0415

    return RestartPolicy(
        # with --nnodes torchrun's agents restart the workers; the job is not relaunched
        max_restarts=0 if args.nnodes is not None else args.max_restarts,
        min_nodes=args.min_nodes,
        retry_on_error=args.retry_on_error,
        checkpoint_dir=check_checkpoint_dir(args.checkpoint_dir) if args.checkpoint_dir else "",
    )


def _check_workdir(args: argparse.Namespace, program: list[str]) -> list[str]:
    from ..launch.workdir import project_for  # noqa: PLC0415

    if args.no_stage:
        raise DsclusterError(
            "--workdir ships the project and --no-stage runs what is already on the nodes; "
            "give one of them"
        )
    _, rel = project_for(args.workdir, program[0])
    return [rel, *program[1:]]


def _failure(failure: ScriptFailure, err: Console) -> str:
    """The one line's part for a script error; its error lines go to stderr as a block."""
    ranks = ",".join(map(str, failure.ranks))
    text = f", job failed on rank{'s' if len(failure.ranks) > 1 else ''} {ranks} "
    text += f"({', '.join(failure.hosts)}), every node reachable"
    if not failure.error_lines:
        return f"{text}: {failure.why}"
    err.print(f"first error lines {failure.error_from}:", markup=False, highlight=False)
    for line in failure.error_lines:
        err.print(f"    {line}", markup=False, highlight=False, soft_wrap=True)
    return f"{text}; first error {failure.error_from}: {failure.error_lines[-1].strip()}"


def _signatures(matches: list[Match], err: Console) -> str:
    """Each known failure signature with its fix to stderr; the first one's fix for the one
    line."""
    for m in matches:
        err.print(
            f"known error on {m.where}: {m.line[:300]}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        err.print(f"    fix: {m.help}", markup=False, highlight=False, soft_wrap=True)
    return f"; fix ({matches[0].name} on {matches[0].where}): {matches[0].help}" if matches else ""


def _without(left_out: dict[str, str]) -> str:
    """The nodes --exclude-unhealthy left out, for the one line."""
    if not left_out:
        return ""
    who = "; ".join(f"{host}: {checks}" for host, checks in left_out.items())
    return f"; without {', '.join(left_out)} (--exclude-unhealthy: {who})"


def _attempts(result, err: Console) -> str:
    """launch --max-restarts: the attempts as a table on stderr; the one line's part (why
    it stopped, the run record)."""
    record = result.record
    if record is None:
        return ""
    # Wide enough for whole run ids and node lists where stderr is a log, not a terminal.
    wide = err if err.is_terminal else Console(file=err.file, width=max(err.width, 200))
    err.print(f"launch {record.launch_id}: attempts", markup=False, highlight=False)
    wide.print(attempts_table(record))
    text = f"; {len(record.attempts)} attempt(s)"
    if record.stopped:
        text += f", stopped: {record.stopped}"
    return f"{text}; run record {record.path}"


def attempts_table(record) -> Table:
    """The run record's attempts (restart.RunRecord), a row each."""
    table = Table()
    for name in ("#", "run", "nodes", "ended", "resumed from", "tag at end", "steps", "recovery"):
        table.add_column(name)
    for a in record.attempts:
        table.add_row(
            str(a.restart),
            a.run_id,
            ",".join(a.nodes),
            a.ended_why,
            a.resumed_from or "-",
            a.tag_at_end or "-",
            "unknown" if a.steps is None else str(a.steps),
            "-" if a.recovery_s is None else f"{a.recovery_s:.1f} s",
        )
    return table


def _write_line(out: Console, text: str) -> None:
    """One line of the job's, as it came: no markup, no wrapping, flushed at once."""
    out.file.write(text + "\n")
    out.file.flush()


class _Status:
    """The job's status line on stderr, from the supervisor's state: each change of state,
    and the last DSCLUSTER_STEP at most every STATUS_EVERY seconds."""

    def __init__(self, err: Console, every: float = STATUS_EVERY):
        self.err, self.every = err, every
        self.said: tuple = ()
        self.at = 0.0

    def update(self, state: dict) -> None:
        job = str(state.get("id") or "")
        key = (job, state.get("state"))
        now = time.monotonic()
        if key == self.said[:2] and (
            state.get("last_step") == self.said[2:] or now - self.at < self.every
        ):
            return
        self.said, self.at = (*key, state.get("last_step")), now
        started = state.get("started")
        took = (
            dt.timedelta(seconds=round(time.time() - started))
            if isinstance(started, int | float)
            else "-"
        )
        # the supervisor's attempts (launch --max-restarts), else the id's -rN
        attempt = len(state.get("attempts") or []) or attempt_of(job)
        step = state.get("last_step")
        self.err.print(
            f"[{job}: {state.get('state')}, attempt {attempt}, {len(state.get('nodes') or [])} "
            f"nodes, {took}" + (f", step {step}]" if step is not None else "]"),
            markup=False,
            highlight=False,
        )


def cmd_launch(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..inventory import load, master_port  # noqa: PLC0415
    from ..launch import LaunchRequest, launch  # noqa: PLC0415
    from ..launch.modes import plan_options  # noqa: PLC0415

    program = flags.after_dashes(args.program)
    if not program:
        raise DsclusterError("no script to run; put it after '--': dscluster launch -- train.py")
    inv = load(args.inventory)
    port = master_port(inv, args.master_port)
    mode, mode_files = plan_options(
        args.launcher,
        accelerate_config=args.accelerate_config,
        accelerate_config_kind=args.accelerate_config_kind,
        gaudi_spawn=args.gaudi_spawn,
    )
    request = LaunchRequest(
        launcher=args.launcher,
        program=program,
        include=args.include,
        exclude=args.exclude,
        num_nodes=args.num_nodes,
        num_gpus=args.num_gpus,
        master_port=port,
        nnodes=args.nnodes,
        torchrun_max_restarts=flags.torchrun_restarts(args),
        **mode,
    )
    status = _Status(err)
    try:
        plan, result = launch(
            inv,
            request,
            stage=not args.no_stage,
            workdir=args.workdir,
            dry_run=args.dry_run,
            timeout=args.timeout,
            mode_files=mode_files,
            out=out,
            console=err,
            preflight=flags.preflight(args, inv, master_port=port, console=err, what="launch"),
            restart=_restart_policy(args),
            on_line=lambda text, _at: _write_line(out, text),
            on_state=status.update,
            detach=args.detach,
        )
    except Detached as exc:
        err.print(f"launch {exc}", markup=False, highlight=False, soft_wrap=True)
        return 0
    if result is None:
        if args.exclude_unhealthy:
            err.print(
                "launch: --dry-run runs no doctor: the plan above has every node, and "
                "--exclude-unhealthy leaves out the failing ones when the job starts",
                markup=False,
                highlight=False,
            )
        return 0
    attempts = _attempts(result, err)
    if result.rc == 0:
        where = f"ran in {plan.job_dir} on {plan.head}"
        where += f" ({result.project})" if result.project else ""
        where += _without(result.left_out) + attempts
        err.print(
            f"launch {plan.run_id}: job exited 0; log {result.log_path}; {where}",
            markup=False,
            highlight=False,
        )
        return 0
    why = f"exited {result.rc}"
    if result.rc in (124, 137):
        # the ranks still running when the limit came: the node to look at, not only 124
        note = time_limit_note(result.log_lines)
        why += " (cut at --timeout" + (f"; {note})" if note else ")")
    lost = result.lost_nodes
    if result.failure is not None:
        why += _failure(result.failure, err)
    elif lost:
        who = "; ".join(f"{host}: {reason}" for host, reason in lost.items())
        why += f", lost node(s) {', '.join(lost)} ({who})"
    elif result.playbook.failures and not result.log_lines:
        host, task, msg = result.playbook.failures[0]
        why += f": {task} on {host}: {msg[:200]}"
    why += _signatures(result.signatures, err)
    why += _without(result.left_out) + attempts
    line = f"launch {plan.run_id}: job {why}; log {result.log_path}"
    print(f"dscluster: error: {line}", file=sys.stderr)
    return result.rc

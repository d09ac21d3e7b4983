"""`dscluster sbatch`: write a Slurm batch script for a launcher (deepspeed, torchrun, srun,
accelerate)."""

from __future__ import annotations

import argparse
import pathlib

from rich.console import Console

from .. import validate
from ..sbatch import DEFAULT_VENV, MODES
from . import flags


def register(sub) -> None:
    p = sub.add_parser(
        "sbatch",
        help="write a Slurm batch script for a launcher (deepspeed, torchrun, srun, accelerate)",
        description="Write a bash batch script; submit it with sbatch. "
        "Example: dscluster sbatch --launcher torchrun --nodes 2 -- train.py --epochs 3",
    )
    flags.launcher(
        p,
        MODES,
        help="how the ranks start: deepspeed, torchrun, srun or accelerate",
        old=("--mode",),
    )
    flags.accelerate_config(p)
    p.add_argument(
        "--nodes",
        type=validate.count_type(1, validate.MAX_NODES, "a node count", 2, flag="--nodes"),
        help="#SBATCH --nodes",
    )
    flags.slots(
        p,
        default=None,
        help="#SBATCH --ntasks-per-node, and ranks per node where Slurm reports no GPUs",
    )
    p.add_argument("--gres", help="#SBATCH --gres, e.g. gpu:4 (nothing GPU-related otherwise)")
    p.add_argument("--partition", help="#SBATCH --partition")
    p.add_argument("--time", help="#SBATCH --time, e.g. 30 or 1-00:00:00")
    p.add_argument("--job-name", help="#SBATCH --job-name")
    p.add_argument("--slurm-output", help="#SBATCH --output (Slurm's log file, e.g. slurm-%%j.out)")
    flags.alias(p, "--output", dest="slurm_output")
    p.add_argument("--chdir", help="#SBATCH --chdir; the job's hostfile is written there")
    p.add_argument("--venv", help=f"the nodes' venv (default dscluster_venv or {DEFAULT_VENV})")
    flags.master_port(p, what="rendezvous / master port")
    flags.restart_options(
        p,
        max_default=None,
        min_default=None,
        max_help="#SBATCH --requeue: when a node of the job fails, Slurm runs it again (the same "
        "job id) up to N times, each rank finding DSCLUSTER_RESTART, DSCLUSTER_CHECKPOINT_DIR "
        "and DSCLUSTER_CHECKPOINT_TAG (the last complete checkpoint) to resume from",
        min_help="#SBATCH --nodes=M-N: Slurm may start the job (any attempt) on as few as M of "
        "the --nodes N rather than wait for N",
        dir_help="checkpoint directory on the nodes, the same for every attempt (default: the "
        "inventory's dscluster_checkpoint_dir on shared storage, else <job dir>/checkpoints, "
        "then /<job id>)",
    )
    flags.out(
        p,
        help="where to write the batch script (default dscluster-<launcher>.sbatch)",
        old=("--script",),
        type=validate.out_file_type("--out"),
    )
    flags.inventory(
        p,
        required=False,
        help="inventories/<name>: venv/port defaults and its .deepspeed_env for the ranks",
    )
    p.add_argument("command", nargs="+", help="-- script.py [args...]")
    p.set_defaults(func=cmd_sbatch, check=check_sbatch)


def check_sbatch(args: argparse.Namespace) -> None:
    """Every option as given, before the inventory is read or anything is written (the
    inventory's venv, port and environment are checked again once read)."""
    from ..launch.modes import check_options  # noqa: PLC0415
    from ..sbatch import default_script_path, validate  # noqa: PLC0415
    from ..validate import check_out_file  # noqa: PLC0415

    check_options(
        args.launcher,
        accelerate_config=args.accelerate_config,
        accelerate_config_kind=args.accelerate_config_kind,
    )
    validate(_options(args, None, None, {}))
    if args.out is None:
        check_out_file(default_script_path(args.launcher), "the batch script (-o/--out)")


def _options(
    args: argparse.Namespace,
    venv: str | None,
    port: int | None,
    env: dict,
    checkpoint_base: str = "",
):
    from ..launch.modes import plan_options  # noqa: PLC0415
    from ..sbatch import SbatchOptions  # noqa: PLC0415

    mode, _ = plan_options(
        args.launcher,
        accelerate_config=args.accelerate_config,
        accelerate_config_kind=args.accelerate_config_kind,
    )
    return SbatchOptions(
        launcher=args.launcher,
        command=flags.after_dashes(args.command),
        nodes=args.nodes,
        slots=args.slots,
        partition=args.partition,
        time=args.time,
        job_name=args.job_name,
        slurm_output=args.slurm_output,
        chdir=args.chdir,
        gres=args.gres,
        venv=args.venv or venv or DEFAULT_VENV,
        master_port=args.master_port if args.master_port is not None else port,
        env=env,
        origin=f"dscluster sbatch --launcher {args.launcher}",
        max_restarts=args.max_restarts,
        min_nodes=args.min_nodes,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_base=checkpoint_base,
        **mode,
    )


def cmd_sbatch(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sbatch import inventory_defaults, write_sbatch  # noqa: PLC0415

    venv, port, env, base = (
        inventory_defaults(args.inventory) if args.inventory else (None, None, {}, "")
    )
    opts = _options(args, venv, port, env, base)
    path = write_sbatch(opts, pathlib.Path(args.out) if args.out else None)
    out.print(str(path), markup=False, highlight=False)
    return 0

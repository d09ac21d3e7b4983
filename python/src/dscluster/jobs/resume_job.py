#!/usr/bin/env python3
"""dscluster resume job: a DeepSpeed training run that checkpoints and resumes, at any world size.

Started by the launcher on every rank (`dscluster launch ... resume_job.py --steps 60 --save-every
5`). It trains a small deterministic model with ZeRO (stage 2 by default, 1 and 3 selectable),
saves a checkpoint every --save-every steps with DeepSpeed's save_checkpoint into
$DSCLUSTER_CHECKPOINT_DIR under DeepSpeed's own tag form (`global_step<N>`), and on start, when
$DSCLUSTER_CHECKPOINT_TAG (or else DeepSpeed's `latest` file) names a complete checkpoint, loads
it and trains on from step N+1 to --steps: no step past the checkpoint is trained twice and the
last step is the one asked for. The batch of step n is a function of n alone (a fixed global
batch, split over the ranks; the loss is scaled so the gradient is the global batch's mean at
any split), so a resumed run at another world size trains the same samples.

Another data-parallel size. ZeRO-1/2/3 checkpoints are partitioned by data-parallel rank, and
DeepSpeed 0.19.8 refuses to load one at another DP size ("Automatic adjustment of ZeRO's
optimizer state partitioning with a new world size is not currently supported"): its ZeRO-1/2
`elastic_checkpoint` option only changes how the partitions are saved, the engine's DP-size check
still rejects them, and `zero_to_fp32` recovers the weights but not the optimizer state. What
reloads the whole state (fp32 weights, Adam moments, step) at another DP size, for stages 1, 2
and 3, is DeepSpeed's universal checkpoint: so when the world size recorded with the checkpoint
differs from this run's, rank 0 converts the tag with deepspeed.checkpoint.ds_to_universal (into
`<tag>_universal`, once: it is reused by a later attempt) while the others wait, and every rank
builds its engine with `"checkpoint": {"load_universal": true}` and loads that. At the same
world size the checkpoint is loaded as saved. The model carries DeepSpeed's
`universal_checkpoint_info` attribute so every checkpoint it writes can be converted.

The checkpoint directory must be one that every rank sees (shared storage): the ranks check
that they found the same checkpoint and stop at once if not. The world size (and step, ZeRO
stage) of a checkpoint is recorded in `<tag>/dscluster.json`, written by rank 0 after
save_checkpoint has returned on every rank, so it also marks the tag complete: a tag without it
(a save cut short by a lost node) is skipped for the newest complete one before it.

Rank 0 prints `DSCLUSTER_STEP <n>` after each optimizer step (n: the global step after it; the
launch's restart loop times the first resumed step from it) and appends one JSON line per step
(step, loss, world_size, restart, resumed_from) to $DSCLUSTER_CHECKPOINT_DIR/steps.jsonl.

Runs on the nodes with the cluster venv and imports nothing from dscluster; its pure functions
(arguments, the data of a step, the split, the checkpoint bookkeeping) are also imported by
dscluster's unit tests, which need neither torch nor DeepSpeed for them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import re
import shutil
import sys
import time

IN_DIM, HIDDEN, OUT_DIM = 16, 64, 4
TAG_RE = re.compile(r"^global_step(\d+)$")
MARKER = "dscluster.json"
STEPS_LOG = "steps.jsonl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="the last global step to train")
    parser.add_argument("--save-every", type=int, default=5, help="checkpoint every K steps")
    parser.add_argument("--zero", type=int, choices=(1, 2, 3), default=2, help="ZeRO stage")
    parser.add_argument(
        "--global-batch", type=int, default=24, help="samples per step, split over the ranks"
    )
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0, help="the data's seed")
    parser.add_argument(
        "--sleep-per-step", type=float, default=0.0, help="seconds to sleep after each step"
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("DSCLUSTER_CHECKPOINT_DIR", ""),
        help="default: $DSCLUSTER_CHECKPOINT_DIR",
    )
    parser.add_argument("--dist-timeout", type=int, default=300, help="seconds")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    args = parser.parse_args(argv)
    if not args.checkpoint_dir:
        parser.error("no checkpoint directory: set DSCLUSTER_CHECKPOINT_DIR or --checkpoint-dir")
    for name in ("steps", "save_every", "global_batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.sleep_per_step < 0:
        parser.error("--sleep-per-step must not be negative")
    return args


def step_samples(step: int, global_batch: int, seed: int = 0) -> tuple[list, list]:
    """The whole global batch of one step, (inputs, targets) as lists of rows: a function of the
    step (and seed) only, so any world size, and any restart, sees the same samples at step n.
    The targets come from a fixed random teacher, so there is something to learn."""
    teacher = random.Random(f"teacher-{seed}")
    a = [[teacher.gauss(0, 1 / math.sqrt(IN_DIM)) for _ in range(8)] for _ in range(IN_DIM)]
    b = [[teacher.gauss(0, 1) for _ in range(OUT_DIM)] for _ in range(8)]
    rng = random.Random(f"data-{seed}-{step}")
    xs, ys = [], []
    for _ in range(global_batch):
        x = [rng.gauss(0, 1) for _ in range(IN_DIM)]
        h = [math.tanh(sum(x[i] * a[i][j] for i in range(IN_DIM))) for j in range(8)]
        xs.append(x)
        ys.append([sum(h[j] * b[j][k] for j in range(8)) for k in range(OUT_DIM)])
    return xs, ys


def rank_slice(global_batch: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of the global batch that this rank trains: contiguous, sizes differing by
    at most one, together exactly the batch (a rank may get none when world > batch)."""
    base, extra = divmod(global_batch, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def tag_for(step: int) -> str:
    return f"global_step{step}"


def tag_step(tag: str) -> int | None:
    match = TAG_RE.match(tag)
    return int(match.group(1)) if match else None


def read_marker(ckpt_dir: str, tag: str) -> dict | None:
    """The record beside a complete tag, or None (no such tag, or a save cut short)."""
    try:
        with open(os.path.join(ckpt_dir, tag, MARKER)) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "world_size" in record else None


def write_marker(ckpt_dir: str, tag: str, record: dict) -> None:
    path = os.path.join(ckpt_dir, tag, MARKER)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(record, handle)
    os.replace(tmp, path)  # atomic: a reader sees the whole record or none


def resume_tag(ckpt_dir: str, named: str = "") -> str | None:
    """The checkpoint to resume from: the tag named (DSCLUSTER_CHECKPOINT_TAG, else DeepSpeed's
    `latest`) when it is complete, else the newest complete global_step<N> below it (or, with
    none named, the newest complete one); None for a fresh start."""
    if not named:
        try:
            with open(os.path.join(ckpt_dir, "latest")) as handle:
                named = handle.read().strip()
        except OSError:
            named = ""
    if named and read_marker(ckpt_dir, named) is not None:
        return named
    limit = tag_step(named) if named else None
    try:
        entries = os.listdir(ckpt_dir)
    except OSError:
        return None
    steps = sorted(
        (step, entry)
        for entry in entries
        if (step := tag_step(entry)) is not None and (limit is None or step < limit)
    )
    for _, entry in reversed(steps):
        if read_marker(ckpt_dir, entry) is not None:
            return entry
    return None


def ds_config(args: argparse.Namespace, world: int, *, universal: bool) -> dict:
    zero: dict = {"stage": args.zero}
    if args.zero == 3:
        zero["stage3_param_persistence_threshold"] = 0  # partition even this model's small tensors
    config = {
        "train_micro_batch_size_per_gpu": max(1, math.ceil(args.global_batch / world)),
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": args.lr}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if universal:
        config["checkpoint"] = {"load_universal": True}
    return config


def to_universal(ckpt_dir: str, tag: str) -> str:
    """Convert tag into DeepSpeed's universal form (<tag>_universal) unless an earlier attempt
    already did; returns the universal tag. Rank 0 only; written beside and renamed into place,
    so a conversion cut short is never loaded."""
    from deepspeed.checkpoint import ds_to_universal  # noqa: PLC0415 - on the nodes only

    out_tag = f"{tag}_universal"
    out = os.path.join(ckpt_dir, out_tag)
    if os.path.isdir(out):
        return out_tag
    tmp = f"{out}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    convert = argparse.Namespace(
        input_folder=os.path.join(ckpt_dir, tag),
        output_folder=tmp,
        num_extract_workers=1,  # in this process: no worker pool beside the training ranks
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # a checkpoint saved without universal_checkpoint_info
    )
    ds_to_universal.main(convert)
    os.replace(tmp, out)
    # ds_to_universal points latest_universal at the temporary name; point it at the real one.
    with open(os.path.join(ckpt_dir, "latest_universal"), "w") as handle:
        handle.write(out_tag)
    return out_tag


def build_model(torch):
    from deepspeed.checkpoint.constants import (  # noqa: PLC0415
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )

    torch.manual_seed(1234)  # the same initial weights on every rank and every fresh start
    model = torch.nn.Sequential(
        torch.nn.Linear(IN_DIM, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, OUT_DIM),
    )
    # DeepSpeed saves this with every checkpoint; ds_to_universal requires it.
    setattr(
        model,
        UNIVERSAL_CHECKPOINT_INFO,
        {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
    )
    return model


def log_step(ckpt_dir: str, record: dict) -> None:
    with open(os.path.join(ckpt_dir, STEPS_LOG), "a") as handle:
        handle.write(json.dumps(record) + "\n")


def choose_resume(dist, ckpt_dir: str, world: int) -> tuple[str | None, str | None, bool]:
    """(the tag resumed from, the tag to load, whether as a universal checkpoint); (None, None,
    False) for a fresh start. Every rank reads the same files (shared storage) and checks that
    the others found the same; rank 0 converts to universal form while the others wait."""
    tag = resume_tag(ckpt_dir, os.environ.get("DSCLUSTER_CHECKPOINT_TAG", "").strip())
    record = read_marker(ckpt_dir, tag) if tag else None
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (tag, record))
    if any(other != seen[0] for other in seen):
        # Node-local directories: a rank would load what another cannot see; stop at once.
        raise SystemExit(
            f"resume_job: the ranks see different checkpoints in {ckpt_dir} "
            f"({sorted(set(map(str, seen)))}); it must be one directory every rank sees "
            "(shared storage)"
        )
    if tag is None or record is None or int(record["world_size"]) == world:
        return tag, tag, False
    if dist.get_rank() == 0:
        print(
            f"resume_job: {tag} was saved at world size {record['world_size']}, this run has "
            f"{world}: loading it as a DeepSpeed universal checkpoint",
            flush=True,
        )
        to_universal(ckpt_dir, tag)
    dist.barrier()
    return tag, f"{tag}_universal", True


def train(torch, dist, engine, args: argparse.Namespace, start: int) -> None:
    """Steps start+1 .. args.steps, a checkpoint every args.save_every and at the last."""
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("DSCLUSTER_RESTART", "0") or 0)
    dtype = next(engine.module.parameters()).dtype
    lo, hi = rank_slice(args.global_batch, rank, world)
    for step in range(start + 1, args.steps + 1):
        xs, ys = step_samples(step, args.global_batch, args.seed)
        x = torch.tensor(xs[lo:hi], dtype=dtype, device=engine.device).reshape(-1, IN_DIM)
        y = torch.tensor(ys[lo:hi], dtype=torch.float32, device=engine.device).reshape(-1, OUT_DIM)
        # Sum over my samples / global batch, times world size: DeepSpeed averages the ranks'
        # gradients, so the step is the global batch's mean at any split over the ranks.
        sq = torch.nn.functional.mse_loss(engine(x).float(), y, reduction="sum") / OUT_DIM
        engine.backward(sq * world / args.global_batch)
        engine.step()
        total = sq.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(f"DSCLUSTER_STEP {step}", flush=True)
            log_step(
                args.checkpoint_dir,
                {
                    "step": step,
                    "loss": float(total) / args.global_batch,
                    "world_size": world,
                    "restart": restart,
                    "resumed_from": start,
                },
            )
        if step % args.save_every == 0 or step == args.steps:
            engine.save_checkpoint(
                args.checkpoint_dir, tag=tag_for(step), client_state={"step": step}
            )
            if rank == 0:
                write_marker(
                    args.checkpoint_dir,
                    tag_for(step),
                    {"step": step, "world_size": world, "zero": args.zero, "restart": restart},
                )
        if args.sleep_per_step:
            time.sleep(args.sleep_per_step)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import deepspeed  # noqa: PLC0415 - heavy imports after argument parsing
    import torch  # noqa: PLC0415
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

    accel = get_accelerator()
    deepspeed.init_distributed(timeout=dt.timedelta(seconds=args.dist_timeout))
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    if accel.device_name() != "cpu":
        accel.set_device(args.local_rank)
    if rank == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
    dist.barrier()

    tag, load_tag, universal = choose_resume(dist, args.checkpoint_dir, world)
    model = build_model(torch)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=model.parameters(),
        config=ds_config(args, world, universal=universal),
    )
    start = 0
    if tag and load_tag:
        load_path, client = engine.load_checkpoint(args.checkpoint_dir, tag=load_tag)
        if load_path is None:
            raise SystemExit(f"resume_job: could not load {load_tag} from {args.checkpoint_dir}")
        start = int((client or {}).get("step", tag_step(tag) or 0))
        engine.global_steps = start  # the universal load restores it too; this makes it certain
        if rank == 0:
            print(f"resume_job: resumed from {tag} at step {start}", flush=True)

    train(torch, dist, engine, args, start)
    dist.barrier()
    if rank == 0:
        print(f"resume_job: done at step {args.steps} (world size {world})", flush=True)
    engine.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())

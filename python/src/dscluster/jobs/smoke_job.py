#!/usr/bin/env python3
"""dscluster smoke job: a real DeepSpeed engine across every slot, with checks and a report.

Started by the `deepspeed` launcher on every rank. Each rank trains the same small model with
ZeRO at the chosen stage on its own data, then the ranks exchange what they saw; rank 0 writes
the report. Every rank exits 0 only if the loss fell on every rank and the parameter checksums
agree across ranks. The communication backend is DeepSpeed's choice for the accelerator
(gloo on CPU, NCCL on CUDA, HCCL on Gaudi). A collective that hangs ends at --dist-timeout.

This file runs on the nodes with the cluster venv; it imports nothing from dscluster.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import socket
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--report", required=True, help="JSON report written by rank 0")
    parser.add_argument("--launch-time", type=float, default=0.0, help="epoch seconds of launch")
    parser.add_argument("--dist-timeout", type=int, default=120, help="seconds per collective")
    parser.add_argument(
        "--allreduce-mb", default="1,8,32", help="all-reduce sizes in MiB, comma-separated"
    )
    parser.add_argument("--allreduce-iters", type=int, default=5)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    return parser.parse_args(argv)


def build_model(torch):
    torch.manual_seed(1234)  # same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 16),
    )


def make_batches(torch, rank: int, device, count: int = 8, batch: int = 32):
    # A fixed teacher (same on every rank) and rank-specific inputs: the ranks see different
    # data, so agreeing checksums prove the gradients really were reduced across ranks.
    teacher = torch.Generator().manual_seed(42)
    a = torch.randn(64, 32, generator=teacher)
    b = torch.randn(32, 16, generator=teacher)
    gen = torch.Generator().manual_seed(1000 + rank)
    batches = []
    for _ in range(count):
        x = torch.randn(batch, 64, generator=gen)
        y = torch.tanh(x @ a) @ b
        batches.append((x.to(device), y.to(device)))
    return batches


def param_checksum(torch, deepspeed, engine, zero: int) -> str:
    params = list(engine.module.parameters())
    digest = hashlib.sha256()
    if zero == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            for p in params:
                digest.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    else:
        for p in params:
            digest.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def allreduce_bench(torch, dist, *, device, sync, sizes_mb: list[float], iters: int) -> list[dict]:
    world = dist.get_world_size()
    results = []
    for mb in sizes_mb:
        numel = int(mb * (1 << 20)) // 4
        tensor = torch.ones(numel, dtype=torch.float32, device=device)
        for _ in range(2):  # warm-up
            dist.all_reduce(tensor)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor)
        sync()
        dist.barrier()
        elapsed = (time.perf_counter() - start) / iters
        nbytes = numel * 4
        algbw = nbytes / elapsed / 1e9
        results.append(
            {
                "bytes": nbytes,
                "time_s": elapsed,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (world - 1) / world if world > 1 else algbw,
            }
        )
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import deepspeed  # noqa: PLC0415 - heavy imports after argument parsing
    import torch  # noqa: PLC0415
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

    started = time.time()
    accel = get_accelerator()
    deepspeed.init_distributed(timeout=dt.timedelta(seconds=args.dist_timeout))
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    if accel.device_name() != "cpu":
        accel.set_device(args.local_rank)

    config = {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-3}},
        "zero_optimization": {"stage": args.zero},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if accel.is_bf16_supported() and accel.device_name() != "cpu":
        config["bf16"] = {"enabled": True}

    model = build_model(torch)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    batches = make_batches(torch, rank, engine.device)
    dtype = next(engine.module.parameters()).dtype
    losses, step_times = [], []
    first_step_at = None
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y.float())
        engine.backward(loss)
        engine.step()
        step_times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach().cpu()))
        if first_step_at is None:
            first_step_at = time.time()

    checksum = param_checksum(torch, deepspeed, engine, args.zero)
    bench = allreduce_bench(
        torch,
        dist,
        device=engine.device,
        sync=accel.synchronize,
        sizes_mb=[float(s) for s in args.allreduce_mb.split(",") if s],
        iters=args.allreduce_iters,
    )
    window = max(1, min(5, len(losses) // 4))
    mine = {
        "rank": rank,
        "local_rank": args.local_rank,
        "host": socket.gethostname(),
        "device": str(engine.device),
        "first_loss": sum(losses[:window]) / window,
        "last_loss": sum(losses[-window:]) / window,
        "checksum": checksum,
        "mean_step_s": sum(step_times[1:]) / max(1, len(step_times) - 1),
        "first_step_s": (first_step_at - args.launch_time) if args.launch_time else None,
        "init_s": first_step_at - started,
    }
    mine["loss_decreased"] = mine["last_loss"] < mine["first_loss"]
    gathered: list[dict | None] = [None] * world
    dist.all_gather_object(gathered, mine)
    ranks = sorted((r for r in gathered if r), key=lambda r: r["rank"])
    checksums = {r["checksum"] for r in ranks}
    checks = {
        "all_ranks_reported": len(ranks) == world,
        "loss_decreased_on_every_rank": all(r["loss_decreased"] for r in ranks),
        "checksums_agree": len(checksums) == 1,
    }
    ok = all(checks.values())
    if rank == 0:
        import deepspeed.git_version_info as info  # noqa: PLC0415

        report = {
            "ok": ok,
            "checks": checks,
            "world_size": world,
            "zero_stage": args.zero,
            "backend": dist.get_backend(),
            "accelerator": accel.device_name(),
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "installed_ops": sorted(k for k, v in info.installed_ops.items() if v),
            "steps": args.steps,
            "ranks": ranks,
            "allreduce": bench,
        }
        tmp = f"{args.report}.tmp.{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump(report, fh, indent=2, sort_keys=True)
        os.replace(tmp, args.report)
    dist.barrier()
    dist.destroy_process_group()
    if not ok and rank == 0:
        print(f"smoke job failed: {checks}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

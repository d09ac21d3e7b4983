"""The smoke job's training: one configuration with a fresh DeepSpeed engine on a small model,
each rank on its own data, with the parameter checksum, the live engine's state and (with a
checkpoint directory) a save/load round trip.

Staged beside smoke_job.py and imported there as a top-level module; torch and deepspeed are
passed in (imported after argument parsing).
"""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:  # dscluster.jobs.smoke_train: imported by dscluster's tests
    from . import smoke_checks
else:  # on the nodes: a file of the job directory (sys.path[0]), no dscluster there
    import smoke_checks


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


def run_config(torch, deepspeed, accel, *, entry: dict, args, rank: int) -> dict:
    """Train one configuration with a fresh engine; every rank returns its own summary."""
    stage, offload = entry["zero_stage"], entry["offload"]
    nvme_dir = os.path.join(args.nvme_dir, entry["name"].replace("+", "-"))
    if offload == "nvme":
        smoke_checks.private_dir(args.nvme_dir)
        os.makedirs(nvme_dir, exist_ok=True)
    if entry.get("config"):
        config = smoke_checks.with_nvme_dir(entry["config"], nvme_dir)
    else:
        bf16 = accel.is_bf16_supported() and accel.device_name() != "cpu"
        config = smoke_checks.ds_config(stage, offload, nvme_dir, bf16=bf16)
    started = time.time()
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
    checksum = param_checksum(torch, deepspeed, engine, stage)
    device = str(engine.device)
    active = engine_state(engine)
    restored = None
    if args.checkpoint_dir:
        restored = checkpoint_roundtrip(torch, deepspeed, engine, stage, args.checkpoint_dir)
    engine.destroy()
    del engine, model
    gc.collect()
    window = max(1, min(5, len(losses) // 4))
    mine = {
        "rank": rank,
        "local_rank": args.local_rank,
        "host": socket.gethostname(),
        "device": device,
        "engine": active,
        "first_loss": sum(losses[:window]) / window,
        "last_loss": sum(losses[-window:]) / window,
        "checksum": checksum,
        "mean_step_s": sum(step_times[1:]) / max(1, len(step_times) - 1),
        "init_s": (first_step_at or time.time()) - started,
        "_first_step_at": first_step_at,
    }
    mine["loss_decreased"] = mine["last_loss"] < mine["first_loss"]
    if restored is not None:
        mine["checkpoint"] = restored
    return mine


def checkpoint_roundtrip(torch, deepspeed, engine, stage: int, root: str) -> dict:
    """Save a checkpoint under root with the config's checkpoint settings (shared directory,
    or node-local with use_node_local_storage), change the weights, load it back and compare.
    The directory is removed afterwards by one rank per node (node-local) or rank 0."""
    dist = torch.distributed
    before = param_checksum(torch, deepspeed, engine, stage)
    t0 = time.perf_counter()
    engine.save_checkpoint(root, tag="smoke")
    saved_s = time.perf_counter() - t0
    params = list(engine.module.parameters())
    with torch.no_grad():
        if stage == 3:
            # Partitioned (maybe offloaded) parameters: change them through a gather.
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                if dist.get_rank() == 0:
                    for p in params:
                        p.add_(1.0)
        else:
            for p in params:
                p.add_(1.0)
    changed = param_checksum(torch, deepspeed, engine, stage)
    load_path, _ = engine.load_checkpoint(root, tag="smoke")
    after = param_checksum(torch, deepspeed, engine, stage)
    dist.barrier()
    local = bool(getattr(engine, "use_node_local_storage", lambda: False)())
    files = sorted(os.listdir(os.path.join(root, "smoke"))) if os.path.isdir(root) else []
    dist.barrier()
    if (local and int(os.environ.get("LOCAL_RANK", "0")) == 0) or dist.get_rank() == 0:
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    return {
        "dir": root,
        "node_local": local,
        "files_here": len(files),
        "loaded": load_path is not None,
        "restored": after == before and changed != before,
        "save_s": saved_s,
    }


def engine_state(engine) -> dict:
    """What the live engine really does (not what was asked): its ZeRO stage, optimizer
    class and where ZeRO keeps optimizer state and parameters."""
    zero_opt = engine.optimizer
    state = {
        "zero_stage": engine.zero_optimization_stage(),
        "optimizer": type(engine.basic_optimizer).__name__,
        "zero_optimizer": type(zero_opt).__name__,
        # stage 1/2: cpu_offload; stage 3: offload_optimizer/swap_optimizer/offload_param
        "optimizer_offload": bool(
            getattr(zero_opt, "cpu_offload", False) or getattr(zero_opt, "offload_optimizer", False)
        ),
        "optimizer_swap_nvme": bool(getattr(zero_opt, "swap_optimizer", False)),
        "param_offload": bool(getattr(zero_opt, "offload_param", False)),
        "param_swap_nvme": bool(getattr(zero_opt, "params_in_nvme_and_cpu", False)),
    }
    return state

#!/usr/bin/env python3
"""dscluster smoke job: a real DeepSpeed engine across every slot, with checks and a report.

Started by the launcher on every rank. First a pairwise bandwidth pass: for every pair of
nodes, one rank on each sends to the other and back (the other ranks wait), giving a node x
node GB/s matrix. Then, for each configuration of the matrix (--zero stages, each without
offload and with --offload where DeepSpeed allows it), each rank trains the same small model
with a fresh DeepSpeed engine on its own data and the ranks exchange what they saw. Rank 0
writes the report (after every configuration, so a later crash keeps the earlier results).
After them a second bandwidth pass (each direction keeps its faster); if the straggler rules
would name a link or node, every direction is measured again, for longer, before the report can.
Every rank exits 0 only if, in every configuration that ran, the loss fell on every rank and
the parameter checksums agree across ranks. The communication backend is DeepSpeed's choice
for the accelerator (gloo on CPU, NCCL on CUDA, HCCL on Gaudi). A collective that hangs ends at
--dist-timeout.

This file runs on the nodes with the cluster venv; it imports nothing from dscluster (the
pure functions here are also imported by dscluster's unit tests).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import hashlib
import json
import math
import os
import shutil
import socket
import stat
import statistics
import sys
import tempfile
import time
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

STAGES = (0, 1, 2, 3)
OFFLOADS = ("none", "cpu", "nvme")


def stage_list(text: str) -> list[int]:
    """`1,2,3` -> [1, 2, 3] (order kept, repeats dropped)."""
    stages: list[int] = []
    for part in text.split(","):
        stage = int(part)
        if stage not in STAGES:
            raise argparse.ArgumentTypeError(f"{stage} is not a ZeRO stage")
        if stage not in stages:
            stages.append(stage)
    return stages


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero", type=stage_list, default=[2], help="ZeRO stages, e.g. 1,2,3")
    parser.add_argument("--offload", choices=OFFLOADS, default="none")
    parser.add_argument(
        "--nvme-dir",
        default=os.path.join(tempfile.gettempdir(), f"dscluster-nvme-{os.getuid()}"),
        help="node-local directory for NVMe offload (default: a private one of this user's)",
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--ds-config",
        default="",
        help="run this DeepSpeed config file (dscluster dsconfig) instead of the ZeRO matrix",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default="",
        help="with --ds-config: save a checkpoint here, load it back and compare the weights",
    )
    parser.add_argument("--report", required=True, help="JSON report written by rank 0")
    parser.add_argument("--launch-time", type=float, default=0.0, help="epoch seconds of launch")
    parser.add_argument("--dist-timeout", type=int, default=120, help="seconds per collective")
    parser.add_argument(
        "--allreduce-mb", default="1,8,32", help="all-reduce sizes in MiB, comma-separated"
    )
    parser.add_argument("--allreduce-iters", type=int, default=5)
    parser.add_argument("--p2p-mb", type=float, default=8.0, help="point-to-point message MiB")
    parser.add_argument("--p2p-iters", type=int, default=5, help="timed messages per direction")
    parser.add_argument(
        "--straggler-factor",
        type=float,
        default=2.0,
        help="a link or node below the median / this is a straggler (measured again first)",
    )
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    return parser.parse_args(argv)


# --- pure: the configuration matrix -----------------------------------------------------------


def config_name(stage: int, offload: str) -> str:
    return f"zero{stage}" + ("" if offload == "none" else f"+{offload}")


def plan_configs(stages: list[int], offload: str, aio: dict[str, dict] | None = None) -> list[dict]:
    """The configurations to run, in order, each {name, zero_stage, offload, skip}.

    Each stage runs without offload; with --offload it runs again with the offload where
    DeepSpeed allows it, else it is listed with `skip` saying why:
    - any offload needs ZeRO (stage >= 1): stage 0 has no ZeRO optimizer to offload from;
    - NVMe needs ZeRO-3: only stage 3 swaps optimizer state and parameters to NVMe
      (deepspeed/runtime/zero/stage3.py `_configure_tensor_swapping`); the stage 1/2
      optimizer takes device "nvme" as plain CPU offload (stage_1_and_2.py `cpu_offload`),
      and `offload_param` is ZeRO-3 only;
    - NVMe needs the async_io op usable on every node: aio maps host -> {usable, reason}.
    """
    configs = []
    for stage in stages:
        configs.append({"name": config_name(stage, "none"), "zero_stage": stage, "offload": "none"})
        if offload == "none":
            continue
        skip = ""
        if stage == 0:
            skip = f"{offload} offload needs ZeRO stage 1, 2 or 3"
        elif offload == "nvme" and stage != 3:
            skip = (
                "NVMe offload needs ZeRO-3 (DeepSpeed's stage 1/2 optimizer treats device "
                "nvme as cpu; offload_param is ZeRO-3 only)"
            )
        elif offload == "nvme":
            skip = async_io_skip(aio)
        entry = {"name": config_name(stage, offload), "zero_stage": stage, "offload": offload}
        if skip:
            entry["skip"] = skip
        configs.append(entry)
    return configs


def file_entry(path: str, config: dict) -> dict:
    """The one configuration of a --ds-config run, named after the file."""
    zero = config.get("zero_optimization") or {}
    keys = ("offload_optimizer", "offload_param")
    devices = {(zero.get(key) or {}).get("device", "none") for key in keys}
    offload = "nvme" if "nvme" in devices else "cpu" if "cpu" in devices else "none"
    return {
        "name": os.path.basename(path),
        "zero_stage": int(zero.get("stage", 0)),
        "offload": offload,
        "config": config,
    }


def with_nvme_dir(config: dict, nvme_dir: str) -> dict:
    """A copy of config whose NVMe offload swaps under nvme_dir (one directory per run)."""
    out = json.loads(json.dumps(config))
    zero = out.get("zero_optimization") or {}
    for key in ("offload_optimizer", "offload_param"):
        if (zero.get(key) or {}).get("device") == "nvme":
            zero[key]["nvme_path"] = nvme_dir
    return out


def async_io_skip(aio: dict[str, dict] | None) -> str:
    """Why NVMe offload cannot run ('' when async_io is usable on every node); nodes that
    fail for the same reason are named together."""
    if not aio:
        return "async_io op state unknown on the nodes"
    by_reason: dict[str, list[str]] = {}
    for host, state in aio.items():
        if not state.get("usable"):
            by_reason.setdefault(state.get("reason") or "unknown", []).append(host)
    return "; ".join(
        f"async_io op not usable on {', '.join(hosts)}: {reason}"
        for reason, hosts in by_reason.items()
    )


def ds_config(stage: int, offload: str, nvme_dir: str, *, bf16: bool) -> dict:
    """The DeepSpeed config of one configuration (small buffers: the model is tiny)."""
    zero: dict = {"stage": stage}
    if stage == 3:
        # Partition every parameter (the default keeps tensors below 1e5 elements whole,
        # which is all of this model's).
        zero["stage3_param_persistence_threshold"] = 0
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    elif offload == "nvme":
        zero["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": nvme_dir,
            "pin_memory": False,
            "buffer_count": 4,
        }
        zero["offload_param"] = {
            "device": "nvme",
            "nvme_path": nvme_dir,
            "pin_memory": False,
            "buffer_count": 5,
            "buffer_size": 1 << 16,  # >= the largest parameter (256 x 256); under memlock
            "max_in_cpu": 0,
        }
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-3}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if bf16:
        config["bf16"] = {"enabled": True}
    return config


def node_leaders(hosts_by_rank: list[str]) -> tuple[list[str], list[int]]:
    """(hosts in order of their first rank, the lowest rank on each)."""
    hosts: list[str] = []
    leaders: list[int] = []
    for rank, host in enumerate(hosts_by_rank):
        if host not in hosts:
            hosts.append(host)
            leaders.append(rank)
    return hosts, leaders


# --- the job's parts (torch, deepspeed passed in: imported after argument parsing) -----------


def async_io_state(accel, installed_ops: dict, built_for: str) -> dict:
    """Whether this node can run DeepSpeed's async_io op without compiling it at launch
    (DeepSpeed JIT-compiles an op not pre-built for this accelerator: minutes per node)."""
    try:
        builder = accel.create_op_builder("AsyncIOBuilder")
    except Exception as exc:  # an accelerator without the op
        builder, why = None, f": {exc}"
    else:
        why = ""
    if builder is None or getattr(builder, "name", "") != "async_io":
        return {"usable": False, "reason": f"no async_io op for {accel.device_name()}{why}"}
    if not installed_ops.get("async_io") or built_for != accel._name:
        compatible = builder.is_compatible(verbose=False)
        return {
            "usable": False,
            "reason": f"async_io is not pre-built for {accel._name} in the installed DeepSpeed"
            + (
                " (libaio is present: build the wheel with DS_BUILD_AIO=1)"
                if compatible
                else " and libaio-dev is missing"
            ),
        }
    try:
        builder.load(verbose=False)
    except Exception as exc:
        return {"usable": False, "reason": f"pre-built async_io fails to load: {exc}"[:300]}
    return {"usable": True, "reason": "pre-built"}


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


def p2p_bench(
    torch,
    dist,
    *,
    device,
    sync,
    leaders: list[int],
    nbytes: int,
    iters: int,
    directions: list[tuple[int, int, int]] | None = None,
) -> dict[str, float]:
    """Node x node point-to-point bandwidth, one pair at a time, both directions.

    Returns {"i,j": GB/s from node i to node j} for the pairs this rank sent on. Each timed
    message is acknowledged by a one-element reply, so the time is the sender's until the
    receiver has it all; the best of `iters` is kept (a slow link is slow every time,
    a busy moment of a shared machine is not). main() runs it twice, before and after the
    training configurations, and keeps each direction's faster pass (faster_pass); then
    measures every direction again, for longer, if a straggler would be named (recheck_plan),
    given here as `directions`: (node i, node j, timed messages), one direction at a time.
    """
    rank = dist.get_rank()
    payload = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    ack = torch.zeros(1, dtype=torch.float32, device=device)
    mine: dict[str, float] = {}

    def one_way(src: int, dst: int, key: str, iters: int = iters) -> None:
        if rank == src:
            dist.send(payload, dst)  # warm-up: the pair's connection is made here
            dist.recv(ack, dst)
            sync()
            best = float("inf")
            for _ in range(iters):
                t0 = time.perf_counter()
                dist.send(payload, dst)
                dist.recv(ack, dst)
                sync()
                best = min(best, time.perf_counter() - t0)
            mine[key] = payload.numel() * 4 / best / 1e9
        elif rank == dst:
            for _ in range(iters + 1):
                dist.recv(payload, src)
                dist.send(ack, src)
            sync()

    if directions is not None:
        for i, j, count in directions:
            one_way(leaders[i], leaders[j], f"{i},{j}", count)
            dist.barrier()
        return mine
    for i, a in enumerate(leaders):
        for j in range(i + 1, len(leaders)):
            b = leaders[j]
            one_way(a, b, f"{i},{j}")
            one_way(b, a, f"{j},{i}")
            dist.barrier()
    return mine


RECHECK_WINDOW_S = 1.0  # how long each direction is measured again, at most
RECHECK_BUDGET_S = 10.0  # ... and all of them together, however many
RECHECK_MAX_ITERS = 1024


def measured(gbps: list[list[float | None]]) -> list[tuple[int, int, float]]:
    """Every measured direction of a node x node matrix: (i, j, GB/s from node i to node j)."""
    return [(i, j, v) for i, row in enumerate(gbps) for j, v in enumerate(row) if i != j and v]


def suspects(gbps: list[list[float | None]], factor: float) -> list[tuple[int, int]]:
    """The directions below the fastest / factor. Whatever dscluster's straggler rules can
    name has such a direction (a slow link's slower one, a slow node's own); exactly at the
    boundary is not one, as there."""
    directions = measured(gbps)
    fastest = max((v for _, _, v in directions), default=0.0)
    return [(i, j) for i, j, v in directions if v < fastest / factor]


def link_bandwidths(
    hosts: Sequence[Hashable], gbps: Sequence[Sequence[float | None]]
) -> dict[tuple[Any, Any], float]:
    """Each measured link's bandwidth: the slower of its two directions (gbps[i][j] is
    node i -> node j). A link with a direction not measured is left out."""

    def at(i: int, j: int) -> float | None:
        return gbps[i][j] if i < len(gbps) and j < len(gbps[i]) else None

    links = {}
    for i, a in enumerate(hosts):
        for j in range(i + 1, len(hosts)):
            there, back = at(i, j), at(j, i)
            if there is not None and back is not None:
                links[(a, hosts[j])] = min(there, back)
    return links


class SlowBandwidth(NamedTuple):
    """What the bandwidth rules name (bandwidth_stragglers), with the medians they used."""

    nodes: list[tuple[Any, float]]  # (host, its median link GB/s)
    node_median: float
    links: list[tuple[tuple[Any, Any], float]]  # ((host, host), the link's GB/s)
    link_median: float


def bandwidth_stragglers(
    hosts: Sequence[Hashable], gbps: Sequence[Sequence[float | None]], factor: float
) -> SlowBandwidth:
    """The straggler rules on bandwidth (dscluster.smoke.stragglers.find_stragglers reports
    what they name; the job asks them before measuring again):

    - a node whose median link bandwidth is below the median of the nodes' medians / factor;
    - a link whose bandwidth is below the median link bandwidth / factor, unless one of its
      nodes is a bandwidth straggler already (that node's line names the cause: one slow
      NIC slows every link it is on, and those are not reported once more each).
    Exactly at the threshold is not a straggler. With two nodes every measure is shared by
    both (one link): nothing is named."""
    links = link_bandwidths(hosts, gbps)
    if not links:
        return SlowBandwidth([], 0.0, [], 0.0)
    per_node = {
        host: statistics.median(bw for pair, bw in links.items() if host in pair)
        for host in hosts
        if any(host in pair for pair in links)
    }
    node_median = statistics.median(per_node.values())
    nodes = [(host, bw) for host, bw in per_node.items() if bw < node_median / factor]
    explained = {host for host, _ in nodes}
    link_median = statistics.median(links.values())
    slow_links = [
        (pair, bw)
        for pair, bw in links.items()
        if bw < link_median / factor and not explained & set(pair)
    ]
    return SlowBandwidth(nodes, node_median, slow_links, link_median)


def recheck_plan(
    gbps: list[list[float | None]],
    *,
    factor: float,
    nbytes: int,
    iters: int,
    window_s: float = RECHECK_WINDOW_S,
    budget_s: float = RECHECK_BUDGET_S,
) -> list[tuple[int, int, int]]:
    """What to measure again before any direction is called slow: (i, j, timed messages).

    A pass measures a direction for a few milliseconds (5 messages of 8 MiB); on a shared,
    busy host both passes can land in moments when a rank waits for a core. Nothing to do
    while the straggler rules name nothing (bandwidth_stragglers): measuring again only
    raises figures, and the report names only what they name. A direction below the fastest
    / factor alone (a suspect) is not enough: about one 3-node run in five on a 2-core host
    had one with nothing to name, and its recheck cost the job some 10 CPU-seconds of
    full-speed messages. Otherwise every direction is measured again (the suspects
    and the ones they are compared with, alike: the best of more messages is faster, so
    the suspects alone would be judged against shorter measurements), each with as many
    messages as fill the same time at the speed it showed: `window_s`, or `budget_s` shared
    among them (at least `iters`, at most RECHECK_MAX_ITERS). A rate-limited direction is slow
    in every message and costs `iters` of them. Every rank computes the same plan from the
    same gathered matrix (the ranks must agree on it)."""
    slow = bandwidth_stragglers(range(len(gbps)), gbps, factor)
    if not (slow.nodes or slow.links):
        return []
    directions = measured(gbps)
    window = min(window_s, budget_s / len(directions))
    return [
        (i, j, max(iters, min(RECHECK_MAX_ITERS, math.ceil(window * v * 1e9 / nbytes))))
        for i, j, v in directions
    ]


def faster_pass(
    first: list[list[float | None]], second: list[list[float | None]]
) -> list[list[float | None]]:
    """Each direction's faster of two passes (GB/s, None where a pass did not measure it).

    The passes are minutes apart (the training configurations run between them): a link
    slowed for a while by other work on a shared host is fast in one of them, a slow link
    (a bad cable, a rate limit, the wrong NIC) is slow in both."""
    return [
        [
            max((v for v in (a, b) if v is not None), default=None)
            for a, b in zip(ra, rb, strict=True)
        ]
        for ra, rb in zip(first, second, strict=True)
    ]


def private_dir(path: str) -> None:
    """Make `path` this user's own (0700) where it is missing; refuse one that is a link or
    another user's: the default lies in a /tmp every local user can write to first."""
    parent = os.path.dirname(path.rstrip("/"))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    link = stat.S_ISLNK(st.st_mode)
    if link or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        what = "a symbolic link" if link else f"not a directory of this user's (uid {st.st_uid})"
        raise SystemExit(
            f"--nvme-dir {path} is {what}; remove it or pass --nvme-dir with a directory of "
            "your own"
        )


def run_config(torch, deepspeed, accel, *, entry: dict, args, rank: int) -> dict:
    """Train one configuration with a fresh engine; every rank returns its own summary."""
    stage, offload = entry["zero_stage"], entry["offload"]
    nvme_dir = os.path.join(args.nvme_dir, entry["name"].replace("+", "-"))
    if offload == "nvme":
        private_dir(args.nvme_dir)
        os.makedirs(nvme_dir, exist_ok=True)
    if entry.get("config"):
        config = with_nvme_dir(entry["config"], nvme_dir)
    else:
        bf16 = accel.is_bf16_supported() and accel.device_name() != "cpu"
        config = ds_config(stage, offload, nvme_dir, bf16=bf16)
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


def write_report(path: str, report: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(report, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import deepspeed  # noqa: PLC0415 - heavy imports after argument parsing
    import deepspeed.git_version_info as info  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

    accel = get_accelerator()
    deepspeed.init_distributed(timeout=dt.timedelta(seconds=args.dist_timeout))
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    if accel.device_name() != "cpu":
        accel.set_device(args.local_rank)
    device = accel.current_device_name()
    host = socket.gethostname()
    installed_ops = dict(info.installed_ops)

    # Who runs where, and (for NVMe offload) whether each node can use async_io.
    me: dict[str, Any] = {"host": host}
    if args.offload == "nvme":
        me["aio"] = async_io_state(accel, installed_ops, info.accelerator_name)
    everyone: list[dict | None] = [None] * world
    dist.all_gather_object(everyone, me)
    hosts_by_rank = [e["host"] if e else "?" for e in everyone]
    hosts, leaders = node_leaders(hosts_by_rank)
    aio = {e["host"]: e["aio"] for e in everyone if e and "aio" in e} or None

    nbytes = int(args.p2p_mb * (1 << 20))  # each p2p message

    def p2p_pass(directions=None) -> list[list[float | None]]:
        """Every rank's share of one p2p_bench pass, gathered into the node x node matrix."""
        mine = p2p_bench(
            torch,
            dist,
            device=device,
            sync=accel.synchronize,
            leaders=leaders,
            nbytes=nbytes,
            iters=args.p2p_iters,
            directions=directions,
        )
        parts: list[dict | None] = [None] * world
        dist.all_gather_object(parts, mine)
        gbps: list[list[float | None]] = [[None] * len(hosts) for _ in hosts]
        for part in parts:
            for key, value in (part or {}).items():
                i, j = (int(k) for k in key.split(","))
                gbps[i][j] = value
        return gbps

    matrix = p2p_pass()

    report = {
        "ok": False,
        "checks": {},
        "world_size": world,
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
        "p2p": {
            "hosts": hosts,
            "ranks": leaders,
            "bytes": nbytes // 4 * 4,
            "iters": args.p2p_iters,
            "passes": 1,
            "gbps": matrix,
        },
    }
    if aio is not None:
        report["aio"] = aio

    ok = True
    if args.ds_config:
        with open(args.ds_config) as fh:
            entries = [file_entry(args.ds_config, json.load(fh))]
        report["ds_config"] = os.path.basename(args.ds_config)
        report["zero_stage"] = entries[0]["zero_stage"]
        report["zero_stages"] = [entries[0]["zero_stage"]]
        report["offload"] = entries[0]["offload"]
    else:
        entries = plan_configs(args.zero, args.offload, aio)
    for entry in entries:
        result = dict(entry)
        if entry.get("skip"):
            result["status"] = "skipped"
            report["configs"].append(result)
            continue
        t0 = time.perf_counter()
        mine = run_config(torch, deepspeed, accel, entry=entry, args=args, rank=rank)
        gathered: list[dict | None] = [None] * world
        dist.all_gather_object(gathered, mine)
        ranks = sorted((r for r in gathered if r), key=lambda r: r["rank"])
        for r in ranks:
            at = r.pop("_first_step_at")
            r["first_step_s"] = (at - args.launch_time) if args.launch_time and at else None
        checks = {
            "all_ranks_reported": len(ranks) == world,
            "loss_decreased_on_every_rank": all(r["loss_decreased"] for r in ranks),
            "checksums_agree": len({r["checksum"] for r in ranks}) == 1,
        }
        if args.checkpoint_dir:
            checks["checkpoint_restored_on_every_rank"] = all(
                (r.get("checkpoint") or {}).get("restored") for r in ranks
            )
        result.pop("config", None)
        result.update(
            status="passed" if all(checks.values()) else "failed",
            ok=all(checks.values()),
            checks=checks,
            ranks=ranks,
            wall_s=time.perf_counter() - t0,
        )
        ok = ok and result["ok"]
        report["configs"].append(result)
        for name, passed in checks.items():
            report["checks"][name] = report["checks"].get(name, True) and passed
        if not report["ranks"]:
            report["ranks"] = ranks  # the first configuration's: today's per-rank table
        if rank == 0:
            write_report(args.report, report)

    # The second bandwidth pass, after the configurations: each direction keeps its faster.
    matrix = faster_pass(matrix, p2p_pass())
    # If the rules would name a straggler, all are measured again, longer, before one is named.
    plan = recheck_plan(
        matrix,
        factor=args.straggler_factor,
        nbytes=nbytes,
        iters=args.p2p_iters,
    )
    rechecked = []
    if plan:
        suspect = set(suspects(matrix, args.straggler_factor))
        again = p2p_pass(plan)
        rechecked = [
            {
                "from": hosts[i],
                "to": hosts[j],
                "suspect": (i, j) in suspect,
                "iters": count,
                "before_gbps": matrix[i][j],
                "again_gbps": again[i][j],
            }
            for i, j, count in plan
        ]
        matrix = faster_pass(matrix, again)
    report["p2p"].update(passes=2, gbps=matrix, rechecked=rechecked)
    report["allreduce"] = allreduce_bench(
        torch,
        dist,
        device=device,
        sync=accel.synchronize,
        sizes_mb=[float(s) for s in args.allreduce_mb.split(",") if s],
        iters=args.allreduce_iters,
    )
    report["checks"]["bandwidth_pass_complete"] = all(
        matrix[i][j] is not None for i in range(len(hosts)) for j in range(len(hosts)) if i != j
    )
    ok = ok and report["checks"]["bandwidth_pass_complete"] and bool(report["ranks"])
    report["ok"] = ok
    if rank == 0:
        write_report(args.report, report)
    dist.barrier()
    if report["offload"] == "nvme" and args.local_rank == 0:
        shutil.rmtree(args.nvme_dir, ignore_errors=True)
    dist.destroy_process_group()
    if not ok and rank == 0:
        print(f"smoke job failed: {report['checks']}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    # The report is written and the process group destroyed: leave without running C++
    # static destructors, which can race with the communication backend's threads at
    # interpreter exit ("terminate called without an active exception") and turn a passed
    # run into a failed exit status.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

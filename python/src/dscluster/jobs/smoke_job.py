#!/usr/bin/env python3
"""dscluster smoke job: a real DeepSpeed engine across every slot, with checks and a report.

Started by the launcher on every rank. First every rank's device benchmark at once (a matmul's
TFLOPS, a copy's GB/s) and the raw TCP throughput between nodes (smoke_device); then a pairwise
bandwidth pass: for every pair of nodes, one rank on each sends to the other and back (the other
ranks wait), giving a node x node GB/s matrix. Then, for each configuration of the matrix
(--zero stages, each without offload and with --offload where DeepSpeed allows it), each rank
trains the same small model with a fresh DeepSpeed engine on its own data and the ranks exchange
what they saw. Rank 0 writes the report (after every configuration, so a later crash keeps the
earlier results). After them a second device, TCP and bandwidth pass (each figure keeps its
better); if the straggler rules would name a link or node, every direction is measured again,
for longer, before the report can. Every rank exits 0 only if, in every configuration that ran,
the loss fell on every rank and the parameter checksums agree across ranks. The communication
backend is DeepSpeed's choice for the accelerator (gloo on CPU, NCCL on CUDA, HCCL on Gaudi). A
collective that hangs ends at --dist-timeout.

This file is the entry point (the arguments and the flow); its sibling modules, staged beside it
in the job directory (dscluster.jobs.SMOKE_JOB_FILES) and imported as top-level modules from
there, hold the rest: smoke_checks (the matrix, the checks, the straggler rules), smoke_bench
(the communication benchmarks), smoke_device (the device benchmark, raw TCP), smoke_train (one
configuration's training) and smoke_report (the report). They run on the nodes with the cluster
venv and import nothing from dscluster (their pure functions are also imported by dscluster and
its unit tests).
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # dscluster.jobs.smoke_job: imported by dscluster's tests
    from . import smoke_bench, smoke_checks, smoke_device, smoke_report, smoke_train
else:  # on the nodes: files of the job directory (sys.path[0]), no dscluster there
    import smoke_bench
    import smoke_checks
    import smoke_device
    import smoke_report
    import smoke_train


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
    parser.add_argument(
        "--device-bench-s",
        type=float,
        default=smoke_device.DEFAULT_SECONDS,
        help="timed seconds per device figure (matmul, copy) on every rank at once; 0 skips",
    )
    parser.add_argument(
        "--device-bench-scale", type=float, default=1.0, help="multiply the benchmark's sizes"
    )
    parser.add_argument(
        "--tcp-mb",
        type=float,
        default=None,
        help="raw TCP message MiB between node leaders, timed as the point-to-point pass times "
        "its messages (the fabric's ceiling where no published figure applies; default: "
        "--p2p-mb); 0 skips",
    )
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "0")))
    return parser.parse_args(argv)


def planned(args, report: dict, aio: dict | None) -> list[dict]:
    """The configurations to run: the --ds-config file's one (named in the report, whose ZeRO
    stage and offload become the file's), else the matrix of --zero x --offload."""
    if not args.ds_config:
        return smoke_checks.plan_configs(args.zero, args.offload, aio)
    with open(args.ds_config) as fh:
        entry = smoke_checks.file_entry(args.ds_config, json.load(fh))
    report["ds_config"] = os.path.basename(args.ds_config)
    report["zero_stage"] = entry["zero_stage"]
    report["zero_stages"] = [entry["zero_stage"]]
    report["offload"] = entry["offload"]
    return [entry]


def placement(
    args, dist, accel, installed_ops: dict, built_for: str
) -> tuple[list[str], list[int], dict[str, dict] | None]:
    """Who runs where (hosts in order of their first rank, the lowest rank on each), and for
    NVMe offload whether each node can use async_io (host -> {usable, reason}; else None)."""
    me: dict[str, Any] = {"host": socket.gethostname()}
    if args.offload == "nvme":
        me["aio"] = smoke_checks.async_io_state(accel, installed_ops, built_for)
    everyone: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    hosts_by_rank = [e["host"] if e else "?" for e in everyone]
    hosts, leaders = smoke_checks.node_leaders(hosts_by_rank)
    aio = {e["host"]: e["aio"] for e in everyone if e and "aio" in e} or None
    return hosts, leaders, aio


def device_and_tcp(args, torch, dist, accel, *, device, leaders: list[int]) -> dict:
    """Before anything else loads the nodes: every rank's device benchmark at once, then the
    raw TCP pass between node leaders. Returns the report's device_bench and tcp sections
    (each left out when skipped)."""
    out: dict[str, Any] = {}
    if args.device_bench_s > 0:
        t0 = time.perf_counter()
        devices = device_pass(args, torch, dist, accel, device=device)
        out["device_bench"] = {
            "seconds": args.device_bench_s,
            "scale": args.device_bench_scale,
            "passes": 1,
            "devices": devices,
            "wall_s": round(time.perf_counter() - t0, 3),  # what the pass costs the job
        }
    t0 = time.perf_counter()
    tcp = tcp_pass(args, dist, leaders)
    if tcp is not None:
        out["tcp"] = {**tcp, "wall_s": round(time.perf_counter() - t0, 3)}
    return out


def device_pass(args, torch, dist, accel, *, device) -> list[dict]:
    """Every rank's device benchmark at once (smoke_device.device_bench), gathered in rank
    order: host, rank and local rank with each figure, or the error that stopped it."""
    dist.barrier()  # all ranks at once: each device's figures against its peers'
    try:
        mine = smoke_device.device_bench(
            torch,
            device=device,
            sync=accel.synchronize,
            seconds=args.device_bench_s,
            scale=args.device_bench_scale,
        )
    except Exception as exc:  # out of memory, say: reported, and the ranks go on together
        mine = {"device": str(device), "error": f"{type(exc).__name__}: {exc}"[:300]}
    mine.update(rank=dist.get_rank(), local_rank=args.local_rank, host=socket.gethostname())
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return sorted((d for d in gathered if d), key=lambda d: d["rank"])


def second_device_and_tcp(args, torch, dist, accel, report: dict, *, device, leaders) -> None:
    """The second device and TCP passes, after the configurations: each figure keeps its
    better, as the point-to-point passes do (a busy moment passes, a slow device stays)."""
    if "device_bench" in report:
        t0 = time.perf_counter()
        again = device_pass(args, torch, dist, accel, device=device)
        devices = smoke_device.better_pass(report["device_bench"]["devices"], again)
        wall = report["device_bench"]["wall_s"] + time.perf_counter() - t0
        report["device_bench"].update(passes=2, devices=devices, wall_s=round(wall, 3))
    if "tcp" in report:
        t0, spent = time.perf_counter(), report["tcp"]["wall_s"]
        report["tcp"] = tcp_pass(args, dist, leaders, first=report["tcp"])
        report["tcp"]["wall_s"] = round(spent + time.perf_counter() - t0, 3)


def tcp_pass(args, dist, leaders: list[int], first: dict | None = None) -> dict | None:
    """One raw TCP pass between node leaders, timed as the point-to-point pass times its
    messages (None when skipped). With `first`, the pass after the configurations: each
    direction keeps its faster, as the point-to-point passes do, so both sides of a grade are
    the best of the same two moments."""
    tcp_mb = args.p2p_mb if args.tcp_mb is None else args.tcp_mb
    if tcp_mb <= 0 or len(leaders) < 2:
        return None
    tcp_bytes = int(tcp_mb * (1 << 20))
    matrix, errors = smoke_device.tcp_pass(
        dist,
        leaders=leaders,
        toward=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        nbytes=tcp_bytes,
        iters=args.p2p_iters,
    )
    if first is None:
        return {"bytes": tcp_bytes, "iters": args.p2p_iters, "passes": 1, "gbps": matrix,
                "errors": errors}  # fmt: skip
    gbps = smoke_checks.faster_pass(first["gbps"], matrix)
    return {**first, "passes": 2, "gbps": gbps, "errors": first["errors"] + errors}


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
    installed_ops = dict(info.installed_ops)
    hosts, leaders, aio = placement(args, dist, accel, installed_ops, info.accelerator_name)

    benches = device_and_tcp(args, torch, dist, accel, device=device, leaders=leaders)

    nbytes = int(args.p2p_mb * (1 << 20))  # each p2p message
    # One p2p_bench pass of every rank, gathered into the node x node matrix.
    p2p_pass = functools.partial(
        smoke_bench.p2p_pass,
        torch,
        dist,
        device=device,
        sync=accel.synchronize,
        leaders=leaders,
        nbytes=nbytes,
        iters=args.p2p_iters,
    )
    matrix = p2p_pass()

    p2p = {
        "hosts": hosts,
        "ranks": leaders,
        "bytes": nbytes // 4 * 4,
        "iters": args.p2p_iters,
        "passes": 1,
        "gbps": matrix,
    }
    report = smoke_report.new_report(
        args, torch, deepspeed, accel, installed_ops=installed_ops, p2p=p2p, aio=aio
    )
    report.update(benches)  # device_bench, tcp

    ok = True
    for entry in planned(args, report, aio):
        if entry.get("skip"):
            smoke_report.add_skipped(report, entry)
            continue
        t0 = time.perf_counter()
        mine = smoke_train.run_config(torch, deepspeed, accel, entry=entry, args=args, rank=rank)
        gathered: list[dict | None] = [None] * world
        dist.all_gather_object(gathered, mine)
        result = smoke_report.add_config(report, entry, gathered, args=args, started=t0)
        ok = ok and result["ok"]
        if rank == 0:
            smoke_report.write_report(args.report, report)

    second_device_and_tcp(args, torch, dist, accel, report, device=device, leaders=leaders)
    # The second bandwidth pass, after the configurations: each direction keeps its faster;
    # if the rules would name a straggler, all are measured again, longer, before one is named.
    matrix, rechecked = smoke_bench.second_pass(
        p2p_pass,
        matrix,
        hosts=hosts,
        factor=args.straggler_factor,
        nbytes=nbytes,
        iters=args.p2p_iters,
    )
    report["p2p"].update(passes=2, gbps=matrix, rechecked=rechecked)
    report["allreduce"] = smoke_bench.allreduce_bench(
        torch,
        dist,
        device=device,
        sync=accel.synchronize,
        sizes_mb=[float(s) for s in args.allreduce_mb.split(",") if s],
        iters=args.allreduce_iters,
    )
    ok = smoke_report.finish(report, ok)
    if rank == 0:
        smoke_report.write_report(args.report, report)
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

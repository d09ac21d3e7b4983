"""The smoke job's communication benchmarks: all-reduce bus bandwidth, and the node x node
point-to-point passes, measured again where the straggler rules would name something.

Staged beside smoke_job.py and imported there as a top-level module; torch and the process
group are passed in (imported after argument parsing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:  # dscluster.jobs.smoke_bench: imported by dscluster's tests
    from . import smoke_checks
else:  # on the nodes: a file of the job directory (sys.path[0]), no dscluster there
    import smoke_checks

Matrix = list[list[float | None]]


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
    a busy moment of a shared machine is not). The job runs it twice (p2p_pass), before and
    after the training configurations, and keeps each direction's faster pass (second_pass,
    smoke_checks.faster_pass); then measures every direction again, for longer, if a straggler
    would be named (smoke_checks.recheck_plan), given here as `directions`: (node i, node j,
    timed messages), one direction at a time.
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


def p2p_pass(torch, dist, *, leaders: list[int], **measure: Any) -> Matrix:
    """Every rank's share of one p2p_bench pass (`measure`: its device, sync, nbytes, iters
    and directions), gathered into the node x node matrix."""
    mine = p2p_bench(torch, dist, leaders=leaders, **measure)
    parts: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    gbps: Matrix = [[None] * len(leaders) for _ in leaders]
    for part in parts:
        for key, value in (part or {}).items():
            i, j = (int(k) for k in key.split(","))
            gbps[i][j] = value
    return gbps


def second_pass(
    p2p: Callable[..., Matrix],
    first: Matrix,
    *,
    hosts: list[str],
    factor: float,
    nbytes: int,
    iters: int,
) -> tuple[Matrix, list[dict]]:
    """The second bandwidth pass (`p2p`: p2p_pass with its measure given), after the
    configurations: each direction keeps its faster. If the rules would name a straggler, all
    are measured again, longer, before one is named. Returns (the matrix, what was measured
    again: from, to, suspect, iters, before_gbps, again_gbps per direction)."""
    matrix = smoke_checks.faster_pass(first, p2p())
    plan = smoke_checks.recheck_plan(matrix, factor=factor, nbytes=nbytes, iters=iters)
    if not plan:
        return matrix, []
    suspect = set(smoke_checks.suspects(matrix, factor))
    again = p2p(directions=plan)
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
    return smoke_checks.faster_pass(matrix, again), rechecked

#!/usr/bin/env python3
"""The smoke job's per-device benchmark and raw TCP pass.

- device_bench: a matmul (TFLOPS) and a memory copy (GB/s) timed on this rank's device, on
  every rank at once (the job calls it between barriers, before and after the training
  configurations, and keeps each figure's better: better_pass), so a slow GPU, a throttled
  CPU or a node held to a fraction of its cores shows against its peers
  (dscluster.smoke.devices judges the gathered figures on the controller).
- tcp_pass: the raw TCP throughput between node leaders, one direction at a time, over plain
  sockets (no torch, no gloo framing): the ceiling smoke grades gloo/NCCL's point-to-point
  and all-reduce figures against where no published figure applies (a local cluster, plain
  Ethernet).

Staged beside smoke_job.py and imported there as a top-level module; torch and the process
group are passed in; stdlib otherwise. Run alone (`python smoke_device.py`) it prints this
device's figures as JSON: the same benchmark, for doctor-style use on one node.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

DEFAULT_SECONDS = 0.5  # timed seconds per figure (a warm-up before each is not counted)
# (matmul n, copy MiB) per device type: the CPU sizes take milliseconds per round on a core,
# the CUDA ones are big enough to keep a datacenter GPU's tensor cores and HBM busy.
SIZES = {"cpu": (512, 32), "cuda": (8192, 1024)}
OTHER_SIZES = (2048, 256)  # any other accelerator (hpu, xpu, ...)


def device_model(torch, device) -> str:
    """What the device is, as its peers of the same kind will name it too."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        try:
            with open("/proc/cpuinfo") as fh:
                for line in fh:
                    if line.startswith("model name"):
                        return "cpu: " + line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "cpu: " + (platform.processor() or platform.machine())
    return dev.type


def timed(step: Callable[[], None], sync: Callable[[], None], seconds: float) -> tuple[int, float]:
    """Run `step` once untimed (warm-up), then in doubling batches, each synchronized, until
    `seconds` have passed. Returns (rounds timed, seconds they took)."""
    step()
    sync()
    rounds, batch = 0, 1
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            step()
        sync()
        rounds += batch
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return rounds, elapsed
        batch = min(batch * 2, 64)


def device_bench(
    torch, *, device, sync: Callable[[], None], seconds: float = DEFAULT_SECONDS, scale: float = 1.0
) -> dict[str, Any]:
    """This rank's matmul TFLOPS (fp32 on CPU, bf16 on CUDA where supported, else fp16) and
    copy GB/s (a tensor's copy_ into another: bytes read plus bytes written, as STREAM's copy
    counts them). `scale` multiplies the sizes (matmul n and copy size)."""
    kind = torch.device(device).type
    base_n, base_mb = SIZES.get(kind, OTHER_SIZES)
    n, copy_mb = max(16, int(base_n * scale)), max(1.0, base_mb * scale)
    if kind == "cpu":
        dtype = torch.float32
    elif kind == "cuda" and torch.cuda.is_bf16_supported():
        dtype = torch.bfloat16
    else:
        dtype = torch.float16
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    rounds, elapsed = timed(lambda: torch.matmul(a, b, out=out), sync, seconds)
    tflops = 2 * n**3 * rounds / elapsed / 1e12
    numel = int(copy_mb * (1 << 20)) // 4
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    rounds, elapsed = timed(lambda: dst.copy_(src), sync, seconds)
    gbps = 2 * numel * 4 * rounds / elapsed / 1e9
    return {
        "device": device_model(torch, device),
        "device_type": kind,
        "matmul_tflops": tflops,
        "matmul_n": n,
        "matmul_dtype": str(dtype).removeprefix("torch."),
        "copy_gbps": gbps,
        "copy_bytes": numel * 4,
        "seconds": seconds,
    }


FIGURES = ("matmul_tflops", "copy_gbps")


def better_pass(first: list[dict], second: list[dict]) -> list[dict]:
    """Each rank's better figure of two device passes (matched by rank; a figure either pass
    lacks is the other's). The passes are minutes apart: a busy moment on a shared host is
    gone in one of them, a slow device is slow in both."""
    again = {d.get("rank"): d for d in second}
    out = []
    for d in first:
        merged = dict(d)
        other = again.get(d.get("rank")) or {}
        for key in FIGURES:
            values = [v for v in (d.get(key), other.get(key)) if isinstance(v, int | float)]
            if values:
                merged[key] = max(values)
        if "error" in d and any(key in merged for key in FIGURES):
            merged.pop("error")
        out.append(merged)
    return out


# --- raw TCP between node leaders --------------------------------------------------------------

CHUNK = 1 << 20


def local_address(toward: str) -> str:
    """The address this node reaches `toward` from (the master's address: the interface the
    job's traffic leaves by), found by routing a UDP socket there; nothing is sent."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((toward, 9))
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _recv_exactly(conn: socket.socket, view: memoryview, nbytes: int) -> None:
    got = 0
    while got < nbytes:
        n = conn.recv_into(view[: min(len(view), nbytes - got)])
        if n == 0:
            raise ConnectionError(f"the sender closed after {got} of {nbytes} bytes")
        got += n


def tcp_send(address: tuple[str, int], *, nbytes: int, iters: int, timeout: float) -> float:
    """Send `iters` + 1 messages of `nbytes` to a tcp_receive at `address`, each acknowledged
    by one byte; the first is a warm-up. Returns the best message's GB/s."""
    payload = memoryview(bytearray(min(nbytes, CHUNK)))
    best = float("inf")
    with socket.create_connection(address, timeout=timeout) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(iters + 1):
            start = time.perf_counter()
            left = nbytes
            while left > 0:
                conn.sendall(payload[: min(len(payload), left)])
                left -= min(len(payload), left)
            if conn.recv(1) != b"k":
                raise ConnectionError("no acknowledgement from the receiver")
            if i:
                best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def tcp_receive(listener: socket.socket, *, nbytes: int, iters: int) -> None:
    """The other end of tcp_send, on this node's listening socket."""
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(listener.gettimeout())
        view = memoryview(bytearray(CHUNK))
        for _ in range(iters + 1):
            _recv_exactly(conn, view, nbytes)
            conn.sendall(b"k")


def listen(toward: str, timeout: float) -> tuple[socket.socket | None, dict[str, Any]]:
    """A node leader's listening socket on an ephemeral port of the address it reaches
    `toward` from, and what the others need: {"listen": (address, port)} or {"error": ...}."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.settimeout(timeout)
        host = local_address(toward)
        listener.bind((host, 0))
        listener.listen(1)
    except OSError as exc:  # the others still meet this rank at the gather
        listener.close()
        return None, {"error": f"listen on {socket.gethostname()}: {exc}"[:300]}
    return listener, {"listen": (host, listener.getsockname()[1])}


def tcp_pass(
    dist,
    *,
    leaders: list[int],
    toward: str,
    nbytes: int,
    iters: int,
    timeout: float = 20.0,
) -> tuple[list[list[float | None]], list[str]]:
    """The node x node raw TCP matrix (GB/s from node i to node j, best of `iters`): every
    node leader listens (listen); then one direction at a time, the sender streams to the
    receiver while the other ranks wait at a barrier. Every rank takes part (the barriers and
    the gathers). Returns (the matrix, what failed, one line each: a firewall, say)."""
    rank = dist.get_rank()
    listener, mine = listen(toward, timeout) if rank in leaders else (None, {})
    everyone: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    addresses = [tuple((everyone[r] or {}).get("listen") or ("", 0)) for r in leaders]
    results: dict[str, float] = {}
    errors = [str(e["error"]) for e in everyone if e and "error" in e] if rank == 0 else []
    directions = [(i, j) for i in range(len(leaders)) for j in range(len(leaders)) if i != j]
    try:
        for i, j in directions:
            if not addresses[j][1]:  # the receiver could not listen: said above
                continue
            try:
                if rank == leaders[i]:
                    results[f"{i},{j}"] = tcp_send(
                        addresses[j], nbytes=nbytes, iters=iters, timeout=timeout
                    )
                elif rank == leaders[j] and listener is not None:
                    tcp_receive(listener, nbytes=nbytes, iters=iters)
            except OSError as exc:
                side = "send" if rank == leaders[i] else "receive"
                errors.append(f"{i},{j} {side} ({addresses[j][0]}): {exc}"[:300])
            dist.barrier()
    finally:
        if listener is not None:
            listener.close()
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"gbps": results, "errors": errors})
    matrix: list[list[float | None]] = [[None] * len(leaders) for _ in leaders]
    failed: list[str] = []
    for part in gathered:
        for key, value in (part or {}).get("gbps", {}).items():
            i, j = (int(k) for k in key.split(","))
            matrix[i][j] = value
        failed += (part or {}).get("errors", [])
    return matrix, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="this device's matmul TFLOPS and copy GB/s")
    parser.add_argument("--device", default="", help="cpu, cuda:0, ... (default: cuda:0 if any)")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the sizes")
    args = parser.parse_args(argv)
    import torch  # noqa: PLC0415 - after argument parsing

    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    figures = device_bench(torch, device=device, sync=sync, seconds=args.seconds, scale=args.scale)
    json.dump(figures, sys.stdout, indent=2, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

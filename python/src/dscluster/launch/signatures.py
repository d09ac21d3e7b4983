"""Known failure signatures: a failed job's log matched against what the libraries print for
the common causes, each with its fix in one sentence, and the node (and rank) it came from.

SIGNATURES is data: (name, pattern, help). The help is a str.format template over the
pattern's named groups. Each text is the libraries' own (the source named above it) and is
matched in the log excerpts of tests/unit/fixtures/signatures (SOURCES.md says where each
came from).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..jobs.launch_watch import lost_line
from .watch import WATCH_ENDED, split_prefix

# launch_watch.py's lines from which on the log shows its own ending of the job (the kills):
# a node lost or a rank failed, and the job's time limit.
ENDED_BY_WATCH = (WATCH_ENDED, "dscluster: the job's time limit was reached")

# docs/troubleshooting.md's section on Accelerate's world size 1 on CPU nodes
CPU_WORLD_SIZE_1 = (
    "docs/troubleshooting.md, 'Accelerate or HF Trainer trains alone at world size 1 (CPU nodes)'"
)
# DeepSpeed's batch assertion, deepspeedai/DeepSpeed deepspeed/runtime/config.py
# (_batch_assertion, 0.19.8): "... world_size {train_batch} != {micro_batch} * {grad_acc} *
# {self.world_size}" (before 0.6 without the space before the numbers: DeepSpeed PR #1734).
_BATCH = (
    r"Check batch related parameters\. train_batch_size is not equal to "
    r"micro_batch_per_gpu \* gradient_acc_step \* world_size ?\d+ != \d+ \* \d+ \* "
)

SIGNATURES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    # NVIDIA/nccl src/bootstrap.cc: WARN("Bootstrap : no socket interface found"); also
    # "NET/... : no socket interface found for ..." in its net plugins.
    (
        "nccl_no_socket_interface",
        re.compile(r"no socket interface found"),
        "NCCL found no network interface to use: set nccl_env_socket_ifname (or "
        "dscluster_nccl_socket_ifname per host) to an interface every node has, then "
        "'dscluster provision'",
    ),
    # pytorch/pytorch torch/csrc/distributed/c10d/socket.cpp: "The server socket has failed
    # to bind to [::]:29500 (errno: 98 - Address already in use)", and since torch 2.4
    # "... port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address
    # already in use"; NVIDIA/nccl src/misc/socket.cc: "Call to bind failed: Address already
    # in use".
    (
        "address_in_use",
        re.compile(r"Address already in use|EADDRINUSE", re.IGNORECASE),
        "the master port is taken (another job, or one left behind): pass --master-port "
        "with a free port, or end the old job",
    ),
    # pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to
    # allocate ...", raised as torch.OutOfMemoryError (torch/_C/__init__.pyi; before torch
    # 2.5 torch.cuda.OutOfMemoryError, before 1.13 RuntimeError).
    (
        "cuda_out_of_memory",
        re.compile(r"(?:OutOfMemoryError|RuntimeError): CUDA out of memory"),
        "a GPU ran out of memory: lower the micro batch size, or shard more with a higher "
        "ZeRO stage or CPU offload ('dscluster dsconfig')",
    ),
    # python/cpython Lib/importlib/_bootstrap.py: _ERR_MSG_PREFIX = 'No module named '
    # (the top-level package is the one to install).
    (
        "module_not_found",
        re.compile(r"ModuleNotFoundError: No module named '(?P<module>[^'.]+)"),
        "add {module} (its name on PyPI) to ml_stack_extra_requirements and run "
        "'dscluster provision'",
    ),
    # DeepSpeed's batch assertion at world size 1: every rank trained alone.
    (
        "deepspeed_batch_world_size_1",
        re.compile(_BATCH + r"1\b"),
        f"each rank saw world size 1 and trained alone; on CPU nodes see {CPU_WORLD_SIZE_1}",
    ),
    (
        "deepspeed_batch_size",
        re.compile(_BATCH + r"\d+"),
        "train_batch_size must equal train_micro_batch_size_per_gpu x "
        "gradient_accumulation_steps x ranks: fix one of them in the DeepSpeed config "
        '(or "auto" under the HF Trainer)',
    ),
    # pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: "[Rank N] Watchdog
    # caught collective operation timeout: WorkNCCL(...) ran for N milliseconds before
    # timing out."
    (
        "nccl_collective_timeout",
        re.compile(r"Watchdog caught collective operation timeout"),
        "a collective waited past its timeout: a rank stopped or fell behind (see the first "
        "rank that failed), or the nodes cannot reach each other; NCCL_DEBUG=INFO says which",
    ),
    # SIGKILL of a rank. deepspeedai/DeepSpeed deepspeed/launcher/launch.py: f"{cmd} exits
    # with return code = {last_return_code}"; pytorch/pytorch
    # torch/distributed/elastic/multiprocessing/errors/__init__.py: "  exitcode  : -9 (pid:
    # 77)" and "Signal 9 (SIGKILL) received by PID 77"; OpenMPI: "... exited on signal 9
    # (Killed)".
    (
        "rank_sigkill",
        re.compile(
            r"exits with return code = -9\b|exitcode\s*:\s*-9\b"
            r"|Signal 9 \(SIGKILL\) received by PID|exited on signal 9\b"
        ),
        "a rank was killed by SIGKILL, most likely the kernel's out-of-memory killer: see "
        "'dmesg' on that node, and lower the batch size, the ranks per node or CPU offload",
    ),
    # PyTorch's DataLoader worker: pytorch/pytorch torch/csrc/DataLoader.cpp: "ERROR:
    # Unexpected bus error encountered in worker. This might be caused by insufficient
    # shared memory (shm)."
    (
        "dataloader_shm",
        re.compile(r"Unexpected bus error encountered in worker"),
        "a DataLoader worker ran out of shared memory (/dev/shm): give the nodes a larger "
        "/dev/shm (docker --shm-size) or use fewer DataLoader workers",
    ),
    # pytorch/pytorch torch/csrc/distributed/c10d/socket.cpp: "The client socket has failed
    # to connect to any network address of (host, port)" and "The client socket has timed out
    # after 600000ms while trying to connect to (host, port)".
    (
        "store_unreachable",
        re.compile(
            r"The client socket has (?:failed to connect to any network address"
            r"|timed out after \d+m?s while trying to connect)"
        ),
        "a rank could not reach the master's TCP store: check that MASTER_ADDR resolves and "
        "its port is open from every node ('dscluster doctor -i INV')",
    ),
    # ssh from the head: OpenSSH sshconnect.c "ssh: connect to host %s port %s: %s",
    # "Host key verification failed.", sshconnect2.c "Permission denied (%s).", ssh.c
    # "Could not resolve hostname %s: %s"; pdsh: "pdsh@head: node: ssh exited with exit
    # code 255".
    (
        "ssh_failed",
        re.compile(
            r"ssh: connect to host \S+ port \d+:|Could not resolve hostname"
            r"|Permission denied \(publickey|Host key verification failed"
            r"|ssh exited with exit code 255"
        ),
        "ssh from the head to a node failed: check that the node is up and run "
        "'dscluster doctor -i INV' (it checks ssh between the nodes)",
    ),
)


@dataclasses.dataclass(frozen=True)
class Match:
    """One signature found: its name and help, the node and global rank whose line it was
    (None where the line does not say), and the line itself (without the node's prefix)."""

    name: str
    help: str
    host: str | None
    rank: int | None
    line: str

    @property
    def where(self) -> str:
        """'rank 1 (n2)', 'n2' or 'the log'."""
        if self.rank is not None:
            return f"rank {self.rank}" + (f" ({self.host})" if self.host else "")
        return self.host or "the log"

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "help": self.help,
            "host": self.host,
            "rank": self.rank,
            "where": self.where,
            "line": self.line,
        }


def match_signatures(
    log_lines: Sequence[str],
    rank_hosts: Sequence[str] = (),
    table: Sequence[tuple[str, re.Pattern[str], str]] = SIGNATURES,
) -> list[Match]:
    """Each signature of `table` found in the log, once (its first line), in the order the
    log shows them; the first pattern of the table that matches a line is that line's. What
    the log shows after launch_watch ended the launcher (the kills) is left out."""
    end = next((i for i, t in enumerate(log_lines) if t.startswith(ENDED_BY_WATCH)), None)
    hosts = set(rank_hosts)
    first_rank = {h: rank_hosts.index(h) for h in hosts}
    found: dict[str, Match] = {}
    for raw in log_lines[:end]:
        hit = next(((n, m, h) for n, p, h in table if (m := p.search(raw))), None)
        if hit is None or hit[0] in found:
            continue
        name, m, help_text = hit
        host, rank, local, text = split_prefix(raw, hosts)
        if rank is None and local is not None and host is not None:
            rank = first_rank[host] + local
        if host is None and (lost := lost_line(raw)) is not None:
            host = lost[0]  # pdsh's, ssh's or mpirun's own line naming the node
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        found[name] = Match(name, help_text.format(**groups), host, rank, text.strip())
    return list(found.values())

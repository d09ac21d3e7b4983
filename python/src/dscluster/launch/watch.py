"""Reading a launch's log: which node was lost and why (launcher, pdsh, ssh, mpirun lines)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..jobs.launch_watch import (
    MPI_LOST_DAEMON_RE,
    MPI_RANK_RE,
    MPI_SSH_ERROR_RE,
    PDSH_EXIT_RE,
    RANK_EXIT_RE,
    SSH_ERROR_RE,
    TORCHRUN_EXIT_RE,
)

# "  Process name: [[27718,1],2]" then "  Exit code:    3": the first rank that failed.
MPI_PROCESS_RE = re.compile(r"^\s*Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]")
MPI_EXIT_CODE_RE = re.compile(r"^\s*Exit code:\s+(?P<code>-?\d+)")


def lost_nodes(log_lines: Sequence[str], rank_hosts: Sequence[str] = ()) -> dict[str, str]:  # noqa: C901 - one branch per launcher log pattern (pdsh, ssh, torchrun, mpirun)
    """Nodes the launcher log shows lost, with why, in the order the log shows them.

    rank_hosts: the host of each global rank (mpirun names a failed rank, not its node).

    Nodes that could not be reached (ssh failures, pdsh's exit 255) are the cause when
    present; ranks elsewhere that then fail at rendezvous or in a collective are not blamed.
    Otherwise the nodes where a rank or the node's launcher was killed by a signal (a negative
    return code, or a remote exit above 128): ranks on other nodes then fail in a collective
    with a plain error. Otherwise the nodes whose ranks exited non-zero, the first one first.
    """
    unreachable: dict[str, str] = {}
    signalled: dict[str, str] = {}
    ranks: dict[str, str] = {}
    mpi_rank: int | None = None
    for line in log_lines:
        if m := MPI_PROCESS_RE.match(line):
            mpi_rank = int(m["rank"])
        elif (m := MPI_EXIT_CODE_RE.match(line)) and mpi_rank is not None:
            if mpi_rank < len(rank_hosts):
                host = rank_hosts[mpi_rank]
                ranks.setdefault(host, f"rank {mpi_rank} exited with code {m['code']}")
            mpi_rank = None
        elif m := SSH_ERROR_RE.match(line):
            unreachable[m["host"]] = f"ssh: {m['msg']}"
        elif m := MPI_SSH_ERROR_RE.match(line):
            unreachable.setdefault(m["host"], f"ssh: {m['msg']}")
        elif m := MPI_LOST_DAEMON_RE.match(line):
            unreachable.setdefault(m["host"], "mpirun lost its daemon on the node")
        elif (m := PDSH_EXIT_RE.match(line)) and m["code"] == "255":
            unreachable.setdefault(m["host"], "ssh exited with code 255")
        elif (m := RANK_EXIT_RE.match(line) or TORCHRUN_EXIT_RE.match(line)) and m["code"] != "0":
            why = f"a rank exited with code {m['code']}"
            (signalled if int(m["code"]) < 0 else ranks).setdefault(m["host"], why)
        elif m := MPI_RANK_RE.search(line):
            signalled.setdefault(m["host"], f"a rank was killed by signal {m['sig']}")
        elif (m := PDSH_EXIT_RE.match(line)) and int(m["code"]) > 128:
            code = int(m["code"])
            # 129-192: the shell's 128+signal; above: DeepSpeed's launch.py passing on a rank's
            # negative return code (sys.exit(-9) is 247).
            why = (
                f"remote command killed by signal {code - 128}"
                if code <= 192
                else f"a rank was killed by signal {256 - code}"
            )
            signalled.setdefault(m["host"], why)
        elif m := PDSH_EXIT_RE.match(line):
            ranks.setdefault(m["host"], f"remote command exited with code {m['code']}")
    return unreachable or signalled or ranks

"""Reading a launch's log: which node was lost and why (launcher, pdsh, ssh, mpirun lines),
or, when every node stayed reachable, which ranks the script failed on and its error lines."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from ..jobs.launch_watch import (
    MPI_LOST_DAEMON_RE,
    MPI_RANK_RE,
    MPI_SSH_ERROR_RE,
    NONE_RUNNING,
    PDSH_EXIT_RE,
    RANK_EXIT_RE,
    RANK_EXITED_RE,
    SSH_ERROR_RE,
    STILL_RUNNING,
    TORCHRUN_EXIT_RE,
)

# "  Process name: [[27718,1],2]" then "  Exit code:    3": the first rank that failed.
MPI_PROCESS_RE = re.compile(r"^\s*Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]")
MPI_EXIT_CODE_RE = re.compile(r"^\s*Exit code:\s+(?P<code>-?\d+)")
# torchrun's ChildFailedError summary names each failed rank before its exit code:
#   "node2:   rank      : 1 (local_rank: 0)" then "node2:   exitcode  : 1 (pid: 77)"
TORCHRUN_RANK_RE = re.compile(r"^(?P<host>[^:\s]+):\s+rank\s*:\s*(?P<rank>\d+) \(local_rank")
# Who wrote a line, after pdsh's "host: ": torch's own "[rank3]:" (or torchrun's
# --log-line-prefix-template '[rank${rank}]:'), torchrun --tee's "[default1]:" (role and local
# rank), mpirun --tag-output's "[1,3]<stderr>:" (OpenMPI 5 adds a space).
RANK_TAG_RE = re.compile(
    r"^(?:\[rank(?P<rank>\d+)\]:|\[(?P<role>[A-Za-z_]\w*?)(?P<local>\d+)\]:"
    r"|\[\d+,(?P<mpi>\d+)\]<std(?:out|err)>:)"
)
TRACEBACK = "Traceback (most recent call last):"
# launch_watch.py's own lines: a node lost; the launcher ended by it (what follows is its kill).
WATCH_LOST = "dscluster: lost node "
WATCH_ENDED = "dscluster: ending the launcher "
# launch_watch.py's line for the first rank it saw fail by itself (its node's lines may come
# later in the log than the others' kills).
WATCH_FAILED_RE = re.compile(r"^dscluster: a rank failed on (?P<host>\S+) ")
# A launcher's own log line (DeepSpeed's "[2026-12-03 16:51:19,953] [INFO] [launch.py:253:..."),
# torch's glog-style lines (torchrun's agent: "E1123 20:01:05.123000 77 torch/distributed/...]
# failed (exitcode: 1) ..."; c10's "[W1203 16:51:10.238746470 ProcessGroup.cpp:335] Warning:
# ..."), pdsh's, and a warning's source line: none is a script's last word.
NOT_A_MESSAGE_RE = re.compile(
    r"^(?:\[\d{4}-\d\d-\d\d [\d:,.]+\] \[[A-Z]+\]|\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ "
    r"|pdsh@|dscluster: |\S+: \S*Warning: |\s|$)"
)
# Frames of a launcher's own traceback (torchrun's agent, DeepSpeed's runner), not the script's.
LAUNCHER_FRAME_RE = re.compile(
    r'File ".*(?:/bin/torchrun|/torch/distributed/run\.py|/deepspeed/launcher/)'
)
ERROR_LINES = 5


def time_limit_note(log_lines: Sequence[str]) -> str:
    """What launch_watch found still running when the job's time limit ended it: "still
    running at the time limit: rank 1 on n2 (python -u train.py)", or that no rank was (a
    launcher alone was left); "" when the log has no such line (a watcher killed outright)."""
    for line in reversed(log_lines):
        text = line.strip().removeprefix("dscluster: ")
        if text.startswith((STILL_RUNNING, NONE_RUNNING)):
            return text
    return ""


def lost_nodes(log_lines: Sequence[str], rank_hosts: Sequence[str] = ()) -> dict[str, str]:
    """Nodes the launcher log shows lost, with why, in the order the log shows them.

    rank_hosts: the host of each global rank (mpirun names a failed rank, not its node).

    Nodes that could not be reached (ssh failures, pdsh's exit 255) are the cause when
    present; ranks elsewhere that then fail at rendezvous or in a collective are not blamed.
    Otherwise the nodes where a rank or the node's launcher was killed by a signal (a negative
    return code, or a remote exit above 128): ranks on other nodes then fail in a collective
    with a plain error. Otherwise the nodes whose ranks exited non-zero, the first one first.
    """
    unreachable, signalled, ranks = classify(log_lines, rank_hosts)
    return unreachable or signalled or ranks


def mpi_exits(log_lines: Sequence[str], rank_hosts: Sequence[str] = ()) -> dict[int, str]:
    """The mpirun ranks that exited non-zero by themselves, global rank -> exit code, in the
    log's order: the one mpirun's verdict names ("Process name: [[..],2]", "Exit code: 3"),
    else each that mpi_rank.sh's `launch_watch.py rank` said (mpirun leaves its verdict out
    when the other ranks ended normally before it acted). With a verdict the ranks' own lines
    are not counted: a rank that caught the SIGTERM of mpirun's abort and exited 1 is no
    cause of it. Ranks beyond rank_hosts are no one's."""
    verdict: dict[int, str] = {}
    said: dict[int, str] = {}
    mpi_rank: int | None = None
    for line in log_lines:
        if m := MPI_PROCESS_RE.match(line):
            mpi_rank = int(m["rank"])
        elif (m := MPI_EXIT_CODE_RE.match(line)) and mpi_rank is not None:
            if mpi_rank < len(rank_hosts):
                verdict.setdefault(mpi_rank, m["code"])
            mpi_rank = None
        elif (m := RANK_EXITED_RE.match(line)) and int(m["rank"]) < len(rank_hosts):
            said.setdefault(int(m["rank"]), m["code"])
    return verdict or said


def classify(
    log_lines: Sequence[str], rank_hosts: Sequence[str] = ()
) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(unreachable, signalled, exited) nodes, each host -> why, in the log's order (mpirun's
    ranks, from mpi_exits, after the others)."""
    unreachable: dict[str, str] = {}
    signalled: dict[str, str] = {}
    ranks: dict[str, str] = {}
    for line in log_lines:
        if m := SSH_ERROR_RE.match(line):
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
    for rank, status in mpi_exits(log_lines, rank_hosts).items():
        ranks.setdefault(rank_hosts[rank], f"rank {rank} exited with code {status}")
    return unreachable, signalled, ranks


@dataclasses.dataclass(frozen=True)
class ScriptFailure:
    """Ranks exited non-zero and every node stayed reachable: the script's own error.

    ranks: the failed global ranks (a node's every rank where the launcher names only the
    node: DeepSpeed's, pdsh's); hosts: their nodes; why: the first node's exit, as classify
    says it; error_from: whose error lines these are ("of rank 0 (n1)", "on n1", "in the
    log" when the output names no rank or node: mpirun without --tag-output);
    error_lines: the end of its last traceback (at most ERROR_LINES lines)."""

    ranks: list[int]
    hosts: list[str]
    why: str
    error_from: str = ""
    error_lines: list[str] = dataclasses.field(default_factory=list)


def split_prefix(line: str, hosts: Iterable[str]) -> tuple[str | None, int | None, int | None, str]:
    """(pdsh host, global rank, local rank, text) of one log line; None where not tagged."""
    host = None
    head, sep, rest = line.partition(": ")
    if sep and head in hosts:
        host, line = head, rest
    rank = local = None
    if m := RANK_TAG_RE.match(line):
        if m["rank"] is not None or m["mpi"] is not None:
            rank = int(m["rank"] if m["rank"] is not None else m["mpi"])
        else:
            local = int(m["local"])
        line = line[m.end() :]
        # torch's own tag and OpenMPI 5's add a space: a traceback's indents are even
        if (len(line) - len(line.lstrip(" "))) % 2:
            line = line[1:]
    return host, rank, local, line


def _traceback_at(lines: Sequence[str], start: int) -> list[str]:
    """The frame lines and exception line of the traceback starting after lines[start]
    (3.11's ^^^ markers left out); [] when it does not end in an exception line."""
    block: list[str] = []
    for text in lines[start + 1 :]:
        if text.startswith((" ", "\t")):
            if not set(text.strip()) <= set("^~"):
                block.append(text.rstrip())
            continue
        if block and text.strip():
            block.append(text.rstrip())  # the exception line ends the traceback
        break
    return block if block and not block[-1].startswith((" ", "\t")) else []


def last_error(lines: Sequence[str]) -> list[str]:
    """The end of the last traceback of the script in `lines` (a launcher's own, e.g.
    torchrun's ChildFailedError, left out): at most ERROR_LINES lines, the exception last."""
    for start in reversed([i for i, text in enumerate(lines) if text.strip() == TRACEBACK]):
        block = _traceback_at(lines, start)
        launcher = any(LAUNCHER_FRAME_RE.search(text) for text in block)
        if block and not launcher and "ChildFailedError" not in block[-1]:
            return block[-ERROR_LINES:]
    return []


def _before_launcher_traceback(lines: Sequence[str]) -> Sequence[str]:
    """`lines` up to the first traceback of a launcher's own (torchrun's agent reporting its
    ChildFailedError, with the summary after it): what the ranks printed comes before."""
    for start, text in enumerate(lines):
        if text.strip() == TRACEBACK:
            block = _traceback_at(lines, start)
            if any(LAUNCHER_FRAME_RE.search(t) for t in block):
                return lines[:start]
    return lines


def last_message(lines: Sequence[str]) -> str:
    """The last line a program printed by itself (no launcher log line or traceback, warning,
    indent or blank), as sys.exit("...") leaves it; "" where there is none or a traceback
    ends it."""
    for text in reversed(_before_launcher_traceback(lines)):
        if not NOT_A_MESSAGE_RE.match(text):
            return "" if text.startswith(TRACEBACK) else text.rstrip()
    return ""


def _failed_ranks(
    log_lines: Sequence[str], rank_hosts: Sequence[str], exited: dict[str, str]
) -> list[int]:
    """The failed global ranks: exact where the log says (torchrun's summary, mpi_exits),
    else every rank of a node whose launcher reported a failure."""
    exact = set(mpi_exits(log_lines, rank_hosts))
    exact_hosts = {rank_hosts[r] for r in exact}
    for line in log_lines:
        if (m := TORCHRUN_RANK_RE.match(line)) and int(m["rank"]) < len(rank_hosts):
            exact.add(int(m["rank"]))
            exact_hosts.add(m["host"])
    for rank, host in enumerate(rank_hosts):
        if host in exited and host not in exact_hosts:
            exact.add(rank)
    return sorted(exact)


def _by_source(
    log_lines: Sequence[str], rank_hosts: Sequence[str]
) -> tuple[dict[int, list[str]], dict[str, list[str]], list[str]]:
    """The log's lines by global rank (where tagged), by node, and those tagged with neither."""
    hosts = set(rank_hosts)
    first_rank = {h: rank_hosts.index(h) for h in hosts}
    by_rank: dict[int, list[str]] = {}
    by_host: dict[str, list[str]] = {}
    untagged: list[str] = []
    for line in log_lines:
        host, rank, local, text = split_prefix(line, hosts)
        if rank is None and local is not None and host is not None:
            rank = first_rank[host] + local
        if rank is not None:
            by_rank.setdefault(rank, []).append(text)
        if host is not None:
            by_host.setdefault(host, []).append(text)
        elif rank is None:
            untagged.append(text)
    return by_rank, by_host, untagged


def _traceback_of(
    ranks: Sequence[int],
    rank_hosts: Sequence[str],
    by_rank: dict[int, list[str]],
    by_host: dict[str, list[str]],
) -> tuple[str, list[str]] | None:
    """The first of `ranks` with a traceback: by its rank tag, then by its node's lines."""
    for rank in ranks:
        if lines := last_error(by_rank.get(rank, [])):
            return f"of rank {rank} ({rank_hosts[rank]})", lines
    for host in dict.fromkeys(rank_hosts[r] for r in ranks):
        if lines := last_error(by_host.get(host, [])):
            only = [r for r, h in enumerate(rank_hosts) if h == host]
            return (f"of rank {only[0]} ({host})" if len(only) == 1 else f"on {host}"), lines
    return None


def _said_before_exit(log_lines: Sequence[str], rank: int) -> str:
    """mpirun without --tag-output names no rank in the ranks' lines: the last line before
    the rank's wrapper said it exited non-zero (launch_watch.py rank, after the rank's own
    stderr) where that line is no traceback's; "" otherwise."""
    said = next(
        (
            i
            for i, t in enumerate(log_lines)
            if (m := RANK_EXITED_RE.match(t)) and int(m["rank"]) == rank
        ),
        None,
    )
    if said is None:
        return ""
    message = last_message(log_lines[:said])
    error = last_error(log_lines[:said])
    return "" if error and error[-1].strip() == message.strip() else message


def _error_of(
    log_lines: Sequence[str], rank_hosts: Sequence[str], ranks: Sequence[int]
) -> tuple[str, list[str]]:
    """The error of the first of `ranks` (the first node to fail comes first): its traceback,
    by the most exact attribution the log has, or its own last line where it left none; then
    the others' tracebacks; then the whole (untagged) log's."""
    by_rank, by_host, untagged = _by_source(log_lines, rank_hosts)
    if ranks:
        first = rank_hosts[ranks[0]]
        own = [r for r in ranks if rank_hosts[r] == first]
        if found := _traceback_of(own, rank_hosts, by_rank, by_host):
            return found
        if message := last_message(by_host.get(first, [])):
            # The first node to fail ended without a traceback (sys.exit("...") or a shell
            # script's error): its last line says why, not the others' broken collectives.
            return f"on {first}", [message]
        if first not in by_host and (message := _said_before_exit(log_lines, ranks[0])):
            return f"of rank {ranks[0]} ({first})", [message]
    if found := _traceback_of(ranks, rank_hosts, by_rank, by_host):
        return found
    lines = last_error(untagged)
    return ("in the log", lines) if lines else ("", [])


def script_failure(
    log_lines: Sequence[str], rank_hosts: Sequence[str] = ()
) -> ScriptFailure | None:
    """The script's failure when ranks exited non-zero and no node was lost (unreachable,
    ended by a signal, launch_watch's "lost node"); None otherwise (lost_nodes then names
    the nodes). What the log shows after launch_watch ended the launcher (ranks it killed on
    the other nodes) is its doing, not theirs."""
    end = next((i for i, t in enumerate(log_lines) if t.startswith(WATCH_ENDED)), None)
    log_lines = log_lines[:end]
    if any(line.startswith(WATCH_LOST) for line in log_lines):
        return None
    unreachable, signalled, exited = classify(log_lines, rank_hosts)
    if unreachable or signalled or not exited:
        return None
    ranks = _failed_ranks(log_lines, rank_hosts, exited)
    hosts = list(dict.fromkeys([*(rank_hosts[r] for r in ranks), *exited]))
    # The node whose failure the log shows first is the likeliest cause: the others' ranks
    # may have failed only because its ranks left (a collective's peer gone).
    watched = next((m["host"] for t in log_lines if (m := WATCH_FAILED_RE.match(t))), None)
    first = watched if watched in exited else next(iter(exited))
    order = sorted(ranks, key=lambda r: (rank_hosts[r] != first, r))
    error_from, lines = _error_of(log_lines, rank_hosts, order)
    return ScriptFailure(ranks, hosts, f"{first}: {exited[first]}", error_from, lines)

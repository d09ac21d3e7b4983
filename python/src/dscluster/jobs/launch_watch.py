"""Run a job's launcher on the head and end it promptly once a node is lost.

Staged with every job by `dscluster launch`/`smoke` (launch.py) and run by its launch.sh:

    python launch_watch.py --grace 10 --marker KEY=VALUE --hosts h1,h2 -- LAUNCHER ARGS...

The launcher's output is passed through line by line. A line saying that a node was lost (pdsh:
"<node>: ssh exited with exit code N", an ssh error, a rank killed by a signal) or that a rank
failed (exited non-zero by itself: it says "a rank failed on <node>") starts a grace period;
if the launcher has not ended by itself when it is over, the watcher ends it (SIGTERM, which
DeepSpeed's runner answers by killing its remote launchers; SIGKILL to what is left) and then
kills, on every node still reachable, the processes whose environment carries the
marker (the job's ranks and per-node launchers), so ranks waiting in a collective for the lost
node do not linger until the collective's timeout. SIGTERM to the watcher (the job's time limit)
ends the job the same way, after it has said which ranks were still running and where (a
rank hung at exit or in a collective: "still running at the time limit: rank 1 on node2
(python -u train.py)"), which `dscluster launch` puts in its error line.

For `dscluster launch --max-restarts` it also says, on the head's clock (seconds since the
epoch), when it first saw the job's step marker ("dscluster: first DSCLUSTER_STEP 12 at
1733371234.567", the line rank 0 prints after each optimizer step: "DSCLUSTER_STEP <n>") and
when it noticed a lost node ("dscluster: noticed the loss at 1733371230.100"); with
--checkpoint-dir, once the launcher ended it writes checkpoint_state.json in the job directory:
DeepSpeed's `latest` there (read without following a link) and the entries of the tag it names.

With --elastic MIN (torchrun --nnodes MIN:MAX) a node whose agent is gone (ssh's error, a
signal) is left to torchrun while MIN nodes are left, unless it is the first of --hosts (the
master, whose agent serves the rendezvous store): the other agents re-rendezvous and
restart the workers without it. The watcher looks for the restarted workers on the nodes left
(GROUP_WORLD_SIZE, the agents of their round, in their environment) and ends the job as above
when they have not come within --elastic-bound seconds, or when fewer than MIN nodes are left.
When the agents then finish, pdsh's exit for the lost node alone does not fail the job.

Exit status: the launcher's own when it ended by itself (128+N for a signal; 0 when elastic
agents finished without the nodes lost), 1 when the watcher ended it because a node was
lost. Only the standard library: it runs in the nodes' venv.

    python launch_watch.py rank -- PYTHON -u SCRIPT ARGS...

runs one rank of an mpirun job (mpi_rank.sh execs it) as a child: when the rank exits non-zero
by itself it says "dscluster: rank 2 exited with code 3". mpirun's own verdict ("Process name:
[[..],2]" / "Exit code: 3") is left out when the other ranks end normally before mpirun acts
on the failure (the job is then "terminated", not "non-zero"). Signals are passed on to the
rank; a rank killed by a signal ends this process by the same signal (mpirun: "exited on
signal N"). Its exit status is the rank's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

# pdsh reports a node it could not reach or whose remote command died:
#   "pdsh@head: node3: ssh exited with exit code 255"
PDSH_EXIT_RE = re.compile(r"^pdsh@\S+: (?P<host>[^:\s]+): ssh exited with exit code (?P<code>\d+)")
# ... and prefixes every remote line with "node: "; DeepSpeed's per-node launcher says
#   "node2: [...] [ERROR] [launch.py:...] ... exits with return code = -9"
RANK_EXIT_RE = re.compile(r"^(?P<host>[^:\s]+): .*exits with return code = (?P<code>-?\d+)")
# torchrun's ChildFailedError summary, prefixed by pdsh: "node2:   exitcode  : 1 (pid: 12)"
TORCHRUN_EXIT_RE = re.compile(r"^(?P<host>[^:\s]+):\s+exitcode\s*:\s*(?P<code>-?\d+)")
SSH_ERROR_RE = re.compile(r"^(?P<host>[^:\s]+): ssh: (?P<msg>.+)$")
# OpenMPI's output is not prefixed: orted started over ssh, and mpirun's own verdict.
MPI_SSH_ERROR_RE = re.compile(r"^ssh: (?P<msg>connect to host (?P<host>\S+) .+)$")
MPI_RANK_RE = re.compile(
    r"process rank \d+ with PID \d+ on node (?P<host>[^\s,]+) exited on signal (?P<sig>\d+)"
)
# OpenMPI when the ssh session of a node's daemon ends: "ORTE has lost communication with a
# remote daemon." ... "  HNP daemon   : [[...],0] on node head" / "  Remote daemon: [[...],2]
# on node node3"
MPI_LOST_DAEMON_RE = re.compile(r"^\s*Remote daemon: \[\[\d+,\d+\],\d+\] on node (?P<host>\S+)")


# The job's own line after each optimizer step (rank 0): dscluster launch's first-step time.
STEP_MARKER_RE = re.compile(r"\bDSCLUSTER_STEP (?P<step>\d+)\b")
CHECKPOINT_STATE = "checkpoint_state.json"
# DeepSpeed's `latest` holds one tag; anything longer is not its.
LATEST_MAX_BYTES = 4096
# Entries counted in the tag directory: enough to tell empty from written, bounded.
TAG_ENTRIES_MAX = 100000
# One ZeRO optimizer shard per data-parallel rank (DeepSpeed's _get_zero_ckpt_name; bf16_ with
# bf16): rank 0 writes `latest` before the others' saves are done, so these say if they are.
ZERO_SHARD_RE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")


def checkpoint_state(directory: str) -> dict:
    """DeepSpeed's `latest` in `directory` and the tag directory it names, neither followed
    through a link: {"latest": text or None, "tag_entries": count or None, "error": ...}."""
    state: dict = {"dir": directory, "latest": None, "tag_entries": None, "error": ""}
    try:
        fd = os.open(os.path.join(directory, "latest"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return state
    except OSError as exc:
        state["error"] = f"latest: {exc.strerror}"
        return state
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            state["error"] = "latest is not a plain file"
            return state
        state["latest"] = os.read(fd, LATEST_MAX_BYTES + 1).decode(errors="replace")
    finally:
        os.close(fd)
    tag = state["latest"].strip()
    if not tag or "/" in tag or tag in (".", "..") or len(state["latest"]) > LATEST_MAX_BYTES:
        return state
    path = os.path.join(directory, tag)
    if os.path.islink(path) or not os.path.isdir(path):
        return state
    count, shards = 0, []
    with os.scandir(path) as entries:
        for entry in entries:
            count += 1
            m = ZERO_SHARD_RE.fullmatch(entry.name)
            if m and entry.is_file(follow_symlinks=False):
                shards.append([int(m[1]), int(m[2]), entry.stat(follow_symlinks=False).st_size])
            if count >= TAG_ENTRIES_MAX:
                break
    state["tag_entries"] = count
    state["zero_shards"] = sorted(shards)  # [dp rank, mp rank, bytes]: restart.py checks them
    return state


def lost_line(line: str) -> tuple[str, str, bool] | None:
    """(host, why, unreachable) when the line says a node was lost, else None."""
    found: tuple[str, str, bool] | None = None
    if m := SSH_ERROR_RE.match(line) or MPI_SSH_ERROR_RE.match(line):
        found = m["host"], f"ssh: {m['msg']}", True
    elif m := MPI_LOST_DAEMON_RE.match(line):
        found = m["host"], "mpirun lost its daemon on the node", True
    elif (m := PDSH_EXIT_RE.match(line)) and m["code"] != "0":
        found = m["host"], f"ssh exited with exit code {m['code']}", m["code"] == "255"
    elif (m := RANK_EXIT_RE.match(line) or TORCHRUN_EXIT_RE.match(line)) and m["code"] != "0":
        found = m["host"], f"a rank exited with code {m['code']}", False
    elif m := MPI_RANK_RE.search(line):
        found = m["host"], f"a rank was killed by signal {m['sig']}", False
    return found


def script_error(why: str, unreachable: bool) -> bool:
    """A rank or a node's launcher that exited by itself (1-128) on a node still reachable:
    the script's own error, not a lost node (a signal, ssh's 255)."""
    m = re.search(r"code (-?\d+)$", why)
    return not unreachable and m is not None and 0 < int(m[1]) <= 128


def each_marked_process(marker: str, body: str, then: str = "") -> str:
    """Shell run on a node: body for each of this user's processes whose environment holds
    the marker ($p is its /proc directory), then `then` (a command, when given)."""
    quoted = "'" + marker.replace("'", "'\\''") + "'"
    return (
        f'for p in /proc/[0-9]*; do grep -qsxzF {quoted} "$p/environ" || continue; {body}; done'
        + (f"; {then}" if then else "")
        + "; exit 0"
    )


def reap_command(marker: str) -> str:
    """Shell run on a node: kill this user's processes whose environment holds the marker."""
    return each_marked_process(marker, 'kill -9 "${p#/proc/}" 2>/dev/null')


# A rank of the job: the launchers put its global rank in its environment (torchrun and
# DeepSpeed's launch.py: RANK; OpenMPI: OMPI_COMM_WORLD_RANK; MPICH/Intel MPI: PMI_RANK).
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
# survey_command's lines, after pdsh's "host: " prefix
SURVEY_RE = re.compile(
    r"^(?P<host>[^:\s]+): dscluster-rank (?P<rank>\d+) (?P<pid>\d+) ?(?P<args>.*)$"
)
# What the watcher says at the time limit (launch/watch.py reads it back for the error line)
STILL_RUNNING = "still running at the time limit: "
NONE_RUNNING = "no rank was still running at the time limit"
# survey_command's last line on every node that ran it to the end
SURVEYED = "dscluster-surveyed"
# pdsh -u for that survey (--survey-timeout), and the seconds its verdict names
SURVEY_TIMEOUT_S = 10
# `launch_watch.py rank`'s line for a rank that exited non-zero by itself (mpirun jobs)
RANK_EXITED = "dscluster: rank {rank} exited with code {code}"
RANK_EXITED_RE = re.compile(r"^dscluster: rank (?P<rank>\d+) exited with code (?P<code>\d+)$")
# ... and its own command line, which the survey at the time limit does not take for the rank
RANK_SUPERVISOR_RE = re.compile(r"(?:^|\s)\S*launch_watch\.py rank(?:\s|$)")
# elastic_probe_command's line for a worker of torchrun's agents: the agents in its round and
# its restart count, after pdsh's "host: "
ELASTIC_RE = re.compile(r"^(?P<host>[^:\s]+): dscluster-elastic (?P<agents>\d+) (?P<restart>\d+)$")
# Seconds between looks for the restarted workers while the agents recover.
ELASTIC_PROBE_EVERY = 5
# Signals a rank's supervisor passes on to the rank.
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def survey_command(marker: str) -> str:
    """Shell run on a node: one line per process of the job that is a rank (the marker and a
    rank variable in its environment): 'dscluster-rank RANK PID ARGS'."""
    names = "|".join(RANK_VARS)
    return each_marked_process(
        marker,
        "r=$(tr '\\0' '\\n' < \"$p/environ\" 2>/dev/null"
        f" | sed -nE 's/^({names})=([0-9]+)$/\\2/p' | head -n 1)"
        '; [ -n "$r" ] || continue'
        "; a=$(tr '\\0' ' ' < \"$p/cmdline\" 2>/dev/null | cut -c 1-300)"
        '; echo "dscluster-rank $r ${p#/proc/} $a"',
        then=f"echo {SURVEYED}",
    )


def elastic_probe_command(marker: str) -> str:
    """Shell run on a node: 'dscluster-elastic AGENTS RESTART' for each worker of the job that
    torchrun's agent started (GROUP_WORLD_SIZE and TORCHELASTIC_RESTART_COUNT set)."""
    return each_marked_process(
        marker,
        "e=$(tr '\\0' '\\n' < \"$p/environ\" 2>/dev/null)"
        "; g=$(printf '%s\\n' \"$e\" | sed -n 's/^GROUP_WORLD_SIZE=\\([0-9]*\\)$/\\1/p')"
        "; r=$(printf '%s\\n' \"$e\" | sed -n 's/^TORCHELASTIC_RESTART_COUNT=\\([0-9]*\\)$/\\1/p')"
        '; [ -n "$g" ] && [ -n "$r" ] || continue'
        '; echo "dscluster-elastic $g $r"',
    )


def restarted_without(lines: list[str], left: int) -> tuple[int, int] | None:
    """(agents, restart count) of a worker the agents restarted in a round of at most `left`
    agents (the lost nodes' gone), from elastic_probe_command's lines; None when none is."""
    found = [
        (int(m["agents"]), int(m["restart"]))
        for line in lines
        if (m := ELASTIC_RE.match(line.rstrip("\n"))) and int(m["agents"]) <= left
    ]
    return max(found, key=lambda f: f[1]) if found else None


def short_args(args: str, width: int = 120) -> str:
    """A process's command line for one line of output: its program by base name (the
    venv's python, not its path), at most width characters."""
    words = args.split()
    if words:
        words[0] = words[0].rsplit("/", 1)[-1]
    text = " ".join(words)
    return text if len(text) <= width else text[: width - 1] + "…"


def still_running(
    lines: list[str], hosts: Sequence[str] = (), within: int = SURVEY_TIMEOUT_S
) -> str:
    """The watcher's verdict on survey lines: which ranks still ran, on which node, first
    process of each (host, rank) only (a rank's own children carry its environment); and
    the hosts surveyed that did not answer to the end (what runs there is not known)."""
    seen: dict[tuple[int, str], str] = {}
    answered = set()
    for line in lines:
        m = SURVEY_RE.match(line.rstrip("\n"))
        if m and not RANK_SUPERVISOR_RE.search(m["args"]):
            seen.setdefault((int(m["rank"]), m["host"]), short_args(m["args"]))
        host, _, rest = line.rstrip("\n").partition(": ")
        if rest == SURVEYED:
            answered.add(host)
    silent = [h for h in hosts if h not in answered]
    unknown = f"; no answer from {', '.join(silent)} within {within} s" if silent else ""
    if not seen:
        return NONE_RUNNING + unknown
    ranks = ", ".join(
        f"rank {rank} on {host}" + (f" ({args})" if args else "")
        for (rank, host), args in sorted(seen.items())
    )
    return STILL_RUNNING + ranks + unknown


class Watch:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lost: dict[str, tuple[str, bool]] = {}
        self.lost_at: float | None = None
        self.cut = False  # SIGTERM from the job's time limit
        self.first_step = False
        self.hosts = [h for h in args.hosts.split(",") if h]
        # --elastic: nodes left to torchrun's agents, waiting for the restart / done without
        self.pending: dict[str, str] = {}
        self.recover_by: float | None = None
        self.probed_at = 0.0
        self.recovered: set[str] = set()
        self.exits: dict[str, int] = {}  # pdsh's non-zero exits, per node

    def say(self, text: str) -> None:
        sys.stdout.write(f"dscluster: {text}\n")
        sys.stdout.flush()

    def run(self) -> int:
        key, _, value = self.args.marker.partition("=")
        env = dict(os.environ, **{key: value})
        proc = subprocess.Popen(
            self.args.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        lines: queue.Queue[bytes | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for raw in iter(proc.stdout.readline, b""):
                lines.put(raw)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        signal.signal(signal.SIGTERM, self._on_term)
        ended_by_us = False
        eof = False
        while True:
            try:
                raw = lines.get(timeout=0.5)
            except queue.Empty:
                raw = b""
            if raw is None:
                eof = True
            elif raw:
                line = raw.decode(errors="replace")
                sys.stdout.write(line if line.endswith("\n") else line + "\n")
                sys.stdout.flush()
                self._note(line.rstrip("\r\n"))  # ssh's errors end in \r\n
            if eof and proc.poll() is not None:
                break
            if self._time_to_end(eof):
                self._end(proc)
                ended_by_us = True
                break
        rc = proc.wait()
        rc = 128 - rc if rc < 0 else rc
        if rc != 0 and not ended_by_us and self._finished_without_lost():
            self.say(
                f"torchrun's agents finished the job on {len(self.hosts) - len(self.exits)} "
                f"nodes, without {', '.join(self.exits)} (lost); pdsh's exit {rc} was theirs"
            )
            rc = 0
        if rc != 0 or self.lost:
            self._reap()
        self._write_checkpoint_state()
        if ended_by_us:
            return 124 if self.cut else 1
        return rc

    def _write_checkpoint_state(self) -> None:
        """checkpoint_state.json in the job directory, with --checkpoint-dir."""
        if not self.args.checkpoint_dir:
            return
        try:
            state = checkpoint_state(self.args.checkpoint_dir)
        except OSError as exc:
            state = {"dir": self.args.checkpoint_dir, "latest": None, "tag_entries": None}
            state["error"] = str(exc)
        with contextlib.suppress(OSError), open(CHECKPOINT_STATE, "w") as f:
            json.dump(state, f)

    def _time_to_end(self, eof: bool) -> bool:
        """True (having said why) once the job is to end: its time limit (the ranks still
        running surveyed), a lost node's grace over, or (--elastic) the agents' bound."""
        if self.cut:
            self.say("the job's time limit was reached; ending the launcher")
            self._survey()
            return True
        if self.pending and not eof and self._elastic_stalled():
            self.say(
                "ending the launcher: torchrun's agents did not restart the workers within "
                f"{self.args.elastic_bound:g} s of losing " + ", ".join(self.pending)
            )
            return True
        if self.lost_at is not None and time.monotonic() - self.lost_at >= self.args.grace:
            failed = all(script_error(why, gone) for why, gone in self.lost.values())
            self.say(
                f"ending the launcher {self.args.grace:g} s after "
                + ("a rank failed on " if failed else "losing ")
                + ", ".join(self.lost)
            )
            return True
        return False

    def _on_term(self, signum, frame) -> None:
        self.cut = True

    def _note(self, line: str) -> None:
        if not self.first_step and (m := STEP_MARKER_RE.search(line)):
            self.first_step = True
            self.say(f"first DSCLUSTER_STEP {m['step']} at {time.time():.3f}")
        found = lost_line(line)
        if found is None:
            return
        host, why, unreachable = found
        if m := PDSH_EXIT_RE.match(line):
            self.exits[host] = int(m["code"])
        if host in self.lost:
            return
        self.lost[host] = (why, unreachable)
        if self._elastic(host, why, unreachable):
            return
        if self.lost_at is None:
            self.lost_at = time.monotonic()
            if not script_error(why, unreachable):
                self.say(f"noticed the loss at {time.time():.3f}")
            what = "a rank failed on" if script_error(why, unreachable) else "lost node"
            self.say(
                f"{what} {host} ({why}); the job ends within {self.args.grace:g} s "
                "unless it ends by itself"
            )

    def _elastic(self, host: str, why: str, unreachable: bool) -> bool:
        """--elastic: leave a node whose agent is gone (ssh's error, a signal; not an agent
        that failed by itself) to torchrun while MIN nodes are left; False otherwise."""
        low = self.args.elastic
        if not low or not why.startswith("ssh") or script_error(why, unreachable):
            return False
        if host == self.hosts[0]:
            # the first host is torchrun's master: its agent serves the rendezvous store
            self.say(f"{host} served torchrun's rendezvous: the agents cannot go on without it")
            return False
        gone = [h for h, (w, u) in self.lost.items() if w.startswith("ssh")]
        left = len(self.hosts) - len(gone)
        if left < low:
            self.say(f"{left} nodes left, fewer than --nnodes MIN {low}")
            return False
        self.pending[host] = why
        if self.recover_by is None:
            self.recover_by = time.monotonic() + self.args.elastic_bound
        self.say(
            f"lost node {host} ({why}); torchrun's agents go on with the {left} nodes left "
            f"(MIN {low}): the job ends unless they restart the workers within "
            f"{self.args.elastic_bound:g} s"
        )
        return True

    def _elastic_stalled(self) -> bool:
        """Look for the restarted workers every ELASTIC_PROBE_EVERY s while agents recover:
        True once the bound passed without them."""
        now = time.monotonic()
        if now - self.probed_at >= ELASTIC_PROBE_EVERY:
            self.probed_at = now
            gone = {h for h, (w, u) in self.lost.items() if w.startswith("ssh")}
            left = [h for h in self.hosts if h not in gone]
            lines = self._pdsh(
                left,
                elastic_probe_command(self.args.marker),
                self.args.survey_timeout,
                doing="look for the restarted workers",
            )
            found = restarted_without(lines or [], len(left))
            if found is not None:
                self.say(
                    f"torchrun's agents run the workers without {', '.join(self.pending)}: "
                    f"{found[0]} nodes, restart {found[1]}"
                )
                self.recovered |= set(self.pending)
                self.pending.clear()
                self.recover_by = None
                return False
        return self.recover_by is not None and now >= self.recover_by

    def _finished_without_lost(self) -> bool:
        """--elastic: pdsh failed only for nodes the agents restarted the workers without,
        and MIN or more nodes ended 0 (pdsh names each node that did not)."""
        failed = {h for h, code in self.exits.items() if code}
        return (
            bool(self.args.elastic)
            and bool(failed)
            and failed <= self.recovered
            and len(self.hosts) - len(failed) >= self.args.elastic
            and set(self.lost) <= self.recovered
        )

    def _end(self, proc: subprocess.Popen) -> None:
        """SIGTERM to the launcher (DeepSpeed's runner then kills its remote launchers),
        SIGKILL to its whole process group after term_wait seconds."""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.args.term_wait)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def _reachable(self) -> list[str]:
        return [h for h in self.args.hosts.split(",") if h and not self.lost.get(h, ("", 0))[1]]

    def _pdsh(self, hosts: list[str], command: str, timeout: int, doing: str) -> list[str] | None:
        """Run a command on the hosts (pdsh -u timeout); its output lines ("host: ..."),
        None when pdsh could not run or did not end (then it says so)."""
        if not hosts:
            return []
        key = self.args.marker.partition("=")[0]
        env = {k: v for k, v in os.environ.items() if k != key}
        argv = ["pdsh", "-S", "-u", str(timeout), "-w", ",".join(hosts), command]
        try:
            done = subprocess.run(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                timeout=timeout + 5,
                check=False,
                text=True,
                errors="replace",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.say(f"could not {doing} on {', '.join(hosts)}: {exc}")
            return None
        return done.stdout.splitlines()

    def _survey(self) -> None:
        """At the time limit, before anything is killed: name the ranks still running (a
        rank hung at exit or in a collective), so the error names the node, not only 124."""
        # `timeout --kill-after=45` (launch.yml) leaves the watcher 45 s for this (pdsh -u
        # survey_timeout, default SURVEY_TIMEOUT_S 10: at most 15 s), the launcher's end
        # (term_wait, 5 s) and the reaping (reap_timeout 6, at most 11 s): 31 s at worst.
        # 3 s was too short on a loaded 2-core machine: no node answered, no rank was named.
        hosts, within = self._reachable(), self.args.survey_timeout
        command = survey_command(self.args.marker)
        lines = self._pdsh(hosts, command, within, doing="look for the ranks still running")
        if lines is not None:
            self.say(still_running(lines, hosts, within))

    def _reap(self) -> None:
        """Kill what is left of the job on every node that can still be reached."""
        command = reap_command(self.args.marker)
        self._pdsh(
            self._reachable(), command, self.args.reap_timeout, doing="end the job's processes"
        )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grace", type=float, default=10.0, help="seconds after a node is lost")
    parser.add_argument("--term-wait", type=float, default=5.0, help="seconds after SIGTERM")
    parser.add_argument("--reap-timeout", type=int, default=6, help="pdsh -u for the reaping")
    parser.add_argument(
        "--survey-timeout",
        type=int,
        default=SURVEY_TIMEOUT_S,
        help="pdsh -u for the survey at the time limit",
    )
    parser.add_argument("--marker", required=True, help="KEY=VALUE set in the job's environment")
    parser.add_argument("--hosts", required=True, help="the job's nodes, comma-separated")
    parser.add_argument("--checkpoint-dir", default="", help="where DeepSpeed's `latest` is")
    parser.add_argument(
        "--elastic", type=int, default=0, help="torchrun --nnodes MIN: the MIN nodes to go on"
    )
    parser.add_argument(
        "--elastic-bound", type=float, default=300.0, help="seconds for the agents to restart"
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- launcher argv")
    args = parser.parse_args(argv)
    if args.argv[:1] == ["--"]:
        args.argv = args.argv[1:]
    if not args.argv or "=" not in args.marker:
        parser.error("give --marker KEY=VALUE and the launcher after --")
    return args


def _die_with_parent(parent: int) -> Callable[[], None]:
    """Popen's preexec_fn: the child gets SIGKILL when this process dies (Linux's
    PR_SET_PDEATHSIG), as the rank did when mpirun's daemon SIGKILLed it in place."""

    def arm() -> None:
        with contextlib.suppress(ImportError, OSError, AttributeError):
            import ctypes  # noqa: PLC0415 - only here, where the rank starts

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before that took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def run_rank(argv: list[str]) -> int:
    """One rank of an mpirun job as this process's child (module docstring: `rank`)."""
    try:
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent(os.getpid()))  # noqa: PLW1509 - no threads here
    except OSError as exc:
        sys.stderr.write(f"dscluster: cannot run {argv[0]}: {exc}\n")
        return 127

    # A signal before these are set ends this process, and the rank with it (its death
    # signal), as it ended the rank when it was this process.
    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for name in FORWARDED:
        sig = getattr(signal, name)
        if signal.getsignal(sig) is not signal.SIG_IGN:  # ignored stays ignored, as with exec
            signal.signal(sig, forward)
    rc = child.wait()
    if rc < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set
            signal.signal(-rc, signal.SIG_DFL)
        os.kill(os.getpid(), -rc)
        return 128 - rc  # a signal whose default is not to end the process
    if rc:
        sys.stderr.write(RANK_EXITED.format(rank=os.environ.get("RANK", "?"), code=rc) + "\n")
        sys.stderr.flush()
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rank"]:
        rest = argv[2:] if argv[1:2] == ["--"] else argv[1:]
        if not rest:
            sys.stderr.write("usage: launch_watch.py rank -- PROGRAM ARGS...\n")
            return 2
        return run_rank(rest)
    return Watch(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())

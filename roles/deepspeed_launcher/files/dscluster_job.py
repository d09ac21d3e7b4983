#!/usr/bin/python3 -I
"""The job supervisor on the head: root's, installed in /opt/dscluster/bin by launch.yml.

    dscluster_job.py start ID      start the job whose spec launch.yml wrote (job.json), in a
                                   transient systemd unit (dscluster-job-ID) when systemd runs
                                   the node, else in a session of its own; returns at once
    dscluster_job.py supervise ID  the supervisor itself (what `start` runs)
    dscluster_job.py follow ID [--offset N] [--no-wait]
                                   the job's log from byte N, then (unless --no-wait) every new
                                   line until the job ended, then its end: JSON lines
    dscluster_job.py list          every job record's state, one JSON document
    dscluster_job.py stop ID [--wait S]
                                   SIGTERM to the job's launcher (launch_watch.py ends every
                                   rank on every node), then its end

Every record lives in /var/lib/dscluster/jobs/ID (root's, 0700): job.json (the spec, written
by root), launcher.log (everything the launcher printed, as root read it from the pipe),
state.json (this file's schema: STATE_KEYS), exit_status and the job's named outputs. The
training user's processes never write there, so what `dscluster jobs`, `logs` and `launch`
report is root's. The launcher runs as the training user (runuser: its PAM limits), in the
job directory, under `timeout` only when the spec gives one.

With a `restart` part in the spec (launch --max-restarts) the supervisor also recovers the job,
with no controller attached. When an attempt ends non-zero, root probes the sshd of each of its
nodes itself (probe: a node that sends no SSH banner within PROBE_TIMEOUT is lost) and decides
from that and the exit status alone (decide). A restart is planned as the training user, by
the controller's own planner staged with the job (dscluster_replan.pyz, run with the head's
/usr/bin/python3 -I -S): it writes the next attempt's job directory and prints what it made,
which root checks and records but never runs as itself. Each attempt is in state.json's
`attempts` (ATTEMPT_KEYS), its first byte in launcher.log at `log_from`.

`follow` frames every line as JSON ({"o": text, "t": head time, "at": offset after it}), so a
job that prints what looks like the end cannot end or judge the stream; the last frame is
{"end": state, "files": {name: text}}. Only the standard library, run with -I.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

RECORDS = "/var/lib/dscluster/jobs"
SELF = "/opt/dscluster/bin/dscluster_job.py"
SCHEMA = 1
# A job id: launch.py's run ids (launch-20261207T183000123456, smoke-..., -a2 for attempts).
ID_RE = re.compile(r"[a-z][a-z0-9]*-[0-9]{8}T[0-9]{6,12}(?:-[a-z0-9]{1,8})?")
# The job's own line after each optimizer step (rank 0), as launch_watch.py reads it.
STEP_RE = re.compile(r"\bDSCLUSTER_STEP (\d+)\b")
STATE_KEYS = (
    "schema", "id", "state", "rc", "pid", "started", "ended", "last_step", "first_step_at",
    "stop_requested", "launcher", "nodes", "ranks", "timeout", "run_id", "dir", "attempts",
    "stopped",
)  # fmt: skip
# One attempt in state.json's `attempts` (launch --max-restarts: one per run of launch.sh).
ATTEMPT_KEYS = (
    "restart", "run_id", "dir", "nodes", "ranks", "started", "ended", "rc", "ended_why",
    "lost", "resumed_from", "tag_at_end", "steps", "log_from", "first_step_at",
)  # fmt: skip
STATES = ("starting", "running", "exited", "stopped", "lost")
# The states of a job whose supervisor has not written its end.
RUNNING = STATES[:2]
# The record's own files: never a job output's name.
RECORD_FILES = ("job.json", "state.json", "launcher.log", "exit_status")
# How often the state file is rewritten while lines come (the last step it holds).
STATE_EVERY = 2.0
# A line longer than this is cut in the frame (the log keeps it whole).
FRAME_MAX = 64 * 1024
FETCH_MAX = 4 * 1024 * 1024
# A node's sshd, as root probes it after an attempt ended (the cluster's ssh port).
SSH_PORT = 22
PROBE_TIMEOUT = 5.0
# What the restart planner may print (one JSON line) and how long it may take.
REPLAN_MAX = 64 * 1024
REPLAN_TIMEOUT = 600
REPLAN = "dscluster_replan.pyz"
# A checkpoint tag as the planner reports it: DeepSpeed's tag, one plain name.
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
# The exit codes of `timeout`: the time limit, never a lost node or a script error.
TIME_LIMIT_RCS = (124, 137)


class Refused(Exception):
    """One line for the controller: the job, the value and the fix."""


def record_dir(job_id: str) -> str:
    if not ID_RE.fullmatch(job_id):
        raise Refused(
            f"job {job_id!r} is not a dscluster job id, e.g. launch-20261207T183000123456"
        )
    return os.path.join(RECORDS, job_id)


def read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: str, data: dict) -> None:
    """Atomic, root's 0600, in root's record directory."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def new_state(spec: dict, job_id: str) -> dict:
    return {
        "schema": SCHEMA,
        "id": job_id,
        "state": "starting",
        "rc": None,
        "pid": None,
        "started": time.time(),
        "ended": None,
        "last_step": None,
        "first_step_at": None,
        "stop_requested": False,
        "launcher": str(spec.get("launcher", "")),
        "nodes": [str(n) for n in spec.get("nodes", [])],
        "ranks": int(spec.get("ranks", 0)),
        "timeout": int(spec.get("timeout", 0)),
        "run_id": job_id,
        "dir": str(spec.get("dir", "")),
        "attempts": [],
        "stopped": "",
    }


def load_spec(rec: str) -> dict:
    spec = read_json(os.path.join(rec, "job.json"))
    if spec is None:
        raise Refused(f"no job record {rec}/job.json; start jobs with dscluster launch")
    for key in ("user", "dir"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            raise Refused(f"{rec}/job.json: {key} missing")
    return spec


def as_user(user: str) -> list[str]:
    """The prefix that runs a command as the training user (PAM's limits included)."""
    return ["runuser", "-u", user, "--"]


IN_DIR = 'umask 077; cd -- "$1" && shift && exec "$@"'


def launcher_argv(spec: dict, job_dir: str | None = None) -> list[str]:
    """The launcher as the training user, in its job directory (the attempt's): launch.sh,
    under `timeout` (45 s more for launch_watch.py's clean-up, then KILL) only when the spec
    gives one."""
    cmd = ["./launch.sh"]
    if int(spec.get("timeout", 0)) > 0:
        cmd = ["timeout", "--kill-after=45", str(int(spec["timeout"])), *cmd]
    return [*as_user(spec["user"]), "bash", "-c", IN_DIR, "launch", job_dir or spec["dir"], *cmd]


def probe(host: str, port: int = SSH_PORT, timeout: float = PROBE_TIMEOUT) -> str:
    """Why `host` is lost ("" when its sshd sends its banner within `timeout`): a frozen
    node's kernel still accepts the connection, its sshd says nothing."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            banner = conn.recv(64)
    except socket.gaierror:
        return "its name does not resolve"
    except TimeoutError:
        return f"no answer from its sshd within {timeout:g} s"
    except OSError as exc:
        return f"its sshd on port {port}: {exc.strerror or exc}"
    return "" if banner.startswith(b"SSH-") else f"no SSH banner on port {port}"


def lost_of(nodes: list[str], head: str, check=probe) -> dict[str, str]:
    """The nodes other than the head that `check` finds lost, host -> why, probed at once."""
    others = [h for h in nodes if h != head]
    if not others:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(others))) as pool:
        whys = list(pool.map(check, others))
    return {h: why for h, why in zip(others, whys, strict=True) if why}


def decide(
    policy: dict, rc: int, lost: dict[str, str], nodes: list[str], used: int, timeout: int = 0
) -> tuple[str, list[str] | None, str]:
    """Pure, root's: after an attempt on `nodes` that exited `rc` with `lost` (probe) and
    `used` restarts before it, (how it ended, the nodes of the next attempt or None, why the
    job stops short of its own end: "" when it ended by itself). A lost head never comes
    here: the supervisor runs on it."""
    if rc == 0:
        return "ok", None, ""
    if timeout > 0 and rc in TIME_LIMIT_RCS:
        return "time limit", None, "the time limit (--timeout) is not retried"
    if not lost:
        if not policy.get("retry_on_error"):
            why = "a script error is not retried (--retry-on-error retries it)"
            return "script error", None, why
        ended, survivors = "script error", list(nodes)
    else:
        ended = f"lost nodes {','.join(lost)}"
        survivors = [h for h in nodes if h not in lost]
        if len(survivors) < int(policy.get("min_nodes", 1)):
            why = (
                f"{len(survivors)} node(s) left ({', '.join(survivors) or 'none'}) after "
                f"losing {', '.join(lost)}, fewer than --min-nodes {policy.get('min_nodes', 1)}"
            )
            return ended, None, why
    limit = int(policy.get("max_restarts", 0))
    if used >= limit:
        return ended, None, f"{used} of --max-restarts {limit} used"
    return ended, survivors, ""


def planned(text: str, expect_id: str, survivors: list[str], head: str) -> dict:
    """The planner's one JSON line, checked: its run id the one asked for, its nodes some of
    the survivors with the head first, a plain tag. Refused otherwise."""
    try:
        got = json.loads(text.strip().splitlines()[-1]) if text.strip() else None
    except ValueError:
        got = None
    if not isinstance(got, dict):
        raise Refused("the restart planner printed no plan")
    nodes, ranks, tag = got.get("nodes"), got.get("ranks"), got.get("resumed_from", "")
    tag_at_end = got.get("tag_at_end", "")
    if got.get("run_id") != expect_id:
        raise Refused(f"the restart planner made run {got.get('run_id')!r}, not {expect_id}")
    if (
        not isinstance(nodes, list)
        or not nodes
        or nodes[0] != head
        or not set(nodes) <= set(survivors)
        or len(set(nodes)) != len(nodes)
    ):
        raise Refused(f"the restart planner chose nodes {nodes!r} of {survivors}")
    if not isinstance(ranks, int) or not 0 < ranks <= 1 << 20:
        raise Refused(f"the restart planner gave {ranks!r} ranks")
    for value in (tag, tag_at_end):
        if value != "" and not (isinstance(value, str) and TAG_RE.fullmatch(value)):
            raise Refused(f"the restart planner gave the checkpoint tag {value!r}")
    steps = got.get("steps")
    return {
        "run_id": expect_id,
        "nodes": [str(n) for n in nodes],
        "ranks": ranks,
        "resumed_from": tag,
        "tag_at_end": tag_at_end,
        "steps": steps if isinstance(steps, int) else None,
    }


def start(job_id: str) -> int:
    rec = record_dir(job_id)
    spec = load_spec(rec)
    state_path = os.path.join(rec, "state.json")
    if read_json(state_path) is not None:
        raise Refused(f"job {job_id} was started already; start a new one with dscluster launch")
    write_json(state_path, new_state(spec, job_id))
    argv = [sys.executable, "-I", SELF, "supervise", job_id]
    if os.path.isdir("/run/systemd/system"):
        # KillMode=mixed: `systemctl stop` sends SIGTERM to the supervisor alone, which hands
        # it to the launcher; what is left after TimeoutStopSec is killed.
        subprocess.run(
            ["systemd-run", "--quiet", "--collect", f"--unit=dscluster-job-{job_id}",
             "--property=KillMode=mixed", "--property=TimeoutStopSec=120",
             f"--description=dscluster job {job_id}", *argv],
            check=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    else:
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    print(json.dumps({"started": job_id}))
    return 0


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


class Supervisor:
    """Runs the launcher, keeps its output and its end in root's record."""

    def __init__(self, job_id: str):
        self.id = job_id
        self.rec = record_dir(job_id)
        self.spec = load_spec(self.rec)
        self.state_path = os.path.join(self.rec, "state.json")
        self.state = read_json(self.state_path) or new_state(self.spec, job_id)
        self.proc: subprocess.Popen | None = None
        self.saved = 0.0

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.saved >= STATE_EVERY:
            write_json(self.state_path, self.state)
            self.saved = now

    def on_term(self, signum, frame) -> None:
        """Hand SIGTERM to the launcher itself (runuser's child): runuser would KILL it 2 s
        later, before launch_watch.py has ended the ranks on the other nodes."""
        # a flag only: the handler may run while save() writes (saved with the next line)
        self.state["stop_requested"] = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            for pid in children(proc.pid) or [proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def copy_to_job_dir(self, job_dir: str) -> subprocess.Popen | None:
        """The training user's copy of the attempt's log, in its job directory (written as
        it)."""
        try:
            return subprocess.Popen(
                [*as_user(self.spec["user"]), "bash", "-c",
                 'umask 077; exec cat > "$1"/launcher.log', "log", job_dir],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        except OSError:
            return None

    def say(self, log_fd: int, text: str) -> None:
        """A line of the supervisor's own in the log (a restart, why it stopped)."""
        os.write(log_fd, f"dscluster: {text}\n".encode())

    def run(self) -> int:
        os.umask(0o077)
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        log_fd = os.open(
            os.path.join(self.rec, "launcher.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
            0o600,
        )
        policy = self.spec.get("restart") if isinstance(self.spec.get("restart"), dict) else None
        attempt = new_attempt(
            0, self.id, self.spec["dir"], self.state["nodes"], self.state["ranks"], ""
        )
        self.state.update(state="running", pid=os.getpid())
        left = dict((policy or {}).get("left") or {})
        while True:
            rc = self.run_attempt(attempt, log_fd)
            if policy is None or self.state["stop_requested"]:
                attempt["ended_why"] = ended_plainly(rc, self.state["stop_requested"])
                break
            lost = lost_of(attempt["nodes"], str(policy.get("head", ""))) if rc else {}
            ended, survivors, why = decide(
                policy, rc, lost, attempt["nodes"], attempt["restart"], self.state["timeout"]
            )
            attempt.update(ended_why=ended, lost=lost)
            if lost:
                who = "; ".join(f"{h}: {w}" for h, w in lost.items())
                self.say(log_fd, f"attempt {attempt['restart']} lost {', '.join(lost)} ({who})")
            if survivors is None or self.state["stop_requested"]:
                self.state["stopped"] = why
                break
            left.update(lost)
            try:
                attempt = self.replan(attempt, policy, left, bool(lost), log_fd)
            except Refused as exc:
                self.state["stopped"] = f"the restart cannot be planned: {exc}"
                break
            if self.state["stop_requested"]:
                break  # stopped while planning: the next attempt never starts
        if self.state["stopped"]:
            self.say(log_fd, f"stopped: {self.state['stopped']}")
        os.close(log_fd)
        self.fetch(self.state["dir"])
        rc = self.state["attempts"][-1]["rc"]
        with open(os.path.join(self.rec, "exit_status"), "w", encoding="ascii") as f:
            f.write(f"{rc}\n")
        self.state.update(
            state="stopped" if self.state["stop_requested"] else "exited",
            rc=rc,
            ended=time.time(),
        )
        self.save(force=True)
        return 0

    def run_attempt(self, attempt: dict, log_fd: int) -> int:
        """One run of launch.sh in the attempt's job directory; its exit code (128 + N for a
        signal N), its lines appended to root's log."""
        attempt["log_from"] = os.lseek(log_fd, 0, os.SEEK_END)
        attempt["started"] = time.time()
        if attempt not in self.state["attempts"]:
            self.state["attempts"].append(attempt)
        self.state.update(
            run_id=attempt["run_id"], dir=attempt["dir"], nodes=attempt["nodes"],
            ranks=attempt["ranks"],
        )  # fmt: skip
        copy = self.copy_to_job_dir(attempt["dir"])
        self.proc = subprocess.Popen(
            launcher_argv(self.spec, attempt["dir"]),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
        self.save(force=True)
        if self.state["stop_requested"]:
            self.on_term(signal.SIGTERM, None)  # stopped while the launcher was starting
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, b""):
            os.write(log_fd, line)
            if copy is not None and copy.stdin is not None:
                try:
                    copy.stdin.write(line)
                    copy.stdin.flush()
                except OSError:
                    copy = None
            m = STEP_RE.search(line.decode(errors="replace"))
            if m:
                now = time.time()
                self.state["last_step"] = int(m[1])
                if self.state["first_step_at"] is None:
                    self.state["first_step_at"] = now
                if attempt["first_step_at"] is None:
                    attempt["first_step_at"] = now
            self.save()
        rc = self.proc.wait()
        if copy is not None and copy.stdin is not None:
            with contextlib.suppress(OSError):
                copy.stdin.close()
            copy.wait()
        rc = 128 - rc if rc < 0 else rc
        attempt.update(ended=time.time(), rc=rc)
        self.save(force=True)
        return rc

    def replan(self, attempt: dict, policy: dict, left: dict, lost: bool, log_fd: int) -> dict:
        """The next attempt, planned as the training user by the staged planner in the first
        attempt's directory; its plan checked (planned), the attempt before completed with
        the checkpoint it left."""
        k = attempt["restart"] + 1
        run_id = f"{self.id}-r{k}"
        argv = [
            *as_user(self.spec["user"]), "bash", "-c", IN_DIR, "replan", self.spec["dir"],
            "/usr/bin/python3", "-I", "-S", REPLAN, "replan.json", "--restart", str(k),
            "--prev-dir", attempt["dir"], "--prev-ranks", str(attempt["ranks"]),
            "--resumed", attempt["resumed_from"], "--left", json.dumps(left),
            *(["--lost"] if lost else []),
        ]  # fmt: skip
        try:
            got = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=REPLAN_TIMEOUT,
                check=False, cwd="/",
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise Refused(f"the planner took over {REPLAN_TIMEOUT} s") from None
        if got.returncode != 0:
            err = got.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
            raise Refused(err[-1][:300])
        pool = [str(h) for h in policy.get("pool", []) if h not in left]
        plan = planned(
            got.stdout[-REPLAN_MAX:].decode(errors="replace"),
            run_id,
            pool,
            str(policy.get("head", "")),
        )
        attempt.update(tag_at_end=plan["tag_at_end"], steps=plan["steps"])
        tag = plan["resumed_from"]
        self.say(
            log_fd,
            f"restart {k} of {policy.get('max_restarts')}: {len(plan['nodes'])} nodes, "
            f"{plan['ranks']} ranks, run {run_id}, "
            + (f"resuming from {tag}" if tag else "no checkpoint to resume from"),
        )
        job_dir = os.path.join(os.path.dirname(self.spec["dir"]), run_id)
        return new_attempt(k, run_id, job_dir, plan["nodes"], plan["ranks"], tag)

    def fetch(self, job_dir: str) -> None:
        """The job's named outputs, read as the training user, into root's record."""
        for name in self.spec.get("fetch", []):
            if not fetchable(name):
                continue
            dest = os.path.join(self.rec, name)
            got = subprocess.run(
                [*as_user(self.spec["user"]), "head", "-c", str(FETCH_MAX),
                 "--", os.path.join(job_dir, name)],
                stdin=subprocess.DEVNULL, capture_output=True, check=False,
            )  # fmt: skip
            if got.returncode == 0:
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(got.stdout)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(dest)


def new_attempt(
    restart: int, run_id: str, job_dir: str, nodes: list, ranks: int, resumed_from: str
) -> dict:
    return {
        "restart": restart, "run_id": run_id, "dir": job_dir, "nodes": list(nodes),
        "ranks": ranks, "started": None, "ended": None, "rc": None, "ended_why": "",
        "lost": {}, "resumed_from": resumed_from, "tag_at_end": "", "steps": None,
        "log_from": 0, "first_step_at": None,
    }  # fmt: skip


def ended_plainly(rc: int, stopped: bool) -> str:
    """How a job without restarts ended."""
    if stopped:
        return "stopped"
    return "ok" if rc == 0 else f"exited {rc}"


def fetchable(name: object) -> bool:
    """A job output's name: a plain file name that is none of the record's own files."""
    return (
        isinstance(name, str)
        and bool(name)
        and "/" not in name
        and not name.startswith(".")
        and name not in RECORD_FILES
    )


def alive(state: dict, job_id: str) -> bool:
    """Whether the supervisor that wrote `state` still runs (its pid, its command line)."""
    pid = state.get("pid")
    if not isinstance(pid, int):
        # "starting": the unit has not run the supervisor yet; give it a minute.
        return time.time() - float(state.get("started") or 0) < 60
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return False
    return b"supervise" in words and job_id.encode() in words


def current(rec: str, job_id: str) -> dict | None:
    """The record's state, "lost" where its supervisor is gone without writing its end."""
    state = read_json(os.path.join(rec, "state.json"))
    if state is None:
        return None
    if state.get("state") in RUNNING and not alive(state, job_id):
        state = dict(state, state="lost")
    return state


def files_of(rec: str, spec: dict) -> dict:
    out = {}
    for name in ["exit_status", *filter(fetchable, spec.get("fetch", []))]:
        try:
            fd = os.open(os.path.join(rec, name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            out[name] = f.read(FETCH_MAX).decode(errors="replace")
    return out


READ_MAX = 1 << 20


def read_from(path: str, pos: int) -> bytes:
    """Up to READ_MAX bytes of root's log from `pos` (b"" before it exists)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return b""
    with os.fdopen(fd, "rb") as f:
        f.seek(pos)
        return f.read(READ_MAX)


def emit(frame: dict) -> None:
    sys.stdout.write(json.dumps(frame) + "\n")
    sys.stdout.flush()


def follow(job_id: str, offset: int, wait: bool, poll: float = 0.2) -> int:
    rec = record_dir(job_id)
    if not os.path.isdir(rec):
        raise Refused(f"no job {job_id} on this head; list them with dscluster jobs")
    spec = load_spec(rec)
    log = os.path.join(rec, "launcher.log")
    # pos: the next byte to read; base: where `partial` (a line not ended yet) starts
    pos = base = offset
    partial, said = b"", None
    while True:
        state = current(rec, job_id) or {"state": "starting"}
        ended = state.get("state") not in RUNNING
        chunk = read_from(log, pos)
        pos += len(chunk)
        *lines, partial = (partial + chunk).split(b"\n")
        for line in lines:
            base += len(line) + 1
            emit({"o": line.decode(errors="replace")[:FRAME_MAX], "t": time.time(), "at": base})
        if len(chunk) == READ_MAX:
            continue
        brief = {k: state.get(k) for k in ("state", "last_step", "rc")}
        if brief != said:
            emit({"s": state})
            said = brief
        if ended or not wait:
            # A line not ended yet goes out only with the job's end: a follow that goes on
            # from `at` (logs -f after --tail) reads it whole.
            if partial and ended:
                text = partial.decode(errors="replace")[:FRAME_MAX]
                emit({"o": text, "t": time.time(), "at": pos})
            emit({"end": state if ended else None, "files": files_of(rec, spec) if ended else {}})
            return 0
        time.sleep(poll)


def list_jobs() -> int:
    jobs = []
    try:
        names = sorted(os.listdir(RECORDS))
    except FileNotFoundError:
        names = []
    for name in names:
        rec = os.path.join(RECORDS, name)
        if not ID_RE.fullmatch(name) or not os.path.isdir(rec):
            continue
        state = current(rec, name)
        if state is None:
            # a record from before the supervisor: its exit status only
            status = files_of(rec, {}).get("exit_status", "").strip()
            state = {"id": name, "state": "exited" if status else "unknown"}
            state["rc"] = int(status) if status.lstrip("-").isdigit() else None
        jobs.append(state)
    emit({"jobs": jobs})
    return 0


def stop(job_id: str, wait: float) -> int:
    rec = record_dir(job_id)
    state = current(rec, job_id)
    if state is None:
        raise Refused(f"no job {job_id} on this head; list them with dscluster jobs")
    if state["state"] not in RUNNING:
        raise Refused(f"job {job_id} has ended already ({state['state']}, exit {state.get('rc')})")
    end, sent = time.time() + wait, False
    while time.time() < end:
        # a job still starting has no supervisor's pid yet: sent once it has
        if not sent and isinstance(state.get("pid"), int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(state["pid"], signal.SIGTERM)
            sent = True
        if state["state"] not in RUNNING:
            break
        time.sleep(0.5)
        state = current(rec, job_id) or state
    emit({"end": state})
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dscluster_job.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("start", "supervise", "follow", "stop"):
        s = sub.add_parser(name)
        s.add_argument("id")
        if name == "follow":
            s.add_argument("--offset", type=int, default=0)
            s.add_argument("--no-wait", action="store_true")
        if name == "stop":
            s.add_argument("--wait", type=float, default=90.0)
    sub.add_parser("list")
    args = p.parse_args(argv)
    try:
        if args.cmd == "start":
            return start(args.id)
        if args.cmd == "supervise":
            return Supervisor(args.id).run()
        if args.cmd == "follow":
            return follow(args.id, max(0, args.offset), not args.no_wait)
        if args.cmd == "stop":
            return stop(args.id, args.wait)
        return list_jobs()
    except Refused as exc:
        emit({"error": str(exc)})
        return 2


if __name__ == "__main__":
    sys.exit(main())

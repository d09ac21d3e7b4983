"""The controller's side of the job supervisor on the head (dscluster_job.py, root's): follow a
job's record live, list the jobs, stop one. One ssh session per call, made from the
inventory's connection variables, as root (sudo -n where Ansible connects as another user).

What comes back is root's record, framed as JSON lines by the supervisor: a job cannot end
or judge the stream by printing something that looks like a frame.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import DsclusterError
from ..inventory import Inventory

SUPERVISOR = ["/usr/bin/python3", "-I", "/opt/dscluster/bin/dscluster_job.py"]
# A lost head is noticed within a minute (ServerAlive*), then retried this many times.
RETRIES = 3
RETRY_DELAYS = (2.0, 5.0, 10.0)
# The schema of a job's state (dscluster_job.py STATE_KEYS); `jobs --json` prints these.
STATE_KEYS = (
    "schema", "id", "state", "rc", "pid", "started", "ended", "last_step", "first_step_at",
    "stop_requested", "launcher", "nodes", "ranks", "timeout", "run_id", "dir", "attempts",
    "stopped",
)  # fmt: skip
# The states of a job still under way (dscluster_job.py RUNNING).
RUNNING = ("starting", "running")
# The record's own files (dscluster_job.py RECORD_FILES): never a job output's name.
RECORD_FILES = ("job.json", "state.json", "launcher.log", "exit_status")
# What `jobs --json` shows of each attempt the supervisor kept (dscluster_job.py ATTEMPT_KEYS).
ATTEMPT_SHOWN = ("rc", "started", "ended", "ended_why", "nodes", "resumed_from", "tag_at_end")
# A restart's id: the launch's id and -rN (restart.py names attempts so).
RESTART_RE = re.compile(r"-r(\d+)$")
# dscluster_job.py's ID_RE: launch-/smoke- + UTC time to the microsecond (+ -rN: a restart).
JOB_ID_RE = re.compile(r"[a-z][a-z0-9]*-[0-9]{8}T[0-9]{6,12}(?:-[a-z0-9]{1,8})?")


class Detached(DsclusterError):
    """Ctrl-C or --detach while a job runs: the job goes on under its supervisor."""

    def __init__(self, inv: Inventory, job_id: str):
        self.job_id = job_id
        src = shlex.quote(str(inv.source))
        super().__init__(
            f"{job_id}: detached, the job runs on under its supervisor on {inv.head}; follow "
            f"it with: dscluster logs -i {src} {job_id} -f; stop it with: dscluster stop -i "
            f"{src} {job_id}"
        )


@dataclasses.dataclass
class JobEnd:
    """A job's end as root's record says: its state (STATE_KEYS) and the files it kept."""

    state: dict[str, Any]
    files: dict[str, str]

    @property
    def rc(self) -> int:
        """The launcher's exit status (root's exit_status), 1 where the record has none."""
        status = self.files.get("exit_status", "").strip()
        return int(status) if status.lstrip("-").isdigit() else 1


def _plain(host: str, name: str, value: Any) -> str:
    text = str(value)
    if "{{" in text or "{%" in text:
        raise DsclusterError(
            f"{host}: {name} is a Jinja template ({text[:60]}); dscluster follows jobs over "
            "plain ssh, so give the value itself in the inventory"
        )
    return text


def ssh_argv(inv: Inventory, host: str) -> list[str]:
    """ssh to `host` as Ansible would (its address, user, port, key, common and extra args),
    never asking for anything (BatchMode), a dead link noticed in a minute."""
    hv: Mapping[str, Any] = inv.hostvars.get(host, {})
    timeout = _plain(host, "ansible_ssh_timeout", hv.get("ansible_ssh_timeout", 30))
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout}"]
    argv += ["-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=6"]
    if key := hv.get("ansible_ssh_private_key_file"):
        argv += ["-i", _plain(host, "ansible_ssh_private_key_file", key)]
    if port := hv.get("ansible_port"):
        argv += ["-p", _plain(host, "ansible_port", port)]
    if user := hv.get("ansible_user"):
        argv += ["-l", _plain(host, "ansible_user", user)]
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        argv += shlex.split(_plain(host, name, hv.get(name, "")))
    return [*argv, "--", _plain(host, "ansible_host", hv.get("ansible_host", host))]


def remote_argv(inv: Inventory, words: Sequence[str]) -> list[str]:
    """The supervisor's command `words` on the head, as root."""
    user = str(inv.var(inv.head, "ansible_user", "root"))
    sudo = [] if user == "root" else ["sudo", "-n", "--"]
    return [*ssh_argv(inv, inv.head), shlex.join([*sudo, *SUPERVISOR, *words])]


def _frames(proc: subprocess.Popen) -> Any:
    assert proc.stdout is not None
    for raw in proc.stdout:
        try:
            frame = json.loads(raw)
        except ValueError:
            continue  # a banner the login printed: not the supervisor's
        if isinstance(frame, dict):
            yield frame


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "no message"


def call(inv: Inventory, words: Sequence[str], *, timeout: float = 180) -> dict[str, Any]:
    """One supervisor command that answers with one frame (list, stop)."""
    try:
        proc = subprocess.run(
            remote_argv(inv, words),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise DsclusterError(
            f"{inv.head}: no answer from the job supervisor in {timeout:g} s"
        ) from exc
    for raw in reversed(proc.stdout.splitlines()):
        try:
            frame = json.loads(raw)
        except ValueError:
            continue
        if isinstance(frame, dict):
            if "error" in frame:
                raise DsclusterError(f"{inv.head}: {frame['error']}")
            return frame
    raise DsclusterError(_no_supervisor(inv, proc.returncode, proc.stderr))


def _no_supervisor(inv: Inventory, rc: int, stderr: str) -> str:
    if rc == 255:
        return f"cannot ssh to the head {inv.head}: {_last_line(stderr)}"
    return (
        f"{inv.head}: the job supervisor did not answer (exit {rc}: {_last_line(stderr)}); "
        f"it comes with the first launch: dscluster launch -i {shlex.quote(str(inv.source))}"
    )


@dataclasses.dataclass
class Followed:
    """Where a follow stopped: the job's end (None while it runs) and the log's offset."""

    end: JobEnd | None
    offset: int


def _line_sink(
    on_line: Callable[[str, float], None] | None, on_at: Callable[[int], None] | None
) -> Callable[[str, float, int], None]:
    """follow's callbacks for one line: its end in the log, then its text and head time."""

    def got_line(text: str, t: float, at: int) -> None:
        if on_at is not None:
            on_at(at)
        if on_line is not None:
            on_line(text, t)

    return got_line


def follow(
    inv: Inventory,
    job_id: str,
    *,
    offset: int = 0,
    wait: bool = True,
    on_line: Callable[[str, float], None] | None = None,
    on_state: Callable[[dict[str, Any]], None] | None = None,
    on_at: Callable[[int], None] | None = None,
    delays: Sequence[float] = RETRY_DELAYS,
) -> Followed:
    """The job's log from byte `offset`, each line to on_line(text, head time) as the head
    wrote it, until the job ended (its JobEnd) or, without `wait`, until the log's end (end
    None when the job still runs), and each line's end in the log to on_at (its byte offset,
    before on_line). A dropped link is taken up again at the next line; a head
    that stays unreachable ends in one line naming it."""
    words = ["follow", job_id]
    if not wait:
        words.append("--no-wait")
    failures: list[str] = []
    got_line = _line_sink(on_line, on_at)
    while True:
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(
                remote_argv(inv, [*words, "--offset", str(offset)]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
            try:
                for frame in _frames(proc):
                    failures.clear()  # the link works: only drops in a row count
                    if "o" in frame:
                        offset = int(frame.get("at", offset))
                        got_line(str(frame["o"]), float(frame.get("t", 0)), offset)
                    elif "s" in frame:
                        if on_state is not None:
                            on_state(frame["s"])
                    elif "error" in frame:
                        raise DsclusterError(f"{inv.head}: {frame['error']}")
                    elif "end" in frame:
                        end = frame["end"]
                        got = JobEnd(end, dict(frame.get("files", {}))) if end else None
                        return Followed(got, offset)
            finally:
                if proc.poll() is None:
                    proc.terminate()
                rc = proc.wait()
                err.seek(0)
                stderr = err.read()
        failures.append(_no_supervisor(inv, rc, stderr))
        if len(failures) > len(delays):
            raise DsclusterError(
                f"lost the head {inv.head} while following job {job_id}: {failures[-1]}; the "
                f"job may still run there: dscluster jobs -i {shlex.quote(str(inv.source))}"
            )
        time.sleep(delays[len(failures) - 1])


def check_job_id(job_id: str) -> str:
    """A job id as launch and smoke make them, refused here before any contact."""
    if not JOB_ID_RE.fullmatch(job_id):
        raise DsclusterError(
            f"job {job_id!r} is not a job id; dscluster jobs lists them, e.g. "
            "launch-20261207T183000123456"
        )
    return job_id


def launch_of(job_id: str) -> str:
    """The launch an attempt belongs to (restart N runs as ID-rN)."""
    return RESTART_RE.sub("", job_id)


def attempt_of(job_id: str) -> int:
    """The attempt's number, from 1 (restart N is attempt N + 1)."""
    m = RESTART_RE.search(job_id)
    return int(m[1]) + 1 if m else 1


def by_launch(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The head's records grouped per launch, oldest first: the last attempt's state, with
    every attempt's id, state, exit status and how it ended. A supervisor that restarts keeps
    the attempts in one record (its `attempts`); records of older launches hold one each."""
    launches: dict[str, dict[str, Any]] = {}
    # by start, so the last attempt's state is the one on top (names sort -r10 before -r2)
    for rec in sorted(records, key=lambda r: float(r.get("started") or 0)):
        launch = launch_of(str(rec.get("id", "")))
        entry = launches.setdefault(launch, {"id": launch, "attempts": []})
        own = [a for a in rec.get("attempts") or [] if isinstance(a, Mapping)]
        for n, a in enumerate(own):
            last = n == len(own) - 1
            entry["attempts"].append(
                {
                    "id": a.get("run_id"),
                    "state": rec.get("state") if last else "exited",
                    **{k: a.get(k) for k in ATTEMPT_SHOWN},
                }
            )
        if not own:
            keys = ("id", "state", "rc", "started", "ended")
            entry["attempts"].append({k: rec.get(k) for k in keys})
        entry.update({k: rec.get(k) for k in STATE_KEYS if k not in ("id", "attempts")})
    return sorted(launches.values(), key=lambda e: float(e["attempts"][0].get("started") or 0))


def list_jobs(inv: Inventory) -> list[dict[str, Any]]:
    """Every job record on the head, oldest first (STATE_KEYS each, as far as known)."""
    jobs = call(inv, ["list"]).get("jobs", [])
    return [j for j in jobs if isinstance(j, dict)]


def stop(inv: Inventory, job_id: str) -> dict[str, Any]:
    """SIGTERM to the job's launcher (launch_watch.py ends its ranks on every node); the
    state once it ended, or as it stands after the supervisor's wait."""
    return dict(call(inv, ["stop", job_id]).get("end") or {})

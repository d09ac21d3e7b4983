"""roles/deepspeed_launcher/files/dscluster_job.py, the head's job supervisor, run for real:
its launcher in a tmp job directory, its record in a tmp RECORDS, no runuser (as_user: [])."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from .. import rolefiles
from .jobfake import head_argv

job = rolefiles.load("deepspeed_launcher", "dscluster_job.py")
ID = "launch-20261207T183000123456"


@pytest.fixture
def records(tmp_path, monkeypatch):
    """RECORDS in tmp, the training user's commands run as this user; the process's signal
    handlers and umask (Supervisor.run sets them) restored after the test."""
    rec = tmp_path / "records"
    rec.mkdir(mode=0o700)
    monkeypatch.setattr(job, "RECORDS", str(rec))
    monkeypatch.setattr(job, "as_user", lambda user: [])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    umask = os.umask(0o022)
    os.umask(umask)
    yield rec
    os.umask(umask)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def job_dir(tmp_path, script: str):
    d = tmp_path / "jobs" / ID
    d.mkdir(parents=True)
    launch = d / "launch.sh"
    launch.write_text("#!/bin/bash\n" + script)
    launch.chmod(0o755)
    return d


def make_record(records, directory, job_id: str = ID, **spec) -> object:
    rec = records / job_id
    rec.mkdir(mode=0o700)
    full = {
        "user": "trainer",
        "dir": str(directory),
        "launcher": "deepspeed",
        "nodes": ["a", "b"],
        "ranks": 2,
        "timeout": 0,
        "fetch": [],
    }
    (rec / "job.json").write_text(json.dumps(full | spec))
    return rec


def state_of(rec) -> dict:
    return json.loads((rec / "state.json").read_text())


def frames(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


# ---------------------------------------------------------------- the supervisor


def test_supervisor_keeps_the_log_the_state_the_exit_status_and_the_outputs(tmp_path, records):
    jd = job_dir(
        tmp_path,
        'echo "starting on $(hostname)"\n'
        "echo 'DSCLUSTER_STEP 1'\n"
        "echo 'to stderr' >&2\n"
        "echo 'rank0: DSCLUSTER_STEP 3 loss 0.5'\n"
        "echo '{\"ok\": true}' > report.json\n"
        "printf 'no newline at the end'\n"
        "exit 3\n",
    )
    rec = make_record(records, jd, fetch=["report.json", "missing.json", "../x", ".hidden"])
    before = time.time()
    assert job.Supervisor(ID).run() == 0

    state = state_of(rec)
    assert sorted(state) == sorted(job.STATE_KEYS)
    assert state["state"] == "exited" and state["rc"] == 3
    assert state["last_step"] == 3 and state["stop_requested"] is False
    assert before <= state["started"] <= state["first_step_at"] <= state["ended"] <= time.time()
    assert state["pid"] == os.getpid() and state["id"] == ID and state["schema"] == job.SCHEMA
    assert (state["launcher"], state["nodes"], state["ranks"], state["timeout"]) == (
        "deepspeed",
        ["a", "b"],
        2,
        0,
    )
    assert (rec / "exit_status").read_text() == "3\n"

    log = (rec / "launcher.log").read_text()
    assert log.splitlines() == [
        f"starting on {os.uname().nodename}",
        "DSCLUSTER_STEP 1",
        "to stderr",
        "rank0: DSCLUSTER_STEP 3 loss 0.5",
        "no newline at the end",
    ]
    # the training user's copy in the job directory holds the same
    assert (jd / "launcher.log").read_text() == log
    assert (rec / "report.json").read_text() == '{"ok": true}\n'
    # a missing output is no file; names with a slash or a leading dot are never read
    assert sorted(p.name for p in rec.iterdir()) == [
        "exit_status",
        "job.json",
        "launcher.log",
        "report.json",
        "state.json",
    ]
    for name in ("exit_status", "launcher.log", "report.json", "state.json"):
        assert stat.S_IMODE((rec / name).stat().st_mode) == 0o600, name


def test_a_job_without_a_step_line_has_no_step(tmp_path, records):
    rec = make_record(records, job_dir(tmp_path, "echo hi\n"))
    job.Supervisor(ID).run()
    state = state_of(rec)
    assert (state["state"], state["rc"], state["last_step"], state["first_step_at"]) == (
        "exited",
        0,
        None,
        None,
    )
    assert (rec / "exit_status").read_text() == "0\n"


def test_the_specs_timeout_cuts_the_launcher(tmp_path, records):
    rec = make_record(records, job_dir(tmp_path, "echo begun\nsleep 30\necho never\n"), timeout=1)
    start = time.monotonic()
    job.Supervisor(ID).run()
    assert time.monotonic() - start < 15
    state = state_of(rec)
    assert (state["state"], state["rc"], state["timeout"]) == ("exited", 124, 1)
    assert (rec / "exit_status").read_text() == "124\n"
    assert (rec / "launcher.log").read_text() == "begun\n"


def test_launcher_argv_runs_launch_sh_in_the_job_dir_as_the_user(monkeypatch):
    monkeypatch.setattr(job, "as_user", lambda user: ["runuser", "-u", user, "--"])
    argv = job.launcher_argv({"user": "t", "dir": "/shared/j", "timeout": 0})
    assert argv[:4] == ["runuser", "-u", "t", "--"]
    assert argv[-3:] == ["launch", "/shared/j", "./launch.sh"]
    argv = job.launcher_argv({"user": "t", "dir": "/shared/j", "timeout": 60})
    assert argv[-6:] == ["launch", "/shared/j", "timeout", "--kill-after=45", "60", "./launch.sh"]


def wait_for(predicate, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


# launch.sh traps TERM and exits 7; it waits in a builtin (no child process of its own).
TRAPS_TERM = (
    "trap 'echo got TERM; exit 7' TERM\n"
    "rm -f hold; mkfifo hold; exec 3<>hold\n"
    "echo ready\n"
    "read -t 30 -u 3\n"
    "echo 'not stopped'\n"
)


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param([], id="launcher-is-the-child"),
        # as runuser does: the launcher is the child of the supervisor's child
        pytest.param(["bash", "-c", '"$@"; exit $?', "runuser"], id="behind-a-runuser-like"),
    ],
)
def test_sigterm_to_the_supervisor_stops_the_launcher(tmp_path, records, prefix):
    rec = make_record(records, job_dir(tmp_path, TRAPS_TERM))
    proc = subprocess.Popen(
        head_argv(records, ["supervise", ID], prefix),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        log = rec / "launcher.log"
        wait_for(lambda: log.exists() and "ready" in log.read_text())
        assert state_of(rec)["state"] == "running"
        assert state_of(rec)["pid"] == proc.pid
        assert job.alive(state_of(rec), ID)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    state = state_of(rec)
    assert (state["state"], state["rc"], state["stop_requested"]) == ("stopped", 7, True)
    assert (rec / "exit_status").read_text() == "7\n"
    assert log.read_text() == "ready\ngot TERM\n"
    assert job.current(str(rec), ID)["state"] == "stopped"


def test_on_term_while_running_in_process(tmp_path, records):
    """on_term itself (the handler the supervisor installs), called from another thread."""
    rec = make_record(records, job_dir(tmp_path, TRAPS_TERM))
    sup = job.Supervisor(ID)
    log = rec / "launcher.log"

    def stop_when_ready() -> None:
        wait_for(lambda: log.exists() and "ready" in log.read_text())
        sup.on_term(signal.SIGTERM, None)

    helper = threading.Thread(target=stop_when_ready, daemon=True)
    helper.start()
    sup.run()
    helper.join(5)
    state = state_of(rec)
    assert (state["state"], state["rc"], state["stop_requested"]) == ("stopped", 7, True)


# ---------------------------------------------------------------- follow


def write_ended(rec, rc: int, **more) -> None:
    state = job.new_state({"launcher": "deepspeed", "nodes": ["a"], "ranks": 1}, rec.name)
    state.update(state="exited", rc=rc, pid=None, ended=time.time(), **more)
    # the supervisor's order: the exit status, then the state that says the job ended
    (rec / "exit_status").write_text(f"{rc}\n")
    (rec / "state.json").write_text(json.dumps(state))


LOG_LINES = [
    "first line",
    '{"end": {"state": "exited", "rc": 0}, "files": {"exit_status": "0"}}',
    '{"o": "a frame of its own", "t": 0, "at": 0}',
    "héllo wörld",
    "",
    "last line",
]


def test_follow_frames_every_line_and_ends_with_roots_end(tmp_path, records, capsys):
    rec = make_record(records, tmp_path, fetch=["report.json"])
    body = "\n".join(LOG_LINES).encode()  # the last line has no newline
    (rec / "launcher.log").write_bytes(body)
    (rec / "report.json").write_text('{"r": 1}')
    write_ended(rec, 5)

    assert job.follow(ID, 0, wait=True, poll=0.01) == 0
    got = frames(capsys.readouterr().out)
    lines = [f for f in got if "o" in f]
    assert [f["o"] for f in lines] == LOG_LINES
    # at: the byte offset after each line (the last one: the log's end)
    ends, at = [], 0
    for text in LOG_LINES[:-1]:
        at += len(text.encode()) + 1
        ends.append(at)
    ends.append(len(body))
    assert [f["at"] for f in lines] == ends
    assert all(isinstance(f["t"], float) for f in lines)
    # one real end, the last frame: root's state and files, never the job's look-alike
    assert [f for f in got if "end" in f] == [got[-1]]
    assert set(got[-1]) == {"end", "files"}
    assert got[-1]["end"]["rc"] == 5 and got[-1]["end"]["state"] == "exited"
    assert got[-1]["files"] == {"exit_status": "5\n", "report.json": '{"r": 1}'}
    # every frame is one of the four kinds
    assert all(set(f) in ({"o", "t", "at"}, {"s"}, {"end", "files"}) for f in got)

    # from the offset after the first line: the second line on
    assert job.follow(ID, ends[0], wait=True, poll=0.01) == 0
    again = [f for f in frames(capsys.readouterr().out) if "o" in f]
    assert [f["o"] for f in again] == LOG_LINES[1:]
    assert [f["at"] for f in again] == ends[1:]


@contextlib.contextmanager
def live_supervisor(rec):
    """A "running" state whose pid is a live process that names `supervise` and the job."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "supervise", ID],
        stdin=subprocess.DEVNULL,
    )
    try:
        # right after the fork its command line may still read empty
        cmdline = pathlib.Path(f"/proc/{holder.pid}/cmdline")
        wait_for(lambda: b"supervise" in cmdline.read_bytes())
        state = dict(job.new_state({}, ID), state="running", pid=holder.pid)
        (rec / "state.json").write_text(json.dumps(state))
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_follow_no_wait_on_a_running_job_ends_with_none(tmp_path, records, capsys):
    rec = make_record(records, tmp_path)
    (rec / "launcher.log").write_text("one\ntwo\n")
    with live_supervisor(rec):
        assert job.follow(ID, 0, wait=False) == 0
    got = frames(capsys.readouterr().out)
    assert [f["o"] for f in got if "o" in f] == ["one", "two"]
    assert [f["s"]["state"] for f in got if "s" in f] == ["running"]
    assert got[-1] == {"end": None, "files": {}}


def test_a_line_not_ended_yet_is_not_cut_in_two(tmp_path, records, capsys):
    rec = make_record(records, tmp_path)
    log = rec / "launcher.log"
    log.write_bytes(b"one\nhal")
    with live_supervisor(rec):
        job.follow(ID, 0, wait=False)
        first = frames(capsys.readouterr().out)
        at = max(f["at"] for f in first if "o" in f)
        log.write_bytes(b"one\nhalf a line\n")
        write_ended(rec, 0)
        job.follow(ID, at, wait=True)
        second = frames(capsys.readouterr().out)
    shown = [f["o"] for f in first + second if "o" in f]
    assert shown == ["one", "half a line"]


def test_follow_waits_for_new_lines_until_the_job_ends(tmp_path, records, capsys):
    rec = make_record(records, tmp_path)
    log = rec / "launcher.log"
    # "starting", no pid yet: alive for its first minute
    (rec / "state.json").write_text(json.dumps(job.new_state({}, ID)))

    def the_job() -> None:
        time.sleep(0.2)
        with log.open("ab") as f:
            f.write(b"step one\nhalf")
        time.sleep(0.2)
        with log.open("ab") as f:
            f.write(b" a line\n")
        time.sleep(0.2)
        write_ended(rec, 0, last_step=1)

    writer = threading.Thread(target=the_job, daemon=True)
    writer.start()
    assert job.follow(ID, 0, wait=True, poll=0.02) == 0
    writer.join(5)
    got = frames(capsys.readouterr().out)
    assert [f["o"] for f in got if "o" in f] == ["step one", "half a line"]
    states = [f["s"]["state"] for f in got if "s" in f]
    assert states[0] == "starting" and states[-1] == "exited"
    assert got[-1]["end"]["state"] == "exited" and got[-1]["files"] == {"exit_status": "0\n"}


def test_follow_of_a_job_not_here_is_refused(records):
    with pytest.raises(job.Refused, match=r"no job .* on this head"):
        job.follow(ID, 0, wait=False)


def test_a_frame_holds_at_most_frame_max(tmp_path, records, capsys, monkeypatch):
    monkeypatch.setattr(job, "FRAME_MAX", 10)
    rec = make_record(records, tmp_path)
    (rec / "launcher.log").write_text("x" * 25 + "\nshort\n")
    write_ended(rec, 0)
    job.follow(ID, 0, wait=True)
    lines = [f for f in frames(capsys.readouterr().out) if "o" in f]
    assert [f["o"] for f in lines] == ["x" * 10, "short"]
    assert [f["at"] for f in lines] == [26, 32]  # the offsets count the whole line


# ---------------------------------------------------------------- current, alive, list


def test_a_running_state_whose_supervisor_is_gone_is_lost(tmp_path, records):
    rec = make_record(records, tmp_path)
    state = job.new_state({}, ID)
    state.update(state="running", pid=os.getpid())  # pytest: no "supervise" in its cmdline
    (rec / "state.json").write_text(json.dumps(state))
    assert job.alive(state, ID) is False
    assert job.current(str(rec), ID)["state"] == "lost"
    assert state_of(rec)["state"] == "running"  # reported, never written
    # a pid that does not exist
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert job.alive(dict(state, pid=gone.pid), ID) is False
    # "starting" (no pid yet): alive for a minute after it was written
    assert job.alive({"pid": None, "started": time.time()}, ID) is True
    assert job.alive({"pid": None, "started": time.time() - 120}, ID) is False
    assert job.current(str(tmp_path / "nowhere"), ID) is None


def test_list_jobs_lists_the_records_and_skips_other_names(tmp_path, records, capsys):
    done = make_record(records, tmp_path, job_id="launch-20261207T183000123456")
    write_ended(done, 3, last_step=9)
    old = records / "smoke-20261101T120000000001"
    old.mkdir()
    (old / "exit_status").write_text("0\n")
    empty = records / "launch-20261101T120000000002-r1"
    empty.mkdir()
    lost = make_record(records, tmp_path, job_id="launch-20261208T000000000000")
    state = job.new_state({}, lost.name)
    state.update(state="running", pid=os.getpid())
    (lost / "state.json").write_text(json.dumps(state))
    (records / "not-a-job").mkdir()
    (records / "launch-20261209T000000000000.tmp").mkdir()
    (records / "launch-20261210T000000000000").write_text("a file, not a record")

    assert job.list_jobs() == 0
    (doc,) = frames(capsys.readouterr().out)
    listed = {j["id"]: j for j in doc["jobs"]}
    assert sorted(listed) == [
        "launch-20261101T120000000002-r1",
        "launch-20261207T183000123456",
        "launch-20261208T000000000000",
        "smoke-20261101T120000000001",
    ]
    assert listed["smoke-20261101T120000000001"] == {
        "id": "smoke-20261101T120000000001",
        "state": "exited",
        "rc": 0,
    }
    assert listed["launch-20261101T120000000002-r1"]["state"] == "unknown"
    assert listed["launch-20261101T120000000002-r1"]["rc"] is None
    assert listed["launch-20261207T183000123456"]["rc"] == 3
    assert listed["launch-20261207T183000123456"]["last_step"] == 9
    assert listed["launch-20261208T000000000000"]["state"] == "lost"


def test_list_jobs_without_records_is_empty(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(job, "RECORDS", str(tmp_path / "none"))
    assert job.list_jobs() == 0
    assert frames(capsys.readouterr().out) == [{"jobs": []}]


# ---------------------------------------------------------------- refusals


def test_stop_of_an_ended_job_is_refused(tmp_path, records):
    write_ended(make_record(records, tmp_path), 0)
    with pytest.raises(job.Refused, match="ended already") as exc:
        job.stop(ID, 0)
    assert "exited, exit 0" in str(exc.value)


def test_stop_of_a_job_with_no_record_is_refused(records):
    with pytest.raises(job.Refused, match="no job"):
        job.stop(ID, 0)


@pytest.mark.parametrize(
    "bad", ["../x", "x", "", "launch-20261207T183000123456/..", ".", "LAUNCH-20261207T183000"]
)
def test_record_dir_refuses_what_is_not_a_job_id(bad):
    with pytest.raises(job.Refused, match="not a dscluster job id"):
        job.record_dir(bad)


def test_record_dir_of_job_ids(records):
    for ok in (ID, "smoke-20261207T183000123456", f"{ID}-r2"):
        assert job.record_dir(ok) == os.path.join(str(records), ok)


def test_start_refuses_a_job_started_already(tmp_path, records):
    rec = make_record(records, tmp_path)
    (rec / "state.json").write_text(json.dumps(job.new_state({}, ID)))
    with pytest.raises(job.Refused, match="started already"):
        job.start(ID)


def test_a_spec_without_user_or_dir_is_refused(records):
    rec = records / ID
    rec.mkdir()
    with pytest.raises(job.Refused, match="no job record"):
        job.load_spec(str(rec))
    (rec / "job.json").write_text(json.dumps({"user": "t"}))
    with pytest.raises(job.Refused, match="dir missing"):
        job.load_spec(str(rec))


@pytest.mark.parametrize(
    "argv",
    [["follow", "nope"], ["stop", "../x"], ["supervise", "x"], ["follow", ID]],
)
def test_main_answers_a_refusal_with_an_error_frame(records, capsys, argv):
    assert job.main(argv) == 2
    (frame,) = frames(capsys.readouterr().out)
    assert set(frame) == {"error"} and "\n" not in frame["error"]
    assert ID in frame["error"] or "not a dscluster job id" in frame["error"]


def test_the_state_schema(records):
    state = job.new_state({"launcher": "mpi", "nodes": ["n1", 2], "ranks": "4"}, ID)
    assert tuple(state) == job.STATE_KEYS
    assert state["state"] in job.STATES and state["nodes"] == ["n1", "2"] and state["ranks"] == 4

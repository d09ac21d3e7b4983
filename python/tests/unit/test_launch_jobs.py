"""The controller's side of the head's job supervisor (dscluster.launch.jobs): the ssh argv
from the inventory, job ids, the jobs grouped per launch, following a record (with the real
dscluster_job.py standing in for the head, no ssh), and the CLI's refusals."""

from __future__ import annotations

import json
import pathlib
import shlex
import subprocess
import sys
import time

import pytest

from dscluster.errors import DsclusterError
from dscluster.inventory import Inventory
from dscluster.launch import jobs

from .. import rolefiles
from .clirun import one_line_error, run_cli, run_main
from .jobfake import head_argv

job = rolefiles.load("deepspeed_launcher", "dscluster_job.py")
ID = "launch-20261207T183000123456"


def inventory(tmp_path: pathlib.Path, head_vars: dict) -> Inventory:
    return Inventory(
        source=tmp_path / "inv",
        groups={"head": ["h1"], "workers": ["h2"], "all": ["h1", "h2"]},
        hostvars={"h1": head_vars, "h2": {"ansible_host": "10.0.0.2"}},
    )


# ---------------------------------------------------------------- ssh from the inventory


def test_ssh_to_a_head_ansible_reaches_as_root(tmp_path):
    inv = inventory(
        tmp_path,
        {
            "ansible_host": "127.0.0.1",
            "ansible_user": "root",
            "ansible_port": 2201,
            "ansible_ssh_private_key_file": "/keys/id ed25519",
            "ansible_ssh_common_args": "-o UserKnownHostsFile='/inv/known hosts' "
            "-o StrictHostKeyChecking=yes",
        },
    )
    argv = jobs.ssh_argv(inv, "h1")
    assert argv[0] == "ssh"
    assert argv[argv.index("BatchMode=yes") - 1] == "-o"
    assert "ConnectTimeout=30" in argv and "ServerAliveInterval=10" in argv
    assert argv[argv.index("-i") + 1] == "/keys/id ed25519"
    assert argv[argv.index("-l") + 1] == "root"
    assert argv[argv.index("-p") + 1] == "2201"
    common = ["-o", "UserKnownHostsFile=/inv/known hosts", "-o", "StrictHostKeyChecking=yes"]
    at = argv.index("UserKnownHostsFile=/inv/known hosts") - 1
    assert argv[at : at + 4] == common
    assert argv[-2:] == ["--", "127.0.0.1"]
    # the options all come before "--", the address last
    assert argv.index("--") == len(argv) - 2

    remote = jobs.remote_argv(inv, ["follow", ID, "--offset", "0"])
    assert remote[:-1] == argv
    assert "sudo" not in remote[-1]
    assert shlex.split(remote[-1]) == [*jobs.SUPERVISOR, "follow", ID, "--offset", "0"]


def test_ssh_to_an_aws_head_goes_through_sudo(tmp_path):
    inv = inventory(
        tmp_path,
        {
            "ansible_host": "ec2-1-2-3-4.compute.amazonaws.com",
            "ansible_user": "admin",
            "ansible_port": "2222",
            "ansible_ssh_timeout": 15,
            "ansible_ssh_extra_args": "-o IdentitiesOnly=yes",
        },
    )
    remote = jobs.remote_argv(inv, ["stop", ID])
    assert remote[0] == "ssh"
    assert remote[remote.index("-p") + 1] == "2222"
    assert remote[remote.index("-l") + 1] == "admin"
    assert "ConnectTimeout=15" in remote and "IdentitiesOnly=yes" in remote
    assert "-i" not in remote  # no key given: ssh's own
    assert remote[-3:-1] == ["--", "ec2-1-2-3-4.compute.amazonaws.com"]
    assert remote[-1].startswith("sudo -n -- ")
    assert shlex.split(remote[-1]) == ["sudo", "-n", "--", *jobs.SUPERVISOR, "stop", ID]


def test_a_head_without_ansible_host_or_user(tmp_path):
    """ssh's defaults: the inventory name as the address; root (no sudo) as Ansible's user."""
    inv = inventory(tmp_path, {})
    remote = jobs.remote_argv(inv, ["list"])
    assert remote[-3:-1] == ["--", "h1"]
    assert "-l" not in remote and "-p" not in remote
    assert shlex.split(remote[-1]) == [*jobs.SUPERVISOR, "list"]


@pytest.mark.parametrize(
    "var",
    ["ansible_host", "ansible_user", "ansible_port", "ansible_ssh_common_args"],
)
def test_a_jinja_value_is_refused_naming_the_host_and_the_variable(tmp_path, var):
    head = {"ansible_host": "10.0.0.1", "ansible_user": "root", var: "{{ hostvars.x.ip }}"}
    with pytest.raises(DsclusterError) as exc:
        jobs.remote_argv(inventory(tmp_path, head), ["list"])
    text = str(exc.value)
    assert text.startswith(f"h1: {var} is a Jinja template")
    assert "\n" not in text


def test_remote_argv_needs_one_head(tmp_path):
    inv = Inventory(source=tmp_path, groups={"head": [], "all": ["h1"]}, hostvars={})
    with pytest.raises(DsclusterError, match="0 hosts in group 'head'"):
        jobs.remote_argv(inv, ["list"])


# ---------------------------------------------------------------- job ids, grouping


@pytest.mark.parametrize(
    "good",
    [ID, "smoke-20261207T183000123456", f"{ID}-r2", "launch-20261207T183000"],
)
def test_check_job_id_accepts_the_ids_launch_and_smoke_make(good):
    assert jobs.check_job_id(good) == good
    assert job.ID_RE.fullmatch(good)  # the head's rule is the same


@pytest.mark.parametrize(
    "bad",
    ["x", f"../{ID}", f"{ID}/..", "", f"{ID}\n", "Launch-20261207T183000123456", f"{ID} -r1"],
)
def test_check_job_id_refuses_in_one_line(bad):
    with pytest.raises(DsclusterError) as exc:
        jobs.check_job_id(bad)
    text = str(exc.value)
    assert "\n" not in text and repr(bad) in text and "dscluster jobs lists them" in text
    assert not job.ID_RE.fullmatch(bad)


def test_the_controllers_id_rule_is_the_heads():
    assert jobs.JOB_ID_RE.pattern == job.ID_RE.pattern


def test_the_state_schema_is_the_heads():
    assert jobs.STATE_KEYS == job.STATE_KEYS
    assert (jobs.RUNNING, jobs.RECORD_FILES) == (job.RUNNING, job.RECORD_FILES)
    assert [jobs.attempt_of(i) for i in (ID, f"{ID}-r1", f"{ID}-r10")] == [1, 2, 11]
    assert tuple(job.new_state({}, ID)) == jobs.STATE_KEYS
    assert set(jobs.ATTEMPT_SHOWN) <= set(job.ATTEMPT_KEYS)
    assert tuple(job.new_attempt(0, ID, "/j", [], 1, "")) == job.ATTEMPT_KEYS


def record(job_id: str, state: str, started: float, rc=None, **more) -> dict:
    rec = dict.fromkeys(jobs.STATE_KEYS)
    rec.update(id=job_id, state=state, started=started, rc=rc, **more)
    return rec


def test_by_launch_groups_the_attempts_of_a_launch():
    records = [
        record(ID, "lost", 100.0, ended=150.0, nodes=["a", "b", "c"], last_step=40),
        record(f"{ID}-r1", "running", 160.0, nodes=["a", "b"], last_step=55),
        record("smoke-20261201T000000000000", "exited", 50.0, rc=0, ended=60.0),
    ]
    got = jobs.by_launch(records)
    assert [e["id"] for e in got] == ["smoke-20261201T000000000000", ID]  # by start
    smoke, launch = got
    assert len(smoke["attempts"]) == 1 and smoke["state"] == "exited" and smoke["rc"] == 0
    # the last attempt's state on top, every attempt below
    assert (launch["state"], launch["nodes"], launch["last_step"]) == ("running", ["a", "b"], 55)
    assert launch["attempts"] == [
        {"id": ID, "state": "lost", "rc": None, "started": 100.0, "ended": 150.0},
        {"id": f"{ID}-r1", "state": "running", "rc": None, "started": 160.0, "ended": None},
    ]
    assert set(launch) == {*jobs.STATE_KEYS, "attempts"}
    assert jobs.by_launch([]) == []


def test_by_launch_lists_the_attempts_one_supervisor_kept():
    """launch --max-restarts: one record, its attempts in the supervisor's state."""
    rec = record(ID, "running", 100.0, nodes=["a", "b"], last_step=12)
    rec["attempts"] = [
        {"run_id": ID, "nodes": ["a", "b", "c"], "rc": 1, "started": 100.0, "ended": 150.0,
         "ended_why": "lost nodes c"},
        {"run_id": f"{ID}-r1", "nodes": ["a", "b"], "rc": None, "started": 160.0,
         "ended": None, "ended_why": ""},
    ]  # fmt: skip
    (entry,) = jobs.by_launch([rec])
    assert set(entry["attempts"][0]) == {"id", "state", *jobs.ATTEMPT_SHOWN}
    assert [(a["id"], a["state"], a["ended_why"]) for a in entry["attempts"]] == [
        (ID, "exited", "lost nodes c"),
        (f"{ID}-r1", "running", ""),
    ]
    assert entry["state"] == "running" and entry["nodes"] == ["a", "b"]


def test_by_launch_takes_an_old_record_without_a_state():
    """A record from before the supervisor: its id, state and rc alone (list_jobs)."""
    (entry,) = jobs.by_launch([{"id": ID, "state": "exited", "rc": 0}])
    assert entry["state"] == "exited" and entry["rc"] == 0 and entry["started"] is None
    assert entry["attempts"] == [
        {"id": ID, "state": "exited", "rc": 0, "started": None, "ended": None}
    ]


def test_by_launch_tops_the_latest_attempt_whatever_the_order_listed():
    records = [
        record(ID, "lost", 100.0),
        *(record(f"{ID}-r{n}", "lost", 100.0 + n) for n in (1, 10)),
        record(f"{ID}-r2", "lost", 102.0),
    ]
    records[2]["state"] = "running"  # -r10, the latest
    (entry,) = jobs.by_launch(records)
    assert [a["id"] for a in entry["attempts"]][-1] == f"{ID}-r10"
    assert entry["state"] == "running"


def test_job_end_rc_is_roots_exit_status():
    assert jobs.JobEnd({}, {"exit_status": "3\n"}).rc == 3
    assert jobs.JobEnd({}, {"exit_status": "-1\n"}).rc == -1
    assert jobs.JobEnd({"rc": 0}, {}).rc == 1  # no record of it: a failure
    assert jobs.JobEnd({}, {"exit_status": "x"}).rc == 1


# ---------------------------------------------------------------- follow, list, stop, no ssh


@pytest.fixture
def head(tmp_path, monkeypatch):
    """The head's records in tmp; every remote command runs dscluster_job.py here."""
    records = tmp_path / "records"
    records.mkdir()
    calls: list[list[str]] = []

    def remote(inv, words):
        calls.append(list(words))
        return head_argv(records, words)

    monkeypatch.setattr(jobs, "remote_argv", remote)
    inv = inventory(tmp_path, {"ansible_host": "10.0.0.1"})
    return inv, records, calls


def make_record(records: pathlib.Path, job_dir: pathlib.Path, job_id: str = ID, **spec):
    rec = records / job_id
    rec.mkdir()
    full = {"user": "trainer", "dir": str(job_dir), "launcher": "deepspeed", "nodes": ["a"]}
    (rec / "job.json").write_text(json.dumps(full | {"ranks": 1, "timeout": 0} | spec))
    return rec


def write_ended(rec: pathlib.Path, rc: int, state: str = "exited") -> None:
    st = job.new_state({"launcher": "deepspeed", "nodes": ["a"]}, rec.name)
    st.update(state=state, rc=rc, ended=time.time())
    (rec / "state.json").write_text(json.dumps(st))
    (rec / "exit_status").write_text(f"{rc}\n")


def test_follow_gives_every_line_in_order_and_roots_end(tmp_path, head):
    inv, records, calls = head
    rec = make_record(records, tmp_path, fetch=["report.json"])
    lines = [
        "h1: starting",
        '{"end": {"state": "exited", "rc": 0}, "files": {"exit_status": "0"}}',
        "h2: DSCLUSTER_STEP 1",
        "",
        "tail without newline",
    ]
    (rec / "launcher.log").write_text("\n".join(lines))
    (rec / "report.json").write_text("{}")
    write_ended(rec, 5)
    seen: list[tuple[str, float]] = []
    states: list[dict] = []
    got = jobs.follow(inv, ID, on_line=lambda t, at: seen.append((t, at)), on_state=states.append)
    assert [t for t, _ in seen] == lines
    assert all(at > 0 for _, at in seen)
    assert got.end is not None and got.end.rc == 5
    assert got.end.state["state"] == "exited" and got.end.state["rc"] == 5
    assert got.end.files == {"exit_status": "5\n", "report.json": "{}"}
    assert got.offset == len("\n".join(lines).encode())
    assert [s["state"] for s in states] == ["exited"]
    assert calls == [["follow", ID, "--offset", "0"]]

    # from an offset, without waiting
    seen.clear()
    first = len(lines[0]) + 1
    again = jobs.follow(inv, ID, offset=first, wait=False, on_line=lambda t, a: seen.append((t, a)))
    assert [t for t, _ in seen] == lines[1:]
    assert again.end is not None and again.end.rc == 5
    assert calls[-1] == ["follow", ID, "--no-wait", "--offset", str(first)]


def test_follow_a_job_the_real_supervisor_runs(tmp_path, head):
    """Start, supervise and follow live: the supervisor as launch.yml's `start` runs it
    (here in a session of its own: no systemd unit), the controller following over 'ssh'."""
    inv, records, _ = head
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "launch.sh").write_text(
        "#!/bin/bash\n"
        'for i in 1 2 3; do echo "h1: DSCLUSTER_STEP $i"; sleep 0.2; done\n'
        "echo '{\"loss\": 1}' > report.json\n"
        "exit 3\n"
    )
    (job_dir / "launch.sh").chmod(0o755)
    make_record(records, job_dir, fetch=["report.json"])
    supervisor = subprocess.Popen(
        head_argv(records, ["supervise", ID]),
        stdin=subprocess.DEVNULL,
    )
    try:
        seen: list[str] = []
        states: list[dict] = []
        got = jobs.follow(inv, ID, on_line=lambda t, _a: seen.append(t), on_state=states.append)
        assert supervisor.wait(20) == 0
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert seen == [f"h1: DSCLUSTER_STEP {i}" for i in (1, 2, 3)]
    assert got.end is not None and got.end.rc == 3
    assert got.end.state["state"] == "exited" and got.end.state["last_step"] == 3
    assert got.end.files == {"exit_status": "3\n", "report.json": '{"loss": 1}\n'}
    assert states[-1]["state"] == "exited"

    # the head's list, grouped per launch
    (entry,) = jobs.by_launch(jobs.list_jobs(inv))
    assert entry["id"] == ID and entry["rc"] == 3 and len(entry["attempts"]) == 1
    # stopping it now: refused by the head in one line naming it
    with pytest.raises(DsclusterError, match=f"^h1: job {ID} has ended already"):
        jobs.stop(inv, ID)


def test_follow_of_a_job_not_on_the_head_is_the_heads_error(head):
    inv, _, calls = head
    with pytest.raises(DsclusterError, match=f"^h1: no job {ID} on this head"):
        jobs.follow(inv, ID, delays=(0, 0))
    assert len(calls) == 1  # an answer, not a lost link: no retry


def test_follow_retries_then_names_the_lost_head(tmp_path, monkeypatch):
    calls = []

    def remote(inv, words):
        calls.append(words)
        return ["false"]

    monkeypatch.setattr(jobs, "remote_argv", remote)
    inv = inventory(tmp_path, {})
    with pytest.raises(DsclusterError) as exc:
        jobs.follow(inv, ID, delays=(0, 0))
    text = str(exc.value)
    assert text.startswith(f"lost the head h1 while following job {ID}: ")
    assert "exit 1" in text and "dscluster jobs -i" in text and "\n" not in text
    assert len(calls) == 3  # the first try and one per delay


def test_an_unreachable_head_says_ssh(tmp_path, monkeypatch):
    code = (
        "import sys; sys.stderr.write('ssh: connect to host h1: Connection refused\\n'); "
        "sys.exit(255)"
    )
    monkeypatch.setattr(jobs, "remote_argv", lambda inv, words: [sys.executable, "-c", code])
    inv = inventory(tmp_path, {})
    with pytest.raises(DsclusterError, match=r"cannot ssh to the head h1: .*Connection refused"):
        jobs.follow(inv, ID, delays=(0,))
    with pytest.raises(DsclusterError, match=r"^cannot ssh to the head h1: .*Connection refused"):
        jobs.list_jobs(inv)


# A head that drops the link after each line it sends (ssh exit 255), every try progressing:
# line N+1 of 5 from offset N, then the end.
FLAKY = """
import json, sys
offset = int(sys.argv[sys.argv.index("--offset") + 1])
if offset >= 5:
    print(json.dumps({"end": {"state": "exited", "rc": 0}, "files": {"exit_status": "0\\n"}}))
    sys.exit(0)
print(json.dumps({"o": f"line {offset + 1}", "t": 0.0, "at": offset + 1}), flush=True)
sys.exit(255)
"""


def test_follow_takes_up_a_link_that_drops_now_and_then(tmp_path, monkeypatch):
    monkeypatch.setattr(
        jobs, "remote_argv", lambda inv, words: [sys.executable, "-c", FLAKY, *words]
    )
    seen: list[str] = []
    got = jobs.follow(
        inventory(tmp_path, {}), ID, on_line=lambda t, _a: seen.append(t), delays=(0, 0)
    )
    assert seen == [f"line {n}" for n in range(1, 6)]
    assert got.end is not None and got.end.rc == 0


def test_follow_takes_up_a_dropped_link_at_the_next_line(tmp_path, monkeypatch):
    """Each try starts from the offset after the last line seen, and a try that brought a
    line resets the count of drops: only drops in a row end the follow."""
    words_seen: list[list[str]] = []

    def remote(inv, words):
        words_seen.append(list(words))
        return [sys.executable, "-c", FLAKY, *words]

    monkeypatch.setattr(jobs, "remote_argv", remote)
    seen: list[str] = []
    got = jobs.follow(
        inventory(tmp_path, {}), ID, on_line=lambda t, _a: seen.append(t), delays=(0,)
    )
    assert seen == [f"line {n}" for n in range(1, 6)]
    assert [w[-1] for w in words_seen] == ["0", "1", "2", "3", "4", "5"]
    assert got.end is not None and got.end.rc == 0


# ---------------------------------------------------------------- the command line


@pytest.fixture
def no_contact(monkeypatch):
    """Any inventory load or remote command fails the test."""

    def contacted(*a, **k):
        raise AssertionError(f"contacted: {a}")

    monkeypatch.setattr(jobs, "remote_argv", contacted)
    monkeypatch.setattr("dscluster.inventory.load", contacted)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["logs", "nope"], "job 'nope' is not a job id"),
        (["logs", ID, "--tail", "-1"], "--tail"),
        (["logs", ID, "--tail", "x"], "--tail"),
        (["stop", "../x"], "job '../x' is not a job id"),
        (["logs", f"../{ID}", "-f"], "is not a job id"),
    ],
)
def test_cli_refuses_bad_arguments_in_one_line_before_any_contact(tmp_path, no_contact, argv, says):
    cmd, *rest = argv
    inv = str(tmp_path / "no-such-inventory")
    line = one_line_error(run_main(cmd, "-i", inv, *rest), 2)
    assert says in line, line


def test_cli_logs_without_a_job_is_refused(tmp_path, no_contact):
    line = one_line_error(run_main("logs", "-i", str(tmp_path)), 2)
    assert "job" in line


def test_cli_jobs_logs_and_stop_against_the_head(tmp_path, inventory_dir, head, capsys):
    """The commands end to end, the head's supervisor standing in for ssh."""
    _, records, calls = head
    rec = make_record(records, tmp_path)
    (rec / "launcher.log").write_text("".join(f"node-a: line {n}\n" for n in range(1, 6)))
    write_ended(rec, 0)
    make_record(records, tmp_path, job_id=f"{ID}-r1")
    write_ended(records / f"{ID}-r1", 4, state="stopped")

    rc, out, err = run_cli("jobs", "-i", str(inventory_dir), "--json")
    assert rc == 0, err
    (launch,) = json.loads(capsys.readouterr().out)["jobs"]
    assert launch["id"] == ID and len(launch["attempts"]) == 2
    assert (launch["state"], launch["rc"]) == ("stopped", 4)

    rc, out, err = run_cli("jobs", "-i", str(inventory_dir))
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.startswith(ID))
    assert "stopped (4)" in row and "deepspeed" in row

    rc, out, err = run_cli("logs", "-i", str(inventory_dir), ID, "--tail", "2")
    assert rc == 0, err
    assert out == "node-a: line 4\nnode-a: line 5\n"
    assert f"{ID}: exited, exit 0" in err

    rc, out, err = run_cli("logs", "-i", str(inventory_dir), ID, "--host", "node-b")
    assert rc == 0, err
    assert out == ""

    line = one_line_error(run_cli("stop", "-i", str(inventory_dir), ID))
    assert f"job {ID} has ended already (exited, exit 0)" in line
    assert all(c[0] in ("list", "follow", "stop") for c in calls)

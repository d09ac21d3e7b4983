"""launch --max-restarts on the head: the supervisor (dscluster_job.py) decides from the exit
code and its own probe of each node, and the staged planner (replan.py, run for real as
dscluster_replan.pyz with /usr/bin/python3 -I -S) writes each restart's job directory. The
launcher is stood in by a script that plays each attempt's end; the nodes' loss is stood in
for lost_of, and probe itself runs against real sockets."""

from __future__ import annotations

import json
import pathlib
import socket
import threading

import pytest

from dscluster.hostfile import render_hostfile
from dscluster.launch import JobSite, LaunchRequest
from dscluster.launch import replan as planner
from dscluster.launch.restart import CHECKPOINT_STATE, RunRecord

from .test_job_supervisor import ID, job, records, state_of  # noqa: F401 - records: fixture

POOL = {"h1": 2, "h2": 2, "h3": 2}
ENV = "PATH=/opt/v/bin:/usr/bin\n"
CKPT = f"/shared/ckpt/{ID}"
# Plays the attempt named by its job directory: prints its lines, leaves its checkpoint
# state, exits with its code (behave/<attempt's id>/{lines,state,rc}).
PLAYER = """\
d="$1"; b="$2/$(basename "$d")"
cat "$b/lines" 2>/dev/null
if [ -f "$b/state" ]; then cp "$b/state" "$d/checkpoint_state.json"; fi
exit "$(cat "$b/rc")"
"""


def ckpt(tag: str, entries: int = 2, shards=None) -> str:
    state: dict = {"latest": tag, "tag_entries": entries}
    if shards is not None:
        state["zero_shards"] = shards
    return json.dumps(state)


class Restarts:
    """One launch's first job directory, its record and the attempts' ends, run by the real
    supervisor: attempts[i] = (rc, lost host -> why, checkpoint state or "", lines)."""

    def __init__(self, tmp: pathlib.Path, records, monkeypatch, attempts, **kw):  # noqa: F811
        self.jobs = tmp / "jobs"
        self.first = self.jobs / ID
        self.first.mkdir(parents=True)
        (self.first / "train.py").write_text("pass\n")
        (self.first / "notes").mkdir()
        (self.first / "notes" / "a.txt").write_text("a\n")
        shared = kw.pop("shared", True)
        req = LaunchRequest(launcher="deepspeed", program=["train.py"], **kw.pop("request", {}))
        policy = {"max_restarts": 3, "min_nodes": 1, "retry_on_error": False, **kw}
        env = {"DSCLUSTER_RESTART": "0", "DSCLUSTER_CHECKPOINT_DIR": CKPT}
        site = JobSite(
            run_id=ID,
            job_dir=str(self.first),
            head="h1",
            venv="/opt/v",
            pool=POOL,
            accelerators=dict.fromkeys(POOL, "cuda"),
            hostfile_text=render_hostfile(POOL.items()),
            env_text=ENV,
            interface="eth0",
            job_env={**env, "DSCLUSTER_CHECKPOINT_TAG": ""},
        )
        record = RunRecord(ID, CKPT, shared, policy["max_restarts"], policy["min_nodes"], False)
        spec = planner.spec_of(site, req, record, ["train.py", "notes"], push=False)
        (self.first / planner.SPEC).write_text(json.dumps(spec))
        (self.first / planner.ZIPAPP).write_bytes(planner.zipapp_bytes())
        behave = tmp / "behave"
        losses = []
        for n, (rc, lost, state, lines) in enumerate(attempts):
            b = behave / (ID if n == 0 else f"{ID}-r{n}")
            b.mkdir(parents=True)
            (b / "rc").write_text(f"{rc}\n")
            (b / "lines").write_text("".join(f"{line}\n" for line in lines))
            if state:
                (b / "state").write_text(state)
            losses.append(dict(lost))
        player = tmp / "player.sh"
        player.write_text(PLAYER)
        monkeypatch.setattr(
            job, "launcher_argv", lambda spec, d=None: ["bash", str(player), d, str(behave)]
        )
        self.probed: list[list[str]] = []

        def lost_of(nodes, head, check=None):
            self.probed.append(list(nodes))
            return losses[len(self.probed) - 1]

        monkeypatch.setattr(job, "lost_of", lost_of)
        self.rec = records / ID
        self.rec.mkdir(mode=0o700)
        job_spec = {
            "user": "trainer",
            "dir": str(self.first),
            "launcher": "deepspeed",
            "nodes": list(POOL),
            "ranks": 6,
            "timeout": policy.pop("timeout", 0),
            "fetch": [CHECKPOINT_STATE],
            "restart": {**policy, "head": "h1", "pool": list(POOL), "left": {}},
        }
        (self.rec / "job.json").write_text(json.dumps(job_spec))

    def run(self) -> dict:
        assert job.Supervisor(ID).run() == 0
        return state_of(self.rec)

    def env(self, n: int) -> str:
        return (self.jobs / f"{ID}-r{n}" / ".deepspeed_env").read_text()

    def log(self) -> str:
        return (self.rec / "launcher.log").read_text()


LOST_N3 = {"h3": "no answer from its sshd within 5 s"}


def test_a_lost_node_relaunches_without_it_from_the_last_checkpoint(
    tmp_path,
    records,  # noqa: F811
    monkeypatch,
):
    r = Restarts(
        tmp_path,
        records,
        monkeypatch,
        [(1, LOST_N3, ckpt("global_step4"), ["step 4"]), (0, {}, ckpt("global_step10"), ["end"])],
    )
    state = r.run()
    assert (state["state"], state["rc"], state["stopped"]) == ("exited", 0, "")
    a0, a1 = state["attempts"]
    assert sorted(a0) == sorted(job.ATTEMPT_KEYS)
    assert [a["nodes"] for a in (a0, a1)] == [["h1", "h2", "h3"], ["h1", "h2"]]
    assert [a["run_id"] for a in (a0, a1)] == [ID, f"{ID}-r1"]
    assert (a0["ended_why"], a0["lost"], a0["tag_at_end"], a0["steps"]) == (
        "lost nodes h3",
        LOST_N3,
        "global_step4",
        4,
    )
    assert (a1["resumed_from"], a1["ranks"], a1["ended_why"]) == ("global_step4", 4, "ok")
    assert r.probed == [["h1", "h2", "h3"]]  # only after an attempt that failed
    # the planner's directory: the staged files copied, the plan's own files written
    second = r.jobs / f"{ID}-r1"
    assert (second / "hostfile").read_text() == "h1 slots=2\nh2 slots=2\n"
    assert (second / "train.py").read_text() == "pass\n"
    assert (second / "notes" / "a.txt").read_text() == "a\n"
    assert not (second / planner.SPEC).exists() and (second / "launch.sh").stat().st_mode & 0o100
    env = r.env(1)
    assert "DSCLUSTER_RESTART=1\n" in env and "DSCLUSTER_CHECKPOINT_TAG=global_step4\n" in env
    assert f"DSCLUSTER_CHECKPOINT_DIR={CKPT}\n" in env
    # root's log: each attempt from its own offset, the supervisor's lines between them
    log = r.log()
    assert log.index("step 4") < a1["log_from"] <= log.index("end\n")
    assert "dscluster: attempt 0 lost h3 (h3: no answer from its sshd within 5 s)\n" in log
    assert (
        f"dscluster: restart 1 of 3: 2 nodes, 4 ranks, run {ID}-r1, resuming from global_step4\n"
        in log
    )
    # the last attempt's checkpoint state, fetched from its own directory
    assert json.loads((r.rec / CHECKPOINT_STATE).read_text())["latest"] == "global_step10"
    assert state["dir"] == str(second) and state["run_id"] == f"{ID}-r1"


def test_a_checkpoint_the_lost_node_did_not_finish_is_not_resumed_from(
    tmp_path,
    records,  # noqa: F811
    monkeypatch,
):
    """The 2-node attempt leaves `latest` at global_step9 with 3 of its 4 ranks' ZeRO shards
    (h2 lost mid-save): the next attempt resumes from global_step6, the one it had."""
    cut = ckpt("global_step9", 4, [[0, 0, 9], [1, 0, 9], [2, 0, 9]])
    r = Restarts(
        tmp_path,
        records,
        monkeypatch,
        [
            (1, LOST_N3, ckpt("global_step6"), []),
            (1, {"h2": "its name does not resolve"}, cut, []),
            (0, {}, "", []),
        ],
    )
    a0, a1, a2 = r.run()["attempts"]
    assert [a["ranks"] for a in (a0, a1, a2)] == [6, 4, 2]
    assert (a0["tag_at_end"], a1["resumed_from"], a1["tag_at_end"]) == (
        "global_step6",
        "global_step6",
        "",
    )
    assert a2["resumed_from"] == "global_step6"
    assert "DSCLUSTER_CHECKPOINT_TAG=global_step6\n" in r.env(2)


def test_fewer_nodes_than_min_nodes_stops(tmp_path, records, monkeypatch):  # noqa: F811
    r = Restarts(tmp_path, records, monkeypatch, [(1, LOST_N3, "", [])], min_nodes=3)
    state = r.run()
    assert len(state["attempts"]) == 1 and state["rc"] == 1
    assert state["stopped"] == "2 node(s) left (h1, h2) after losing h3, fewer than --min-nodes 3"
    assert f"dscluster: stopped: {state['stopped']}\n" in r.log()
    assert not (r.jobs / f"{ID}-r1").exists()


def test_max_restarts_are_counted(tmp_path, records, monkeypatch):  # noqa: F811
    lost = [(1, LOST_N3, "", []), (1, {"h2": "its name does not resolve"}, "", [])]
    state = Restarts(tmp_path, records, monkeypatch, lost, max_restarts=1).run()
    assert len(state["attempts"]) == 2 and state["stopped"] == "1 of --max-restarts 1 used"
    assert state["attempts"][1]["lost"] == {"h2": "its name does not resolve"}


@pytest.mark.parametrize("retry", [False, True])
def test_a_script_error_is_not_retried_unless_asked(
    tmp_path,
    records,  # noqa: F811
    monkeypatch,
    retry,
):
    ends = [(3, {}, ckpt("global_step2"), []), (0, {}, "", [])]
    r = Restarts(tmp_path, records, monkeypatch, ends, retry_on_error=retry)
    state = r.run()
    if not retry:
        assert len(state["attempts"]) == 1 and state["rc"] == 3
        assert state["stopped"] == "a script error is not retried (--retry-on-error retries it)"
        assert state["attempts"][0]["ended_why"] == "script error"
        return
    # the same nodes again, from the checkpoint
    assert [a["nodes"] for a in state["attempts"]] == [list(POOL)] * 2
    assert "DSCLUSTER_CHECKPOINT_TAG=global_step2\n" in r.env(1) and state["rc"] == 0


@pytest.mark.parametrize("rc", [124, 137])
def test_the_time_limit_is_not_retried(tmp_path, records, monkeypatch, rc):  # noqa: F811
    r = Restarts(
        tmp_path, records, monkeypatch, [(rc, LOST_N3, "", [])], retry_on_error=True, timeout=60
    )
    state = r.run()
    assert len(state["attempts"]) == 1 and state["attempts"][0]["ended_why"] == "time limit"
    assert state["stopped"] == "the time limit (--timeout) is not retried"


def test_node_local_checkpoints_are_not_resumed_after_a_lost_node(
    tmp_path,
    records,  # noqa: F811
    monkeypatch,
):
    ends = [(1, LOST_N3, ckpt("global_step4"), []), (0, {}, "", [])]
    r = Restarts(tmp_path, records, monkeypatch, ends, shared=False)
    r.run()
    assert "DSCLUSTER_CHECKPOINT_TAG=\n" in r.env(1)


def test_a_restart_that_cannot_be_planned_stops_with_why(
    tmp_path,
    records,  # noqa: F811
    monkeypatch,
):
    ends = [(1, LOST_N3, "", [])]
    r = Restarts(tmp_path, records, monkeypatch, ends, request={"num_nodes": 3})
    state = r.run()
    assert state["rc"] == 1 and len(state["attempts"]) == 1
    assert state["stopped"].startswith("the restart cannot be planned: --num-nodes 3 needs 3 nodes")


def test_a_stop_while_an_attempt_runs_ends_the_restarts(
    tmp_path,
    records,  # noqa: F811
    monkeypatch,
):
    r = Restarts(tmp_path, records, monkeypatch, [(1, LOST_N3, "", [])])
    sup = job.Supervisor(ID)
    real = sup.run_attempt

    def stopped_during(attempt, log_fd):
        rc = real(attempt, log_fd)
        sup.state["stop_requested"] = True
        return rc

    sup.run_attempt = stopped_during  # type: ignore[method-assign]
    sup.run()
    state = state_of(r.rec)
    assert (state["state"], len(state["attempts"])) == ("stopped", 1)
    assert state["attempts"][0]["ended_why"] == "stopped" and r.probed == []


# ---------------------------------------------------------------- what root trusts


PLAN = {"run_id": f"{ID}-r1", "nodes": ["h1", "h2"], "ranks": 4, "resumed_from": "global_step4"}


def test_planned_takes_a_plan_it_asked_for():
    got = job.planned(json.dumps(PLAN | {"tag_at_end": "global_step4", "steps": 4}),
                      f"{ID}-r1", ["h1", "h2"], "h1")  # fmt: skip
    assert got == PLAN | {"tag_at_end": "global_step4", "steps": 4}


@pytest.mark.parametrize(
    ("forged", "says"),
    [
        ({"run_id": f"{ID}-r7"}, "made run"),
        ({"run_id": "../../etc"}, "made run"),
        ({"nodes": ["h1", "h3"]}, "chose nodes"),  # h3 was lost
        ({"nodes": ["h2", "h1"]}, "chose nodes"),  # the head first, always
        ({"nodes": ["h1", "h1"]}, "chose nodes"),
        ({"ranks": -1}, "ranks"),
        ({"resumed_from": "../x"}, "checkpoint tag"),
        ({"tag_at_end": "a b; rm -rf /"}, "checkpoint tag"),
    ],
)
def test_planned_refuses_what_the_training_user_could_forge(forged, says):
    with pytest.raises(job.Refused, match=says):
        job.planned(json.dumps(PLAN | forged), f"{ID}-r1", ["h1", "h2"], "h1")


def test_planned_refuses_no_plan():
    for text in ("", "not json", "[1]"):
        with pytest.raises(job.Refused, match="printed no plan"):
            job.planned(text, f"{ID}-r1", ["h1"], "h1")


def test_decide_is_pure():
    policy = {"max_restarts": 1, "min_nodes": 1}
    assert job.decide(policy, 0, {}, ["h1"], 0) == ("ok", None, "")
    assert job.decide(policy, 1, LOST_N3, ["h1", "h2", "h3"], 0) == (
        "lost nodes h3",
        ["h1", "h2"],
        "",
    )
    # a rc of `timeout` without a time limit is the job's own
    assert job.decide(policy, 124, {}, ["h1"], 0)[0] == "script error"


def serve(banner: bytes | None):
    """A listener on localhost that sends `banner` (None: accepts and says nothing)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    conns = []

    def accept() -> None:
        conn, _ = srv.accept()
        conns.append(conn)
        if banner is not None:
            conn.sendall(banner)

    threading.Thread(target=accept, daemon=True).start()
    return srv, conns


def test_probe_reads_the_ssh_banner():
    srv, _ = serve(b"SSH-2.0-OpenSSH_9.2\r\n")
    with srv:
        assert job.probe("127.0.0.1", srv.getsockname()[1], timeout=5) == ""


def test_probe_finds_a_frozen_node_a_closed_port_and_a_name_gone():
    srv, _ = serve(None)  # the kernel accepts, sshd is frozen
    with srv:
        why = job.probe("127.0.0.1", srv.getsockname()[1], timeout=0.5)
        assert why == "no answer from its sshd within 0.5 s"
    srv, _ = serve(b"HTTP/1.1 400\r\n")
    with srv:
        assert job.probe("127.0.0.1", srv.getsockname()[1], timeout=5).startswith("no SSH banner")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert job.probe("127.0.0.1", port, timeout=2).startswith(f"its sshd on port {port}:")
    assert job.probe("no-such-node.invalid", timeout=2) == "its name does not resolve"


def test_lost_of_probes_every_node_but_the_head():
    seen = []

    def check(host: str) -> str:
        seen.append(host)
        return "x" if host == "h3" else ""

    got = job.lost_of(["h1", "h2", "h3"], "h1", check=check)
    assert sorted(seen) == ["h2", "h3"] and got == {"h3": "x"}
    assert job.lost_of(["h1"], "h1") == {}


def test_the_planner_and_the_supervisor_agree_on_names():
    assert job.REPLAN == planner.ZIPAPP
    assert job.TAG_RE.fullmatch("global_step120")

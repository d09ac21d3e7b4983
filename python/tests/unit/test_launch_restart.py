"""`launch --max-restarts`: the refusals, the loop's decisions with a stand-in run_job, the
restart variables in every launcher's files, the checkpoint finder (pure and the watcher's
read), the watcher's times and the run record."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest
from rich.console import Console

from dscluster.errors import DsclusterError
from dscluster.hostfile import render_hostfile
from dscluster.jobs import launch_watch
from dscluster.launch import LAUNCHERS, JobSite, LaunchRequest, build_plan
from dscluster.launch import run as launch_run
from dscluster.launch.exclude import request_without, site_without
from dscluster.launch.restart import (
    CHECKPOINT_STATE,
    FIRST_STEP_RE,
    RestartPolicy,
    RunRecord,
    attempts_table,
    complete_tag,
    decide,
    run_with_restarts,
    shards_complete,
    steps_of,
    tag_from_state,
)
from dscluster.launch.watch import ScriptFailure
from dscluster.runner import PlaybookResult

from .clirun import one_line_error, run_cli, run_main
from .jobfake import stand_in

POOL = {"h1": 2, "h2": 2, "h3": 2}
ENV = "PATH=/opt/v/bin:/usr/bin\nDSCLUSTER_CHECKPOINT_DIR=/shared/dscluster/checkpoints\n"
MODE = {"gaudi_spawn": {"gaudi_spawn": "/opt/oh/gaudi_spawn.py"}}
JOB_ENV = {
    "DSCLUSTER_RESTART": "1",
    "DSCLUSTER_CHECKPOINT_DIR": "/shared/ckpt/launch-1",
    "DSCLUSTER_CHECKPOINT_TAG": "global_step4",
}


def site(launcher: str = "deepspeed", run_id: str = "launch-1", **kw) -> JobSite:
    return JobSite(
        run_id=run_id,
        job_dir=f"/shared/dscluster/jobs/{run_id}",
        head="h1",
        venv="/opt/v",
        pool=POOL,
        accelerators=dict.fromkeys(POOL, "hpu" if launcher == "gaudi_spawn" else "cuda"),
        hostfile_text=render_hostfile(POOL.items()),
        env_text=ENV,
        interface="eth0",
        **kw,
    )


def request(launcher: str = "deepspeed") -> LaunchRequest:
    return LaunchRequest(launcher=launcher, program=["train.py"], **MODE.get(launcher, {}))


# ---------------------------------------------------------------- the variables in every rank


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_carries_the_restart_variables(launcher):
    p = build_plan(request(launcher), site(launcher, job_env=JOB_ENV))
    env_lines = p.files[".deepspeed_env"][0].splitlines()
    # the run's own values replace the inventory's line of the same key, once each
    assert env_lines[0] == "PATH=/opt/v/bin:/usr/bin"
    assert env_lines[1:4] == [f"{k}={v}" for k, v in JOB_ENV.items()]
    assert sum(line.startswith("DSCLUSTER_CHECKPOINT_DIR=") for line in env_lines) == 1
    # what carries .deepspeed_env to the ranks for each launcher
    if launcher in ("torchrun", "accelerate"):
        script = p.files[f"{launcher if launcher == 'accelerate' else 'torchrun'}_node.sh"][0]
        for key, value in JOB_ENV.items():
            assert f"export {key}={value}\n" in script
    elif launcher == "mpi":
        for key, value in JOB_ENV.items():
            i = p.argv.index(f"{key}={value}")
            assert p.argv[i - 1] == "-x"
    else:  # DeepSpeed's runner (gaudi_spawn's too) reads ./.deepspeed_env in the job dir
        assert launcher in ("deepspeed", "gaudi_spawn")
    # the watcher reads DeepSpeed's `latest` there once the launcher ended
    assert "--checkpoint-dir /shared/ckpt/launch-1 --" in p.files["launch.sh"][0]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_an_empty_tag_is_exported_empty(launcher):
    p = build_plan(
        request(launcher), site(launcher, job_env={**JOB_ENV, "DSCLUSTER_CHECKPOINT_TAG": ""})
    )
    assert "DSCLUSTER_CHECKPOINT_TAG=\n" in p.files[".deepspeed_env"][0]
    if launcher == "torchrun":
        assert "export DSCLUSTER_CHECKPOINT_TAG=''\n" in p.files["torchrun_node.sh"][0]
    if launcher == "mpi":
        assert "DSCLUSTER_CHECKPOINT_TAG=" in p.argv


def test_without_restarts_the_job_files_are_as_before():
    p = build_plan(request(), site())
    assert p.files[".deepspeed_env"][0] == ENV
    assert "--checkpoint-dir" not in p.files["launch.sh"][0]


def test_a_job_env_value_deepspeed_would_mangle_is_refused():
    with pytest.raises(DsclusterError, match=r"value of DSCLUSTER_CHECKPOINT_TAG contains '\$'"):
        build_plan(request(), site(job_env={"DSCLUSTER_CHECKPOINT_TAG": "a$b"}))


# ---------------------------------------------------------------- the checkpoint finder


def test_the_tag_latest_names_when_it_has_files():
    assert complete_tag("global_step8", {"global_step8": 3, "global_step10": 2}) == "global_step8"
    assert complete_tag("global_step8\n", {"global_step8": 1}) == "global_step8"


def test_a_tag_missing_a_zero_shard_is_not_complete():
    """DeepSpeed's rank 0 writes `latest` before the other ranks' shards are saved: a node
    lost then leaves `latest` naming a tag without its shard, or with a cut one."""
    three = [[0, 0, 1000], [1, 0, 1000], [2, 0, 1000]]
    state = {"dir": "/c", "latest": "global_step9", "tag_entries": 4, "error": ""}
    assert tag_from_state(json.dumps({**state, "zero_shards": three}), 3) == "global_step9"
    assert tag_from_state(json.dumps({**state, "zero_shards": three[:2]}), 3) == ""  # lost n3
    assert tag_from_state(json.dumps({**state, "zero_shards": three[1:]}), None) == ""  # no 0
    cut = [[0, 0, 1000], [1, 0, 1000], [2, 0, 300]]
    assert tag_from_state(json.dumps({**state, "zero_shards": cut}), 3) == ""
    # a tag the attempt resumed from was written at another size: the grid alone is checked
    assert tag_from_state(json.dumps({**state, "zero_shards": three}), None) == "global_step9"
    # ZeRO off (no shards), or an older watcher's state: as before
    assert tag_from_state(json.dumps(state), 2) == "global_step9"
    assert shards_complete([[0, 0, 5], [0, 1, 5], [1, 0, 5], [1, 1, 5]], 4)
    assert not shards_complete([[0, 0, 5], [0, 1, 5], [1, 0, 5]], None)
    assert not shards_complete([["x", 0, 5]], None)


def test_no_checkpoint_without_latest_or_with_a_missing_or_empty_tag():
    # a half-written tag (no `latest` naming it) is never chosen
    assert complete_tag(None, {"global_step10": 4}) == ""
    assert complete_tag("", {"global_step10": 4}) == ""
    assert complete_tag("global_step12", {"global_step10": 4}) == ""
    assert complete_tag("global_step12", {"global_step12": 0}) == ""
    assert complete_tag("../x", {"../x": 1}) == ""
    assert complete_tag("a/b", {"a/b": 1}) == ""


def test_the_watchers_state_file_is_read_plainly():
    state = {"dir": "/c", "latest": "global_step6", "tag_entries": 5, "error": ""}
    assert tag_from_state(json.dumps(state)) == "global_step6"
    assert tag_from_state(json.dumps({**state, "tag_entries": None})) == ""
    assert tag_from_state(json.dumps({**state, "latest": None})) == ""
    assert tag_from_state("") == "" == tag_from_state("[1]") == tag_from_state("{")


def test_steps_from_deepspeeds_default_tag():
    assert steps_of("global_step120") == 120
    assert steps_of("best") is None and steps_of("global_step") is None


def test_the_watcher_reads_latest_without_following_links(tmp_path):
    state = launch_watch.checkpoint_state
    assert state(str(tmp_path)) == {
        "dir": str(tmp_path), "latest": None, "tag_entries": None, "error": "",
    }  # fmt: skip
    (tmp_path / "global_step4").mkdir()
    (tmp_path / "global_step4" / "mp_rank_00_model_states.pt").write_text("x")
    (tmp_path / "global_step6").mkdir()  # half-written: `latest` not yet moved on
    (tmp_path / "latest").write_text("global_step4")
    got = state(str(tmp_path))
    assert (got["latest"], got["tag_entries"]) == ("global_step4", 1)
    assert got["zero_shards"] == []
    # each ZeRO shard with its dp and mp rank and size; a link named like one is not counted
    for dp in (0, 1):
        (tmp_path / "global_step4" / f"zero_pp_rank_{dp}_mp_rank_00_optim_states.pt").write_text(
            "y" * 10
        )
    (tmp_path / "global_step4" / "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt").symlink_to(
        tmp_path / "global_step4" / "mp_rank_00_model_states.pt"
    )
    assert state(str(tmp_path))["zero_shards"] == [[0, 0, 10], [1, 0, 10]]
    assert tag_from_state(json.dumps(state(str(tmp_path))), 2) == "global_step4"
    assert tag_from_state(json.dumps(state(str(tmp_path))), 3) == ""
    for f in (tmp_path / "global_step4").glob("*zero_pp_rank*"):
        f.unlink()
    # `latest` naming an empty tag directory: counted 0, no tag
    (tmp_path / "latest").write_text("global_step6")
    assert tag_from_state(json.dumps(state(str(tmp_path)))) == ""
    # a link planted as `latest` or as the tag is not followed
    (tmp_path / "latest").unlink()
    secret = tmp_path / "secret"
    secret.write_text("global_step4")
    (tmp_path / "latest").symlink_to(secret)
    got = state(str(tmp_path))
    assert got["latest"] is None and "latest:" in got["error"]
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").write_text("linked")
    (tmp_path / "linked").symlink_to(tmp_path / "global_step4")
    assert state(str(tmp_path))["tag_entries"] is None


def run_watch(tmp_path: pathlib.Path, shell: str, *extra: str) -> list[str]:
    watch = pathlib.Path(launch_watch.__file__)
    proc = subprocess.run(
        [sys.executable, str(watch), "--marker", "K=V", "--hosts", "h1", *extra, "--",
         "sh", "-c", shell],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_watcher_says_when_it_saw_the_first_step_and_writes_the_state(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step2").mkdir(parents=True)
    (ckpt / "global_step2" / "f").write_text("x")
    (ckpt / "latest").write_text("global_step2")
    lines = run_watch(
        tmp_path,
        "echo 'h1: DSCLUSTER_STEP 3'; echo 'h1: DSCLUSTER_STEP 4'",
        "--checkpoint-dir",
        str(ckpt),
    )
    firsts = [line for line in lines if line.startswith("dscluster: first DSCLUSTER_STEP")]
    assert len(firsts) == 1 and firsts[0].startswith("dscluster: first DSCLUSTER_STEP 3 at ")
    # the loop reads the line back
    assert FIRST_STEP_RE.match(firsts[0])
    state = json.loads((tmp_path / CHECKPOINT_STATE).read_text())
    assert tag_from_state(json.dumps(state)) == "global_step2"
    # without --checkpoint-dir nothing is written
    (tmp_path / CHECKPOINT_STATE).unlink()
    run_watch(tmp_path, "true")
    assert not (tmp_path / CHECKPOINT_STATE).exists()


# ---------------------------------------------------------------- the loop, run_job stood in


def job(rc=0, lost=None, failure=None, lines=(), tag="") -> launch_run.JobResult:
    fetched = {}
    if tag:
        fetched[CHECKPOINT_STATE] = json.dumps({"latest": tag, "tag_entries": 2})
    return launch_run.JobResult(
        rc=rc,
        log_lines=list(lines),
        log_path=pathlib.Path("/inv/logs/x.log.txt"),
        fetched=fetched,
        lost_nodes=dict(lost or {}),
        playbook=PlaybookResult(status="successful", rc=0, hosts={}, failures=[]),
        failure=failure,
    )


FAILURE = ScriptFailure([0], ["h1"], "h1: a rank exited with code 1")


class Loop:
    """run_with_restarts with plans built as launch builds them and results handed in."""

    def __init__(self, results, *, shared=True, failing=None, **policy):
        self.results = list(results)
        self.plans: list = []
        self.checked: list[list[str]] = []
        self.failing = failing or {}
        self.policy = RestartPolicy(**{"max_restarts": 3, **policy})
        self.record = RunRecord(
            launch_id="launch-1",
            checkpoint_dir="/shared/ckpt/launch-1",
            checkpoints_shared=shared,
            max_restarts=self.policy.max_restarts,
            min_nodes=self.policy.min_nodes,
            retry_on_error=self.policy.retry_on_error,
        )
        self.clock = iter(range(1000, 2000, 10))

    def plan(self, run_id, left, env):
        where = site(run_id=run_id, job_env=env)
        req = request()
        if left:
            where = site_without(where, left)
            req = request_without(req, where.pool, left)
        p = build_plan(req, where)
        self.plans.append(p)
        return p

    def check(self, hosts):
        self.checked.append(list(hosts))
        return {h: why for h, why in self.failing.items() if h in hosts}

    def run(self):
        return run_with_restarts(
            self.policy,
            self.record,
            head="h1",
            plan_attempt=self.plan,
            run=lambda plan: self.results.pop(0),
            check_survivors=self.check,
            left_out={},
            console=Console(file=open(os.devnull, "w")),
            now=lambda: float(next(self.clock)),
        )

    def env(self, i: int) -> str:
        return self.plans[i].files[".deepspeed_env"][0]


LOST_N3 = {"h3": "ssh exited with code 255"}


def test_a_lost_node_relaunches_without_it_from_the_last_checkpoint():
    loop = Loop(
        [
            job(1, LOST_N3, tag="global_step4", lines=["dscluster: noticed the loss at 1005.5"]),
            job(0, lines=["dscluster: first DSCLUSTER_STEP 5 at 1042.0"], tag="global_step10"),
        ]
    )
    _, result = loop.run()
    assert result.rc == 0 and loop.record.stopped == ""
    assert [list(p.resources) for p in loop.plans] == [["h1", "h2", "h3"], ["h1", "h2"]]
    assert [p.run_id for p in loop.plans] == ["launch-1", "launch-1-r1"]
    assert loop.plans[1].files["hostfile"][0] == "h1 slots=2\nh2 slots=2\n"
    assert loop.checked == [["h1", "h2"]]  # doctor on the survivors alone
    assert "DSCLUSTER_RESTART=0\n" in loop.env(0) and "DSCLUSTER_CHECKPOINT_TAG=\n" in loop.env(0)
    assert "DSCLUSTER_RESTART=1\n" in loop.env(1)
    assert "DSCLUSTER_CHECKPOINT_TAG=global_step4\n" in loop.env(1)
    assert "DSCLUSTER_CHECKPOINT_DIR=/shared/ckpt/launch-1\n" in loop.env(1)
    first, second = loop.record.attempts
    assert (first.ended_why, first.tag_at_end, first.steps) == ("lost nodes h3", "global_step4", 4)
    assert first.loss_at == 1005.5  # the watcher's notice, not the attempt's end
    assert (second.resumed_from, second.tag_at_end, second.steps) == (
        "global_step4",
        "global_step10",
        10,
    )
    assert second.first_step_at == 1042.0 and second.recovery_s == 36.5


def test_the_loss_time_falls_back_to_the_attempts_end():
    loop = Loop([job(1, LOST_N3), job(0, lines=["dscluster: first DSCLUSTER_STEP 1 at 1050.0"])])
    loop.run()
    first, second = loop.record.attempts
    assert first.loss_at == first.ended == 1010.0 and second.recovery_s == 40.0
    # no checkpoint yet: the restart starts over
    assert second.resumed_from == "" and "DSCLUSTER_CHECKPOINT_TAG=\n" in loop.env(1)


def test_a_checkpoint_the_lost_node_did_not_finish_is_not_resumed_from():
    """The 2-node attempt leaves `latest` at global_step9 with 3 of its 4 ranks' ZeRO shards
    (h2 lost mid-save): the next attempt resumes from global_step6, the one it had."""
    cut = {"latest": "global_step9", "tag_entries": 4, "zero_shards": [[0, 0, 9], [1, 0, 9]]}
    cut["zero_shards"].append([2, 0, 9])
    second = dataclasses.replace(
        job(1, {"h2": "ssh exited with code 255"}), fetched={CHECKPOINT_STATE: json.dumps(cut)}
    )
    loop = Loop([job(1, LOST_N3, tag="global_step6"), second, job(0)], max_restarts=2)
    loop.run()
    assert [p.world_size for p in loop.plans] == [6, 4, 2]
    a0, a1, a2 = loop.record.attempts
    assert (a0.tag_at_end, a1.resumed_from, a1.tag_at_end) == ("global_step6", "global_step6", "")
    assert a2.resumed_from == "global_step6"
    assert "DSCLUSTER_CHECKPOINT_TAG=global_step6\n" in loop.env(2)


def test_a_lost_head_stops_at_once():
    loop = Loop([job(1, {"h1": "ssh exited with code 255"})])
    _, result = loop.run()
    assert result.rc == 1 and len(loop.plans) == 1 and loop.checked == []
    assert loop.record.stopped.startswith("lost the head h1 (ssh exited with code 255)")


def test_fewer_nodes_than_min_nodes_stops():
    loop = Loop([job(1, LOST_N3)], min_nodes=3)
    loop.run()
    assert len(loop.plans) == 1
    assert loop.record.stopped == (
        "2 node(s) left (h1, h2) after losing h3, fewer than --min-nodes 3"
    )


def test_doctor_failing_a_survivor_leaves_it_out_or_stops_under_min_nodes():
    loop = Loop([job(1, LOST_N3), job(0)], failing={"h2": "shm: small"})
    loop.run()
    assert list(loop.plans[1].resources) == ["h1"]
    loop = Loop([job(1, LOST_N3)], failing={"h2": "shm: small"}, min_nodes=2)
    loop.run()
    assert len(loop.plans) == 1 and "once doctor leaves out h2" in loop.record.stopped
    loop = Loop([job(1, LOST_N3)], failing={"h1": "ports"})
    loop.run()
    assert loop.record.stopped == "doctor fails the head h1 (ports)"


def test_max_restarts_are_counted():
    loop = Loop([job(1, LOST_N3), job(1, {"h2": "ssh exited with code 255"})], max_restarts=1)
    _, result = loop.run()
    assert len(loop.plans) == 2 and result.lost_nodes == {"h2": "ssh exited with code 255"}
    assert loop.record.stopped == "1 of --max-restarts 1 used"


def test_a_script_error_is_not_retried_unless_asked():
    loop = Loop([job(1, failure=FAILURE)])
    loop.run()
    assert len(loop.plans) == 1
    assert loop.record.stopped == "a script error is not retried (--retry-on-error retries it)"
    assert loop.record.attempts[0].ended_why == "script error"
    loop = Loop([job(1, failure=FAILURE, tag="global_step2"), job(0)], retry_on_error=True)
    loop.run()
    # the same nodes again, from the checkpoint
    assert [list(p.resources) for p in loop.plans] == [["h1", "h2", "h3"]] * 2
    assert "DSCLUSTER_CHECKPOINT_TAG=global_step2\n" in loop.env(1)


def test_the_time_limit_and_other_failures_are_not_retried():
    for rc in (124, 137):
        loop = Loop([job(rc, LOST_N3)], retry_on_error=True)
        loop.run()
        assert len(loop.plans) == 1 and loop.record.attempts[0].ended_why == "time limit"
        assert loop.record.stopped == "the time limit (--timeout) is not retried"
    loop = Loop([job(2)])  # staging broke: no node lost, no script error
    loop.run()
    assert len(loop.plans) == 1 and loop.record.stopped == ""
    assert loop.record.attempts[0].ended_why == "exited 2"


def test_node_local_checkpoints_are_not_resumed_after_a_lost_node():
    loop = Loop([job(1, LOST_N3, tag="global_step4"), job(0)], shared=False)
    loop.run()
    assert "DSCLUSTER_CHECKPOINT_TAG=\n" in loop.env(1)


def test_a_restart_that_cannot_be_planned_stops_with_why():
    loop = Loop([job(1, LOST_N3)])
    real = loop.plan

    def plan(run_id, left, env):
        if left:
            raise DsclusterError("--num-nodes 3 needs 3 nodes")
        return real(run_id, left, env)

    loop.plan = plan  # type: ignore[method-assign]
    _, result = loop.run()
    assert result.rc == 1
    assert loop.record.stopped == "the restart cannot be planned: --num-nodes 3 needs 3 nodes"


def test_the_record_is_json_beside_the_logs_and_a_table(tmp_path):
    loop = Loop([job(1, LOST_N3, tag="global_step4"), job(0, tag="global_step10")])
    loop.run()
    path = loop.record.write(tmp_path / "reports")
    assert path == tmp_path / "reports" / "launch-1.json"
    data = json.loads(path.read_text())
    assert data["path"] == str(path) and data["checkpoint_dir"] == "/shared/ckpt/launch-1"
    a0, a1 = data["attempts"]
    assert a0["nodes"] == ["h1", "h2", "h3"] and a1["nodes"] == ["h1", "h2"]
    assert a0["ended_why"] == "lost nodes h3" and a1["ended_why"] == "ok"
    assert a1["run_id"] == "launch-1-r1" and a1["resumed_from"] == "global_step4"
    assert a1["steps"] == 10 and a0["started_utc"].startswith("1970-01-01T00:16:40")
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(attempts_table(loop.record))
    text = console.export_text()
    assert "lost nodes h3" in text and "launch-1-r1" in text and "global_step10" in text


def test_decide_is_pure():
    policy = RestartPolicy(max_restarts=1)
    assert decide(policy, job(0), ["h1"], "h1", 0).relaunch is False
    d = decide(policy, job(1, LOST_N3), ["h1", "h2", "h3"], "h1", 0)
    assert d.relaunch and d.nodes == ["h1", "h2"]


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max-restarts", "-1"], "--max-restarts"),
        (["--min-nodes", "0"], "--min-nodes"),
        (["--retry-on-error"], "--retry-on-error retries within --max-restarts N"),
        (["--checkpoint-dir", "ckpt"], "--checkpoint-dir 'ckpt': give an absolute path"),
        (["--checkpoint-dir", "/a/../b"], "--checkpoint-dir '/a/../b'"),
        (["--checkpoint-dir", "/a b"], "--checkpoint-dir '/a b'"),
    ],
)
def test_bad_restart_flags_are_refused_in_one_line(tmp_path, inventory_dir, argv, says):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    before = sorted(p.name for p in inventory_dir.iterdir())
    line = one_line_error(
        run_main("launch", "-i", str(inventory_dir), *argv, "--", str(script)), (1, 2)
    )
    assert says in line, line
    assert sorted(p.name for p in inventory_dir.iterdir()) == before


def test_min_nodes_above_the_runs_nodes_is_refused_before_anything(
    tmp_path, inventory_dir, monkeypatch
):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    called = []
    stand_in(monkeypatch, lambda *a, **k: called.append(a))
    before = sorted(p.name for p in inventory_dir.iterdir())
    for extra, nodes in (([], 3), (["--num-nodes", "2"], 2)):
        argv = ["launch", "-i", str(inventory_dir), "--no-doctor", "--max-restarts", "2"]
        argv += ["--min-nodes", str(nodes + 1), *extra, "--", str(script)]
        line = one_line_error(run_cli(*argv))
        assert line.startswith(f"dscluster: error: --min-nodes {nodes + 1}: this run has {nodes}")
        assert line.endswith(f"give --min-nodes {nodes} or fewer")
    assert called == [] and sorted(p.name for p in inventory_dir.iterdir()) == before


def test_a_dry_run_shows_the_restart_variables(tmp_path, inventory_dir):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    rc, out, err = run_cli(
        "launch", "-i", str(inventory_dir), "--max-restarts", "2", "--launcher", "torchrun",
        "--dry-run", "--", str(script),
    )  # fmt: skip
    assert rc == 0, err
    assert "export DSCLUSTER_RESTART=0\n" in out
    assert "export DSCLUSTER_CHECKPOINT_TAG=''\n" in out
    # no shared storage in this inventory: node-local, under the launch's own id
    assert "export DSCLUSTER_CHECKPOINT_DIR=/var/lib/dscluster/checkpoints/launch-" in out


def test_launch_restarts_and_writes_the_record(tmp_path, inventory_dir, monkeypatch):
    """In process, with the playbook stood in: node-c lost once, then the job ends; the
    second run's hostfile lacks it, the record and table name both attempts."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    staged: list[dict] = []

    def run_playbook(playbook, inv, *, extravars, limit=None, **kw):
        tar_path = pathlib.Path(extravars["launch_stage_dir"]) / extravars["launch_job_tar"]
        files = {}
        with tarfile.open(tar_path) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    files[m.name.split("/")[-1]] = tar.extractfile(m).read().decode()
        staged.append({"limit": limit, **files})
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        first = len(staged) == 1
        (fetched / "launcher.log").write_text(
            "pdsh@node-a: node-c: ssh exited with exit code 255\n" if first else "done\n"
        )
        (fetched / "exit_status").write_text("1\n" if first else "0\n")
        state = {"latest": "global_step2" if first else "global_step6", "tag_entries": 3}
        (fetched / CHECKPOINT_STATE).write_text(json.dumps(state))
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, run_playbook)
    rc, _, err = run_cli(
        "launch", "-i", str(inventory_dir), "--no-doctor", "--max-restarts", "1",
        "--checkpoint-dir", "/mnt/ck/run1", "--launcher", "torchrun", "--", str(script),
    )  # fmt: skip
    assert rc == 0, err
    # --checkpoint-dir: the user's shared directory, so no node-local warning
    assert "node-local" not in err
    assert "export DSCLUSTER_CHECKPOINT_DIR=/mnt/ck/run1\n" in staged[0]["torchrun_node.sh"]
    assert [s["limit"] for s in staged] == ["node-a,node-b,node-c", "node-a,node-b"]
    assert "node-c" not in staged[1]["hostfile"]
    assert "export DSCLUSTER_CHECKPOINT_TAG=global_step2\n" in staged[1]["torchrun_node.sh"]
    assert "launch: restart 1 of 1: 2 nodes" in err and "resuming from global_step2" in err
    (record,) = (inventory_dir / "reports").glob("launch-*.json")
    data = json.loads(record.read_text())
    assert [a["ended_why"] for a in data["attempts"]] == ["lost nodes node-c", "ok"]
    last = err.strip().splitlines()[-1]
    assert "job exited 0" in last and f"2 attempt(s); run record {record}" in last
    # the table's rows whole: run ids and node lists are not cut
    rows = [line for line in err.splitlines() if line.startswith("│")]
    assert "node-a,node-b,node-c" in rows[0] and "lost nodes node-c" in rows[0]
    assert f"{data['launch_id']}-r1 " in rows[1] and "global_step2" in rows[1]
    # the inventory's own hostfile keeps node-c
    assert "node-c" in (inventory_dir / "hostfile").read_text()


def test_node_local_checkpoints_are_said_once(tmp_path, inventory_dir, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("pass\n")

    def run_playbook(playbook, inv, *, extravars, limit=None, **kw):
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        (fetched / "launcher.log").write_text("done\n")
        (fetched / "exit_status").write_text("0\n")
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, run_playbook)
    argv = ["launch", "-i", str(inventory_dir), "--no-doctor", "--max-restarts", "1"]
    rc, _, err = run_cli(*argv, "--", str(script))
    assert rc == 0, err
    notes = [line for line in err.splitlines() if "node-local" in line]
    assert len(notes) == 1 and notes[0].startswith(
        "launch: no shared storage: checkpoints in /var/lib/dscluster/checkpoints/launch-"
    )
    # --max-restarts 0 (the default): today's launch, no record, no note
    rc, _, err = run_cli("launch", "-i", str(inventory_dir), "--no-doctor", "--", str(script))
    assert rc == 0 and "node-local" not in err and "run record" not in err

"""`launch --max-restarts`: the refusals, the loop's decisions with a stand-in run_job, the
restart variables in every launcher's files, the checkpoint finder (pure and the watcher's
read), the watcher's times and the run record."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest
from rich.console import Console

from dscluster.cli.launch import attempts_table
from dscluster.errors import DsclusterError
from dscluster.hostfile import render_hostfile
from dscluster.jobs import launch_watch
from dscluster.launch import LAUNCHERS, JobSite, LaunchRequest, build_plan
from dscluster.launch.restart import (
    CHECKPOINT_STATE,
    FIRST_STEP_RE,
    RunRecord,
    attempts_from,
    complete_tag,
    shards_complete,
    steps_of,
    tag_from_state,
)
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


# ---------------------------------------------------------------- the record, from root's
# (the supervisor's decisions and the planner: test_job_restarts.py)


def root_attempt(n: int, nodes, ended_why: str, **more) -> dict:
    """An attempt as the supervisor's state.json has it (dscluster_job.py ATTEMPT_KEYS)."""
    return {
        "restart": n, "run_id": "launch-1" + (f"-r{n}" if n else ""), "dir": "/j",
        "nodes": list(nodes), "ranks": 2 * len(nodes), "started": 1000.0 + 100 * n,
        "ended": 1050.0 + 100 * n, "rc": 0 if ended_why == "ok" else 1, "ended_why": ended_why,
        "lost": {}, "resumed_from": "", "tag_at_end": "", "steps": None, "log_from": 0,
        "first_step_at": None, **more,
    }  # fmt: skip


def test_the_record_takes_roots_attempts_and_the_watchers_times():
    states = [
        root_attempt(0, ["h1", "h2", "h3"], "lost nodes h3", lost={"h3": "gone"},
                     tag_at_end="global_step4", steps=4),
        root_attempt(1, ["h1", "h2"], "ok", resumed_from="global_step4"),
    ]  # fmt: skip
    lines = [
        ["dscluster: noticed the loss at 1005.5"],
        ["dscluster: first DSCLUSTER_STEP 5 at 1042.0"],
    ]
    last = json.dumps({"latest": "global_step10", "tag_entries": 2})
    first, second = attempts_from(states, lines, ["/l/0", "/l/1"], last)
    assert (first.ended_why, first.tag_at_end, first.steps, first.log) == (
        "lost nodes h3", "global_step4", 4, "/l/0",
    )  # fmt: skip
    assert first.loss_at == 1005.5  # the watcher's notice, not the attempt's end
    assert (second.resumed_from, second.tag_at_end, second.steps) == (
        "global_step4", "global_step10", 10,
    )  # fmt: skip
    assert second.first_step_at == 1042.0 and second.recovery_s == 36.5


def test_the_loss_time_falls_back_to_the_attempts_end():
    states = [root_attempt(0, ["h1", "h3"], "lost nodes h3", lost={"h3": "gone"}),
              root_attempt(1, ["h1"], "ok")]  # fmt: skip
    first, second = attempts_from(
        states, [[], ["dscluster: first DSCLUSTER_STEP 1 at 1090.0"]], ["a", "b"], ""
    )
    assert first.loss_at == first.ended == 1050.0 and second.recovery_s == 40.0
    assert second.tag_at_end == "" and second.steps is None


def test_the_record_is_json_beside_the_logs_and_a_table(tmp_path):
    record = RunRecord("launch-1", "/shared/ckpt/launch-1", True, 3, 1, False)
    record.attempts = attempts_from(
        [root_attempt(0, ["h1", "h2", "h3"], "lost nodes h3", tag_at_end="global_step4"),
         root_attempt(1, ["h1", "h2"], "ok", resumed_from="global_step4")],
        [[], []], ["a", "b"], json.dumps({"latest": "global_step10", "tag_entries": 2}),
    )  # fmt: skip
    path = record.write(tmp_path / "reports")
    assert path == tmp_path / "reports" / "launch-1.json"
    data = json.loads(path.read_text())
    assert data["path"] == str(path) and data["checkpoint_dir"] == "/shared/ckpt/launch-1"
    a0, a1 = data["attempts"]
    assert a0["nodes"] == ["h1", "h2", "h3"] and a1["nodes"] == ["h1", "h2"]
    assert a0["ended_why"] == "lost nodes h3" and a1["ended_why"] == "ok"
    assert a1["run_id"] == "launch-1-r1" and a1["resumed_from"] == "global_step4"
    assert a1["steps"] == 10 and a0["started_utc"].startswith("1970-01-01T00:16:40")
    console = Console(width=200, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(attempts_table(record))
    text = console.export_text()
    assert "lost nodes h3" in text and "launch-1-r1" in text and "global_step10" in text


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
    """In process, with the playbook and the head stood in: the job is staged once with the
    supervisor's restart policy and the planner; root's record says node-c was lost once and
    the job ended on the others; each attempt's lines go to a log of its own, the record and
    the table name both attempts, the last line the second attempt's run."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    staged: list[dict] = []

    def run_playbook(playbook, inv, *, extravars, limit=None, **kw):
        tar_path = pathlib.Path(extravars["launch_stage_dir"]) / extravars["launch_job_tar"]
        files = {}
        with tarfile.open(tar_path) as tar:
            for m in tar.getmembers():
                if m.isfile():
                    files[m.name.split("/")[-1]] = tar.extractfile(m).read()
        staged.append({"limit": limit, "spec": extravars["launch_spec"], **files})
        run_id = pathlib.PurePosixPath(extravars["launch_job_dir"]).name
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        first = "pdsh@node-a: node-c: ssh exited with exit code 255\n"
        second = "dscluster: first DSCLUSTER_STEP 3 at 1130.0\ndone\n"
        (fetched / "launcher.log").write_text(first + second)
        (fetched / "exit_status").write_text("0\n")
        state = {"latest": "global_step6", "tag_entries": 3}
        (fetched / CHECKPOINT_STATE).write_text(json.dumps(state))
        attempts = [
            root_attempt(0, ["node-a", "node-b", "node-c"], "lost nodes node-c",
                         lost={"node-c": "its name does not resolve"},
                         tag_at_end="global_step2", steps=2),
            root_attempt(1, ["node-a", "node-b"], "ok", resumed_from="global_step2",
                         log_from=len(first)),
        ]  # fmt: skip
        for a in attempts:
            a["run_id"] = run_id + (f"-r{a['restart']}" if a["restart"] else "")
        (fetched / "state.json").write_text(json.dumps({"attempts": attempts, "stopped": ""}))
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, run_playbook)
    rc, _, err = run_cli(
        "launch", "-i", str(inventory_dir), "--no-doctor", "--max-restarts", "1",
        "--checkpoint-dir", "/mnt/ck/run1", "--launcher", "torchrun", "--", str(script),
    )  # fmt: skip
    assert rc == 0, err
    # --checkpoint-dir: the user's shared directory, so no node-local warning
    assert "node-local" not in err
    (once,) = staged  # one play: the restarts are the supervisor's
    assert b"export DSCLUSTER_CHECKPOINT_DIR=/mnt/ck/run1\n" in once["torchrun_node.sh"]
    assert once["limit"] == "node-a,node-b,node-c"
    assert once["spec"]["restart"] == {
        "max_restarts": 1, "min_nodes": 1, "retry_on_error": False, "head": "node-a",
        "pool": ["node-a", "node-b", "node-c"], "left": {},
    }  # fmt: skip
    replan = json.loads(once["replan.json"])
    assert replan["checkpoint_dir"] == "/mnt/ck/run1" and replan["staged"] == ["train.py"]
    assert replan["request"]["launcher"] == "torchrun" and replan["push"] is True
    assert once["dscluster_replan.pyz"][:2] == b"PK"
    (record,) = (inventory_dir / "reports").glob("launch-*.json")
    data = json.loads(record.read_text())
    launch_id = data["launch_id"]
    assert [a["ended_why"] for a in data["attempts"]] == ["lost nodes node-c", "ok"]
    assert [a["run_id"] for a in data["attempts"]] == [launch_id, f"{launch_id}-r1"]
    assert data["attempts"][1]["tag_at_end"] == "global_step6"
    assert data["attempts"][1]["recovery_s"] == 80.0  # from the end of attempt 0 (no notice)
    logs = [pathlib.Path(a["log"]).read_text() for a in data["attempts"]]
    assert logs == ["pdsh@node-a: node-c: ssh exited with exit code 255\n",
                    "dscluster: first DSCLUSTER_STEP 3 at 1130.0\ndone\n"]  # fmt: skip
    last = err.strip().splitlines()[-1]
    assert f"launch {launch_id}-r1: job exited 0; log {data['attempts'][1]['log']}" in last
    assert f"2 attempt(s); run record {record}" in last
    # the table's rows whole: run ids and node lists are not cut
    rows = [line for line in err.splitlines() if line.startswith("│")]
    assert "node-a,node-b,node-c" in rows[0] and "lost nodes node-c" in rows[0]
    assert f"{launch_id}-r1 " in rows[1] and "global_step2" in rows[1]
    # the inventory's own hostfile keeps node-c
    assert "node-c" in (inventory_dir / "hostfile").read_text()


def test_a_restart_launch_can_detach(tmp_path, inventory_dir, monkeypatch):
    """--detach with --max-restarts: the supervisor restarts, so the launch may go."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")

    def run_playbook(playbook, inv, *, extravars, limit=None, **kw):
        assert extravars["launch_spec"]["restart"]["max_restarts"] == 2
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, run_playbook)
    argv = ["launch", "-i", str(inventory_dir), "--no-doctor", "--max-restarts", "2", "--detach"]
    rc, _, err = run_cli(*argv, "--", str(script))
    assert rc == 0, err
    assert "dscluster logs" in err and not (inventory_dir / "reports").exists()


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

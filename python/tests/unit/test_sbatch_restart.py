"""`dscluster sbatch --max-restarts N`: the requeue form of launch's restarts. The rendered
script's restart block is run for real under bash against a fake Slurm environment and a
checkpoint directory; without the flags the script is byte for byte what it was before them
(fixtures/sbatch, rendered before --max-restarts existed)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from dscluster import sbatch
from dscluster.launch.restart import complete_tag

from .clirun import one_line_error, run_main
from .slurm_shims import ranks, submit, write_script

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "sbatch"


def golden_options(mode: str, **extra) -> sbatch.SbatchOptions:
    """The options fixtures/sbatch/<mode>.sbatch was rendered from."""
    return sbatch.SbatchOptions(
        launcher=mode,
        command=["train.py", "--steps", "40"],
        nodes=3,
        slots=2,
        partition="debug",
        time="1:00:00",
        job_name="resume",
        chdir="/shared/jobs/r1",
        env={"FROM_INVENTORY": "yes"},
        origin=f"dscluster sbatch --launcher {mode}",
        **extra,
    )


@pytest.mark.parametrize("mode", sbatch.MODES)
def test_without_restarts_the_script_is_unchanged(mode):
    assert sbatch.render_sbatch(golden_options(mode)) == (FIXTURES / f"{mode}.sbatch").read_text()


def without_restarts(text: str, opts: sbatch.SbatchOptions) -> str:
    """The script with what --max-restarts adds taken out again."""
    text = text.replace("#SBATCH --requeue\n", "", 1)
    text = text.replace(f"--nodes={opts.min_nodes}-{opts.nodes}\n", f"--nodes={opts.nodes}\n")
    text = text.replace(sbatch.render_restart(opts), "", 1)
    return text.replace(sbatch._RESTART_DS_ENV, "", 1)


@pytest.mark.parametrize("mode", sbatch.MODES)
def test_restarts_add_requeue_a_node_range_and_one_block(mode):
    opts = golden_options(mode, max_restarts=2, min_nodes=2)
    text = sbatch.render_sbatch(opts)
    header = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --nodes=2-3" in header and header[-1] == "#SBATCH --requeue"
    block = sbatch.render_restart(opts)
    assert "MAX_RESTARTS=2\n" in block
    assert 'CHECKPOINT_DIR="$JOB_DIR"/checkpoints/"$SLURM_JOB_ID"\n' in block
    # after the prelude (which refuses to run outside a job), before the launcher starts
    assert text.index(sbatch._PRELUDE) + len(sbatch._PRELUDE) == text.index(block)
    assert (sbatch._RESTART_DS_ENV in text) == (mode == "deepspeed")
    assert without_restarts(text, opts) == (FIXTURES / f"{mode}.sbatch").read_text()


def test_min_nodes_equal_to_nodes_is_a_plain_count_and_zero_restarts_no_requeue():
    text = sbatch.render_sbatch(golden_options("srun", max_restarts=1, min_nodes=3))
    assert "#SBATCH --nodes=3\n" in text and "#SBATCH --requeue\n" in text
    # --checkpoint-dir alone: the variables for a job that resumes across submissions
    opts = golden_options("srun", checkpoint_dir="/shared/ckpt/run1/")
    text = sbatch.render_sbatch(opts)
    assert "--requeue" not in text and "MAX_RESTARTS=0\nCHECKPOINT_DIR=/shared/ckpt/run1\n" in text


# ---- the restart block, run by bash ------------------------------------------------------


def run_block(
    tmp_path: pathlib.Path, opts: sbatch.SbatchOptions, restart_count: str | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """The rendered block under bash as the batch script runs it (set -euo pipefail, Slurm's
    job id, JOB_DIR): its result and the DSCLUSTER_ variables it exported."""
    text = sbatch.render_sbatch(opts)
    block = sbatch.render_restart(opts)
    assert block in text
    script = tmp_path / "block.sh"
    script.write_text(f"set -euo pipefail\n{block}\nenv -0\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "JOB_DIR": str(tmp_path / "submit")}
    if restart_count is not None:
        env["SLURM_RESTART_COUNT"] = restart_count
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    exported = dict(
        item.split("=", 1) for item in proc.stdout.split("\0") if item.startswith("DSCLUSTER_")
    )
    return proc, exported


def restart_opts(ckpt: pathlib.Path | None = None, **extra) -> sbatch.SbatchOptions:
    where = {"checkpoint_dir": str(ckpt)} if ckpt else {}
    return sbatch.SbatchOptions(launcher="srun", command=["t.py"], max_restarts=2, **where, **extra)


@pytest.mark.parametrize(("count", "want"), [(None, "0"), ("1", "1"), ("2", "2")])
def test_block_exports_the_restart_number_and_the_same_dir(tmp_path, count, want):
    proc, got = run_block(tmp_path, restart_opts(), count)
    assert proc.returncode == 0, proc.stderr
    ckpt = str(tmp_path / "submit" / "checkpoints" / "42")  # the job id: the same each attempt
    assert got == {
        "DSCLUSTER_RESTART": want,
        "DSCLUSTER_CHECKPOINT_DIR": ckpt,
        "DSCLUSTER_CHECKPOINT_TAG": "",
    }
    assert f"dscluster: restart {want} of --max-restarts 2, checkpoints in {ckpt}, " in proc.stdout
    assert "resuming from no checkpoint" in proc.stdout


@pytest.mark.parametrize("count", ["3", "17", "x", "08", "99999999999999999999"])
def test_block_past_max_restarts_stops_in_one_line(tmp_path, count):
    proc, got = run_block(tmp_path, restart_opts(), count)
    assert proc.returncode == 1
    assert got == {} and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"dscluster: job 42 restart {count} is past --max-restarts 2;")


def test_block_checkpoint_dir_from_the_inventory_base(tmp_path):
    proc, got = run_block(tmp_path, restart_opts(checkpoint_base="/shared/dscluster/ckpt"))
    assert proc.returncode == 0, proc.stderr
    assert got["DSCLUSTER_CHECKPOINT_DIR"] == "/shared/dscluster/ckpt/42"


def _tag_dir(ckpt: pathlib.Path, name: str, entries: int = 1) -> pathlib.Path:
    path = ckpt / name
    path.mkdir(parents=True)
    for i in range(entries):
        (path / f"mp_rank_0{i}_model_states.pt").write_text("x")
    return path


# (what `latest` holds, None: no file; the tag directories: name -> entries)
TAG_CASES = {
    "complete": ("global_step20", {"global_step20": 2}),
    "newline": ("global_step20\n", {"global_step20": 1}),
    "half-written newer": ("global_step10", {"global_step10": 1, "global_step20": 1}),
    "empty tag dir": ("global_step20", {"global_step20": 0}),
    "missing tag dir": ("global_step20", {"global_step10": 1}),
    "no latest": (None, {"global_step20": 1}),
    "empty latest": ("", {"global_step20": 1}),
    "dot": (".", {"global_step20": 1}),
    "dotdot": ("..", {"global_step20": 1}),
    "slash": ("global_step20/x", {"global_step20": 1}),
    "two lines": ("global_step20\nglobal_step10", {"global_step20": 1, "global_step10": 1}),
}


@pytest.mark.parametrize("case", TAG_CASES)
def test_block_tag_is_restart_complete_tag(tmp_path, case):
    """The shell's choice is complete_tag's, the rule launch's restarts use."""
    latest, dirs = TAG_CASES[case]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name, entries in dirs.items():
        _tag_dir(ckpt, name, entries)
    if latest is not None:
        (ckpt / "latest").write_text(latest)
    proc, got = run_block(tmp_path, restart_opts(ckpt), "1")
    assert proc.returncode == 0, proc.stderr
    want = complete_tag(latest, dirs)
    assert got["DSCLUSTER_CHECKPOINT_TAG"] == want
    assert got["DSCLUSTER_CHECKPOINT_DIR"] == str(ckpt)
    assert f"resuming from {want or 'no checkpoint'}" in proc.stdout
    assert want in ("", "global_step20", "global_step10")
    assert bool(want) == (case in ("complete", "newline", "half-written newer"))


def test_block_follows_no_link(tmp_path):
    """`latest` as a link, or the tag directory as a link, is not followed: no tag."""
    elsewhere = tmp_path / "elsewhere"
    _tag_dir(elsewhere, "global_step20")
    (elsewhere / "latest").write_text("global_step20")
    ckpt = tmp_path / "ckpt"
    _tag_dir(ckpt, "global_step20")
    (ckpt / "latest").symlink_to(elsewhere / "latest")
    assert run_block(tmp_path, restart_opts(ckpt), "1")[1]["DSCLUSTER_CHECKPOINT_TAG"] == ""
    (ckpt / "latest").unlink()
    (ckpt / "latest").write_text("global_step30")
    (ckpt / "global_step30").symlink_to(elsewhere / "global_step20")
    assert run_block(tmp_path, restart_opts(ckpt), "1")[1]["DSCLUSTER_CHECKPOINT_TAG"] == ""
    # the same files as plain ones resume
    (ckpt / "latest").unlink()
    (ckpt / "latest").write_text("global_step20")
    assert (
        run_block(tmp_path, restart_opts(ckpt), "1")[1]["DSCLUSTER_CHECKPOINT_TAG"]
        == "global_step20"
    )


@pytest.mark.parametrize(
    ("storage", "want"),
    [
        ("nfs", 'CHECKPOINT_DIR=/data/dscluster/checkpoints/"$SLURM_JOB_ID"\n'),
        # node-local checkpoints: a requeued job's batch host may be another node
        ("none", 'CHECKPOINT_DIR="$JOB_DIR"/checkpoints/"$SLURM_JOB_ID"\n'),
    ],
)
def test_default_dir_is_the_inventorys_on_shared_storage(tmp_path, storage, want):
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n"
        f"  vars: {{dscluster_shared_storage: {storage}, dscluster_shared_dir: /data}}\n"
        "  children:\n    head:\n      hosts:\n        n1: {}\n"
    )
    script = tmp_path / "x.sbatch"
    rc, _, err = run_main(
        "sbatch", "--launcher", "srun", "-i", str(inv), "--max-restarts", "1", "-o", str(script),
        "--", "job.py",
    )  # fmt: skip
    assert rc == 0, err
    assert want in script.read_text()


# ---- the whole script, each launcher, against the Slurm shims -----------------------------


@pytest.mark.parametrize("mode", sbatch.MODES)
def test_every_rank_finds_the_restart_variables(tmp_path, mode):
    ckpt = tmp_path / "ckpt"
    _tag_dir(ckpt, "global_step20")
    (ckpt / "latest").write_text("global_step20")
    script = write_script(
        tmp_path, mode, "--nodes", "3", "--min-nodes", "2", "--max-restarts", "2",
        "--checkpoint-dir", str(ckpt),
    )  # fmt: skip
    # requeued once onto two nodes: Slurm gave the attempt fewer than --nodes
    proc = submit(tmp_path, script, extra={"SLURM_RESTART_COUNT": "1"})
    assert proc.returncode == 0, proc.stderr
    got = ranks(tmp_path)
    assert len(got) == 2
    want = ("1", str(ckpt), "global_step20")
    keys = ("DSCLUSTER_RESTART", "DSCLUSTER_CHECKPOINT_DIR", "DSCLUSTER_CHECKPOINT_TAG")
    assert {tuple(r[k] for k in keys) for r in got} == {want}
    if mode == "deepspeed":  # the lines pdsh carries to the other nodes
        exports = json.loads((tmp_path / "log" / "deepspeed.json").read_text())["exports"]
        assert tuple(exports[k] for k in keys) == want


@pytest.mark.parametrize("mode", sbatch.MODES)
def test_past_max_restarts_nothing_starts(tmp_path, mode):
    script = write_script(tmp_path, mode, "--max-restarts", "1")
    proc = submit(tmp_path, script, extra={"SLURM_RESTART_COUNT": "2"})
    assert proc.returncode == 1
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("dscluster:")] == [
        "dscluster: job 42 restart 2 is past --max-restarts 1; not starting it again "
        f"(checkpoints in {tmp_path / 'submit' / 'checkpoints' / '42'})"
    ]
    assert os.listdir(tmp_path / "log") == [] and ranks(tmp_path) == []


# ---- refused in one line, nothing written -------------------------------------------------


R = ["--max-restarts", "2"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--max-restarts", "-1"], "--max-restarts -1 is out of range; give a restart count"),
        (["--max-restarts", "101"], "--max-restarts 101 is out of range"),
        ([*R, "--min-nodes", "0"], "--min-nodes 0 is out of range"),
        ([*R, "--nodes", "3", "--min-nodes", "4"], "--min-nodes 4 is above --nodes 3; give"),
        ([*R, "--min-nodes", "2"], "--min-nodes 2 is above --nodes (not given: 1)"),
        (["--nodes", "3", "--min-nodes", "2"], "not given or 0; give --max-restarts N"),
        ([*R, "--checkpoint-dir", "ckpt"], "--checkpoint-dir 'ckpt': give an absolute path"),
        ([*R, "--checkpoint-dir", "/a b"], "--checkpoint-dir '/a b': give an absolute path"),
        ([*R, "--checkpoint-dir", "/x/../y"], "--checkpoint-dir '/x/../y'"),
    ],
)
def test_refused_in_one_line(tmp_path, argv, needle):
    script = tmp_path / "x.sbatch"
    result = run_main("sbatch", "--launcher", "srun", *argv, "-o", str(script), "--", "job.py")
    assert needle in one_line_error(result, rc=2)
    assert not script.exists()


def test_block_takes_only_a_plain_tag_and_runs_nothing_in_it(tmp_path):
    """A tag DeepSpeed's launcher would pass through a shell changed, or that holds a
    command, is no checkpoint; nothing in it runs."""
    ckpt = tmp_path / "ckpt"
    for tag in ("global step20", "a$(touch pwned)", "a`touch pwned`", "-n"):
        _tag_dir(ckpt, tag)
        (ckpt / "latest").write_text(tag)
        proc, got = run_block(tmp_path, restart_opts(ckpt), "1")
        assert proc.returncode == 0, proc.stderr
        assert got["DSCLUSTER_CHECKPOINT_TAG"] == ("-n" if tag == "-n" else ""), tag
    assert not list(tmp_path.rglob("pwned"))

"""The resumable DeepSpeed job (jobs/resume_job.py): its data, split, arguments and checkpoint
bookkeeping, and (where torch and DeepSpeed import) a real save at 2 ranks, resume at 1."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

from dscluster.jobs import resume_job

JOB = pathlib.Path(resume_job.__file__)


def test_step_samples_depend_on_the_step_only():
    first = resume_job.step_samples(7, 12)
    assert resume_job.step_samples(7, 12) == first  # no hidden state between calls
    xs, ys = first
    assert len(xs) == len(ys) == 12
    assert all(len(x) == resume_job.IN_DIM for x in xs)
    assert all(len(y) == resume_job.OUT_DIM for y in ys)
    assert resume_job.step_samples(8, 12) != first
    assert resume_job.step_samples(7, 12, seed=1) != first
    # A bigger global batch starts with the same samples: the batch is one stream per step.
    assert resume_job.step_samples(7, 24)[0][:12] == xs


def test_the_same_input_gets_the_same_target_at_every_step():
    # The teacher is fixed, so the targets are learnable across steps.
    xs5, ys5 = resume_job.step_samples(5, 4)
    xs9, ys9 = resume_job.step_samples(9, 4)
    assert xs5 != xs9
    assert len({json.dumps(y) for y in ys5 + ys9}) == 8


@pytest.mark.parametrize("batch", [1, 5, 24, 25])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_rank_slices_cover_the_global_batch_once(batch, world):
    slices = [resume_job.rank_slice(batch, rank, world) for rank in range(world)]
    assert slices[0][0] == 0 and slices[-1][1] == batch
    assert all(a[1] == b[0] for a, b in itertools.pairwise(slices))
    sizes = [end - start for start, end in slices]
    assert max(sizes) - min(sizes) <= 1


def test_parse_args_defaults_and_env(monkeypatch):
    monkeypatch.setenv("DSCLUSTER_CHECKPOINT_DIR", "/shared/ckpt")
    args = resume_job.parse_args([])
    assert (args.steps, args.save_every, args.zero, args.sleep_per_step) == (40, 5, 2, 0.0)
    assert args.checkpoint_dir == "/shared/ckpt"
    args = resume_job.parse_args(
        [
            "--steps",
            "60",
            "--save-every",
            "4",
            "--zero",
            "3",
            "--sleep-per-step",
            "0.5",
            "--checkpoint-dir",
            "/other",
            "--local_rank=1",
        ]
    )
    assert (args.steps, args.save_every, args.zero, args.sleep_per_step) == (60, 4, 3, 0.5)
    assert (args.checkpoint_dir, args.local_rank) == ("/other", 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["--zero", "0"],
        ["--steps", "0"],
        ["--save-every", "0"],
        ["--global-batch", "0"],
        ["--sleep-per-step", "-1"],
    ],
)
def test_parse_args_refuses_bad_values(argv, monkeypatch):
    monkeypatch.setenv("DSCLUSTER_CHECKPOINT_DIR", "/shared/ckpt")
    with pytest.raises(SystemExit):
        resume_job.parse_args(argv)


def test_parse_args_needs_a_checkpoint_dir(monkeypatch, capsys):
    monkeypatch.delenv("DSCLUSTER_CHECKPOINT_DIR", raising=False)
    with pytest.raises(SystemExit):
        resume_job.parse_args([])
    assert "DSCLUSTER_CHECKPOINT_DIR" in capsys.readouterr().err


def _tag(root: pathlib.Path, step: int, world: int | None) -> str:
    tag = resume_job.tag_for(step)
    (root / tag).mkdir()
    if world is not None:  # None: a save cut short, no marker
        resume_job.write_marker(str(root), tag, {"step": step, "world_size": world})
    return tag


def test_resume_tag_follows_the_name_then_latest(tmp_path):
    assert resume_job.resume_tag(str(tmp_path)) is None
    assert resume_job.resume_tag(str(tmp_path / "missing")) is None
    _tag(tmp_path, 4, 3)
    _tag(tmp_path, 8, 3)
    assert resume_job.resume_tag(str(tmp_path)) == "global_step8"  # no latest: newest complete
    (tmp_path / "latest").write_text("global_step4\n")
    assert resume_job.resume_tag(str(tmp_path)) == "global_step4"
    assert resume_job.resume_tag(str(tmp_path), "global_step8") == "global_step8"


def test_resume_tag_skips_a_half_written_tag(tmp_path):
    _tag(tmp_path, 4, 3)
    _tag(tmp_path, 12, 2)
    _tag(tmp_path, 8, None)
    (tmp_path / "latest").write_text("global_step8")
    # The named tag has no marker: the newest complete one before it, not the one after.
    assert resume_job.resume_tag(str(tmp_path)) == "global_step4"
    assert resume_job.read_marker(str(tmp_path), "global_step8") is None
    assert resume_job.read_marker(str(tmp_path), "global_step12")["world_size"] == 2


def test_ds_config_loads_universal_only_when_asked(monkeypatch):
    monkeypatch.setenv("DSCLUSTER_CHECKPOINT_DIR", "/c")
    args = resume_job.parse_args(["--zero", "3", "--global-batch", "24"])
    plain = resume_job.ds_config(args, 3, universal=False)
    assert "checkpoint" not in plain
    assert plain["zero_optimization"]["stage"] == 3
    assert plain["train_micro_batch_size_per_gpu"] == 8
    universal = resume_job.ds_config(args, 5, universal=True)
    assert universal["checkpoint"] == {"load_universal": True}
    assert universal["train_micro_batch_size_per_gpu"] == 5  # ceil(24 / 5)


def _deepspeed_importable() -> bool:
    return all(importlib.util.find_spec(name) for name in ("torch", "deepspeed"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(ckpt: pathlib.Path, nproc: int, steps: int, restart: int) -> None:
    env = dict(os.environ, DSCLUSTER_CHECKPOINT_DIR=str(ckpt), DSCLUSTER_RESTART=str(restart))
    env.pop("DSCLUSTER_CHECKPOINT_TAG", None)  # the job finds the tag from DeepSpeed's latest
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
        str(JOB),
        "--steps",
        str(steps),
        "--save-every",
        "2",
        "--global-batch",
        "12",
        "--dist-timeout",
        "60",
    ]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=150, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("DSCLUSTER_STEP ")]
    assert printed[-1] == f"DSCLUSTER_STEP {steps}"


@pytest.mark.skipif(not _deepspeed_importable(), reason="torch and DeepSpeed are not importable")
def test_save_at_two_ranks_resume_at_one(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run(ckpt, nproc=2, steps=8, restart=0)
    assert (ckpt / "latest").read_text().strip() == "global_step8"
    assert resume_job.read_marker(str(ckpt), "global_step6")["world_size"] == 2
    # As if the node was lost while global_step8 was being saved: `latest` names it, but it
    # is not complete, so the job resumes from global_step6.
    (ckpt / "global_step8" / resume_job.MARKER).unlink()
    _run(ckpt, nproc=1, steps=10, restart=1)
    assert (ckpt / "global_step6_universal").is_dir()  # reloaded at DP 1 through universal form

    log = [json.loads(line) for line in (ckpt / "steps.jsonl").read_text().splitlines()]
    first = [r for r in log if r["restart"] == 0]
    second = [r for r in log if r["restart"] == 1]
    assert [r["step"] for r in first] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [r["step"] for r in second] == [7, 8, 9, 10]  # checkpoint + 1 to the end, once
    assert {r["world_size"] for r in first} == {2} and {r["world_size"] for r in second} == {1}
    assert {r["resumed_from"] for r in second} == {6}
    # Steps 7 and 8 at 1 rank repeat those at 2: the same samples, weights and Adam state.
    for before, after in zip(first[6:], second[:2], strict=True):
        assert after["loss"] == pytest.approx(before["loss"], rel=1e-4)
    losses = [r["loss"] for r in first[:6] + second]
    assert sum(losses[-3:]) / 3 < 0.6 * sum(losses[:3]) / 3  # kept falling across the resume

"""The controller's wheelhouse lock (roles/ml_stack/files/wheelhouse_lock.py), run as the
role runs it: separate processes contending for one lock directory."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

from .. import rolefiles

LOCK = rolefiles.path("ml_stack", "files/wheelhouse_lock.py")


def lock(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOCK), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def holder(lockdir: pathlib.Path, hold_s: float) -> subprocess.Popen[str]:
    """A process that takes the lock, holds it hold_s seconds, releases it, like one run."""
    call = "subprocess.run([sys.executable, {!r}, {!r}, {!r}], check=True)\n"
    code = (
        "import subprocess, sys, time\n"
        + call.format(str(LOCK), "acquire", str(lockdir))
        + "print('acquired-at', time.time(), flush=True)\n"
        + f"time.sleep({hold_s})\n"
        + "print('releasing', time.time(), flush=True)\n"
        + call.format(str(LOCK), "release", str(lockdir))
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_second_run_waits_until_the_first_releases(tmp_path: pathlib.Path):
    lockdir = tmp_path / "wh" / "key.lock"
    first = holder(lockdir, 2.0)
    while not (lockdir / "owner.json").exists():
        time.sleep(0.05)
    second = holder(lockdir, 0.0)
    out1, _ = first.communicate(timeout=30)
    out2, _ = second.communicate(timeout=30)
    assert first.returncode == second.returncode == 0
    released_at = float(out1.split("releasing ")[1].split()[0])
    held_at = float(out2.split("acquired-at ")[1].split()[0])
    assert "waited for process" in out2
    assert held_at >= released_at  # never held by both at once
    assert not lockdir.exists()


def test_a_lock_left_by_a_dead_run_is_taken_over(tmp_path: pathlib.Path):
    lockdir = tmp_path / "key.lock"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lockdir.mkdir()
    (lockdir / "owner.json").write_text(json.dumps({"pid": dead.pid, "start": "1"}))
    proc = lock("acquire", str(lockdir), "--timeout", "5")
    assert proc.returncode == 0, proc.stderr
    assert "has ended" in proc.stdout


def test_a_live_holder_makes_a_bounded_wait_fail_with_one_line(tmp_path: pathlib.Path):
    lockdir = tmp_path / "key.lock"
    first = holder(lockdir, 10.0)
    try:
        while not (lockdir / "owner.json").exists():
            time.sleep(0.05)
        proc = lock("acquire", str(lockdir), "--timeout", "1")
    finally:
        first.kill()
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "still held by process" in proc.stderr and "remove that directory" in proc.stderr


def test_release_leaves_another_runs_lock_alone(tmp_path: pathlib.Path):
    lockdir = tmp_path / "key.lock"
    first = holder(lockdir, 3.0)
    try:
        while not (lockdir / "owner.json").exists():
            time.sleep(0.05)
        assert lock("release", str(lockdir)).returncode == 0
        assert (lockdir / "owner.json").exists()
    finally:
        first.kill()

"""`dscluster launch` as a long job's front end, on the shared e2e cluster: the job's lines
reach the console while it runs, Ctrl-C leaves it running under the head's supervisor (`jobs`
lists it, `logs -f` shows the rest, its exit status is root's record), and `stop` ends every
rank on every node, so the next launch on the same port starts at once."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .e2e_cluster import dsc
from .test_e2e_launch import HOSTS

pytestmark = pytest.mark.docker

# Not the launchers' default, nor another module's: other jobs may run meanwhile.
PORT = "29519"
# Rank 0 prints the head's clock with each step; every rank sleeps between steps.
TICKER = textwrap.dedent(
    """\
    import os, socket, sys, time
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    steps, pause = int(args[0]), float(args[1])
    rank = int(os.environ.get("RANK", "0"))
    for step in range(1, steps + 1):
        if rank == 0:
            os.write(1, f"TICK {step} {time.time():.3f}\\n".encode())
            os.write(1, f"DSCLUSTER_STEP {step}\\n".encode())
        time.sleep(pause)
    os.write(1, f"DONE {rank} {socket.gethostname()}\\n".encode())
    """
)


# `python -m dscluster` with SIGINT as a terminal's foreground command has it: make test runs
# its lanes in the background of a shell, whose children start with SIGINT ignored (POSIX),
# and Python then leaves it ignored.
INTERRUPTIBLE = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'dscluster'; runpy.run_module('dscluster', run_name='__main__')"
)


def job_id(text: str) -> str:
    found = re.search(r", run (launch-\S+)", text)
    assert found, text[-3000:]
    return found[1]


def jobs(cluster: pathlib.Path) -> dict[str, dict]:
    proc = dsc("jobs", "-i", str(cluster), "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {j["id"]: j for j in json.loads(proc.stdout)["jobs"]}


def left_on(host: str, pattern: str) -> str:
    """The processes on `host` whose command line holds `pattern` ("" when none)."""
    return subprocess.run(
        ["docker", "exec", f"dsc-{host}", "pgrep", "-a", "-f", pattern],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout.strip()  # fmt: skip


def test_output_streams_live_and_ctrl_c_leaves_the_job_running(
    cluster: pathlib.Path, tmp_path: pathlib.Path
):
    script = tmp_path / "ticker_live.py"
    script.write_text(TICKER)
    argv = [sys.executable, "-c", INTERRUPTIBLE, "launch", "-i", str(cluster), "--no-doctor"]
    argv += ["--master-port", PORT, "--", str(script), "20", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        delays = []
        for line in proc.stdout:
            if m := re.search(r"TICK (\d+) (\d+\.\d+)", line):
                delays.append(time.time() - float(m[2]))
                if int(m[1]) == 3:
                    break
        assert len(delays) == 3, delays
        # each step line reached this console within seconds of the rank printing it
        assert max(delays) < 5, delays
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    run = job_id(err)
    assert f"{run}: detached, the job runs on" in err and "dscluster stop -i " in err, err
    listed = jobs(cluster)[run]
    assert listed["state"] == "running" and listed["launcher"] == "deepspeed", listed
    assert listed["nodes"] == HOSTS and len(listed["attempts"]) == 1
    # the rest of the job, followed to its end
    rest = dsc("logs", "-i", str(cluster), run, "-f", timeout=300)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert "TICK 20 " in rest.stdout and rest.stdout.count("DONE ") == len(HOSTS), rest.stdout
    assert f"{run}: exited, exit 0" in rest.stderr, rest.stderr
    ended = jobs(cluster)[run]
    assert (ended["state"], ended["rc"], ended["last_step"]) == ("exited", 0, 20), ended
    # one node's lines alone, the last two
    tail = dsc("logs", "-i", str(cluster), run, "--host", HOSTS[0], "--tail", "2", timeout=120)
    lines = tail.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"{HOSTS[0]}: ") for line in lines), lines


def test_stop_ends_every_rank_and_the_port_is_free_at_once(
    cluster: pathlib.Path, tmp_path: pathlib.Path
):
    script = tmp_path / "ticker_stop.py"
    script.write_text(TICKER)
    base = ["launch", "-i", str(cluster), "--no-doctor", "--master-port", PORT]
    started = dsc(*base, "--detach", "--", str(script), "600", "1", timeout=300)
    assert started.returncode == 0, started.stderr[-3000:]
    run = job_id(started.stderr)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and jobs(cluster)[run].get("last_step") is None:
        time.sleep(2)
    assert jobs(cluster)[run]["last_step"] is not None, "the job never stepped"
    assert all(left_on(h, "ticker_stop") for h in HOSTS)
    stopped = dsc("stop", "-i", str(cluster), run, timeout=300)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert f"{run}: stopped" in stopped.stderr, stopped.stderr
    for host in HOSTS:
        assert left_on(host, "ticker_stop") == "", host
    # a finished job cannot be stopped again: one line
    again = dsc("stop", "-i", str(cluster), run, timeout=120)
    assert again.returncode == 1 and "has ended already" in again.stderr, again.stderr
    # the same port, at once
    short = dsc(*base, "--", str(script), "2", "0.1", timeout=300)
    assert short.returncode == 0, short.stdout[-3000:] + short.stderr[-3000:]
    assert short.stdout.count("DONE ") == len(HOSTS)

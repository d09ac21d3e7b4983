"""`dscluster launch --max-restarts` on the shared e2e cluster, for real: a DeepSpeed job
(jobs/resume_job.py, ZeRO-2) that loses a killed worker and then a frozen one resumes each
time from its last complete checkpoint on the nodes left and finishes; a script error is not
retried unless --retry-on-error; --min-nodes stops at once; a --min-nodes above the
inventory's nodes is refused before anything runs. Needs a Docker engine and a provisioned
cluster (test_e2e provisions it)."""

from __future__ import annotations

import itertools
import json
import pathlib
import re
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dscluster import jobs

from .e2e_cluster import NAME, NODES, docker, dsc
from .test_e2e_faults import container, restart

pytestmark = pytest.mark.docker

HOSTS = [f"{NAME}-n{i}" for i in range(1, NODES + 1)]
HEAD = container(HOSTS[0])
# Not the launchers' default 29500, nor another e2e module's: jobs may overlap on the cluster.
PORT = "29524"
RESUME_JOB = pathlib.Path(jobs.__file__).parent / "resume_job.py"
# The local cluster's shared storage (local up: external, /shared): the launch's default
# checkpoint directory is dscluster_checkpoint_dir/<launch id> there.
CHECKPOINTS = "/shared/dscluster/checkpoints"
STEPS, SAVE_EVERY = 18, 3
# Seconds from a node's loss to the CLI's exit without a restart: ssh notices a dead node
# within ~15 s (ServerAliveInterval 5 x 3), the launcher gets 10 s of grace, the play
# fetches the log (test_e2e_faults' bound).
BOUND = 90
# The job files of this module, as pkill patterns for what a test leaves behind.
JOB_FILES = "resume_job.py|restart_fails.py|restart_sleeper.py"

# On the head, with its own python3 (stdlib only): wait until attempt RESTART has just logged
# the step after a checkpoint it saved itself (marker written: the save is over), so the
# fault lands between two saves, never in one; prints that step.
BETWEEN_SAVES = textwrap.dedent(
    """\
    import json, os, sys, time
    d, restart, every, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    end = time.monotonic() + limit
    while time.monotonic() < end:
        steps = []
        try:
            with open(os.path.join(d, "steps.jsonl")) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line being appended
                    if rec["restart"] == restart:
                        steps.append(rec["step"])
        except OSError:
            pass
        if steps and steps[-1] % every == 1 and steps[-1] > 1:
            try:
                with open(os.path.join(d, f"global_step{steps[-1] - 1}", "dscluster.json")) as f:
                    if json.load(f).get("restart") == restart:
                        print(steps[-1])
                        sys.exit(0)
            except (OSError, ValueError):
                pass
        time.sleep(0.2)
    sys.exit(1)
    """
)


class Launch:
    """`dscluster launch` in the background, its stderr read as it comes (the launch id is
    in its first line)."""

    def __init__(self, cluster: pathlib.Path, *argv: str) -> None:
        cmd = [sys.executable, "-m", "dscluster", "launch", "-i", str(cluster), *argv]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.err: list[str] = []
        self.out = ""
        self._reader = threading.Thread(target=self._read_err, daemon=True)
        self._reader.start()
        self._out_reader = threading.Thread(target=self._read_out, daemon=True)
        self._out_reader.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line.rstrip("\n"))

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.read()

    def launch_id(self, limit: float = 120) -> str:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if m := re.search(r", head \S+, run (launch-\S+)", "\n".join(self.err)):
                return m[1]
            assert self.proc.poll() is None or self._reader.is_alive(), self.text()
            time.sleep(0.5)
        pytest.fail(f"no launch line within {limit} s: {self.text()}")

    def wait(self, limit: float = 900) -> int:
        rc = self.proc.wait(timeout=limit)
        self._reader.join(timeout=30)
        self._out_reader.join(timeout=30)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.wait(60)

    def text(self) -> str:
        return self.out[-3000:] + "\n".join(self.err)[-5000:]


def between_saves(
    launch: Launch, ckpt_dir: str, restart_no: int, limit: float = 420, attached: bool = True
) -> int:
    """The step attempt `restart_no` logged just after one of its own checkpoints (`attached`:
    the launch must still run meanwhile)."""
    waiter = subprocess.Popen(
        ["docker", "exec", HEAD, "python3", "-c", BETWEEN_SAVES, ckpt_dir, str(restart_no),
         str(SAVE_EVERY), str(limit)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while waiter.poll() is None:
            if attached and launch.proc.poll() is not None:
                pytest.fail(f"the launch ended before attempt {restart_no} saved: {launch.text()}")
            time.sleep(0.2)
        out, _ = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate(timeout=30)
    if waiter.returncode != 0:
        launch.kill()
        pytest.fail(f"attempt {restart_no} saved no checkpoint within {limit} s: {launch.text()}")
    return int(out)


def head_text(path: str) -> str:
    return docker("exec", HEAD, "cat", path, timeout=60)


def record_of(err: list[str]) -> dict:
    """The run record the one line names."""
    m = re.search(r"; run record (\S+\.json)", err[-1])
    assert m, err[-1]
    return json.loads(pathlib.Path(m[1]).read_text())


def whole_again(paused: list[str], killed: list[str]) -> None:
    """The frozen nodes thawed and the killed ones started, each with its sshd answering, and
    no rank of the job left on them: later tests find the cluster as it was."""
    for host in paused:
        subprocess.run(
            ["docker", "unpause", container(host)], capture_output=True, timeout=60, check=False
        )
    for host in killed:
        restart(host)
    for host in paused:
        restart(host)  # docker start of a running container is a no-op; waits for sshd
    for host in HOSTS:
        # a thawed rank's collective fails on its dead peers by itself; said, then made prompt
        left = subprocess.run(
            ["docker", "exec", container(host), "pkill", "-9", "-e", "-f", JOB_FILES],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if left.stdout.strip():
            print(f"left on {host}: {left.stdout.strip()}")


@pytest.mark.disruptive
def test_resumes_after_a_killed_then_a_frozen_worker(provisioned: pathlib.Path):
    """One launch, three attempts, no controller: `dscluster launch` is killed (SIGKILL) once
    the job runs, n3 killed (docker kill) during the first attempt, n2 frozen (docker pause)
    during the second; the head's supervisor resumes each time from the last complete
    checkpoint on the nodes left, and the job ends on the head alone at the step asked for.
    `logs -f` re-attaches until it ends, and `jobs --json` shows the three attempts."""
    killed, frozen = HOSTS[2], HOSTS[1]
    started = time.monotonic()
    launch = Launch(
        provisioned, "--max-restarts", "2", "--min-nodes", "1", "--master-port", PORT,
        "--timeout", "600", "--", str(RESUME_JOB), "--zero", "2", "--steps", str(STEPS),
        "--save-every", str(SAVE_EVERY), "--sleep-per-step", "1",
    )  # fmt: skip
    try:
        launch_id = launch.launch_id()
        ckpt_dir = f"{CHECKPOINTS}/{launch_id}"
        at = between_saves(launch, ckpt_dir, 0)
        launch.proc.kill()  # SIGKILL: the controller goes without a word
        launch.wait(60)
        docker("kill", container(killed))
        print(f"killed the launch and {killed} at step {at}, {time.monotonic() - started:.0f} s in")
        at = between_saves(launch, ckpt_dir, 1, attached=False)
        docker("pause", container(frozen))
        print(f"froze {frozen} at step {at}, {time.monotonic() - started:.0f} s in")
        logs = dsc("logs", "-i", str(provisioned), launch_id, "-f", timeout=900)
    finally:
        launch.kill()
        whole_again([frozen], [killed])
    print(f"the job took {time.monotonic() - started:.0f} s")
    assert logs.returncode == 0, logs.stderr[-3000:]
    assert f"{launch_id}: exited, exit 0 after " in logs.stderr, logs.stderr[-2000:]
    assert "; 3 attempts" in logs.stderr
    assert f"dscluster: restart 2 of 2: 1 nodes, 1 ranks, run {launch_id}-r2, resuming from " in (
        logs.stdout
    ), logs.stdout[-3000:]
    listed = dsc("jobs", "-i", str(provisioned), "--json", timeout=120)
    assert listed.returncode == 0, listed.stderr
    (entry,) = [j for j in json.loads(listed.stdout)["jobs"] if j["id"] == launch_id]
    assert (entry["state"], entry["rc"], entry["stopped"]) == ("exited", 0, "")
    check_record(entry["attempts"], launch_id, killed, frozen)
    check_steps(head_text(f"{ckpt_dir}/steps.jsonl"), entry["attempts"])


def check_record(attempts: list[dict], launch_id: str, killed: str, frozen: str) -> None:
    """Three attempts on 3, 2, 1 nodes, each resumed from the one before's last checkpoint
    (root's record, as `jobs --json` shows it)."""
    assert [a["nodes"] for a in attempts] == [HOSTS, HOSTS[:2], HOSTS[:1]], attempts
    assert [a["ended_why"] for a in attempts] == [
        f"lost nodes {killed}",
        f"lost nodes {frozen}",
        "ok",
    ], attempts
    assert [a["id"] for a in attempts] == [launch_id, f"{launch_id}-r1", f"{launch_id}-r2"]
    assert attempts[0]["resumed_from"] == ""
    for before, after in itertools.pairwise(attempts):
        assert before["tag_at_end"], attempts
        assert after["resumed_from"] == before["tag_at_end"], attempts


def check_steps(text: str, attempts: list[dict]) -> None:
    """resume_job's steps.jsonl: each attempt trained on from its checkpoint, once per step."""
    steps = [json.loads(line) for line in text.splitlines()]
    by_attempt = {r: [s for s in steps if s["restart"] == r] for r in range(3)}
    assert [s["restart"] for s in steps] == sorted(s["restart"] for s in steps)
    for r, done in by_attempt.items():
        numbers = [s["step"] for s in done]
        assert numbers, (r, steps)
        # within an attempt every step once, in order: none trained twice by it
        assert numbers == list(range(numbers[0], numbers[-1] + 1)), (r, numbers)
        assert {s["world_size"] for s in done} == {NODES - r}, (r, done)
        resumed = attempts[r]["resumed_from"]
        start = int(resumed.removeprefix("global_step")) if resumed else 0
        # the first step past the checkpoint it resumed from: none before it trained again
        assert numbers[0] == start + 1 and {s["resumed_from"] for s in done} == {start}, (r, done)
    assert by_attempt[2][-1]["step"] == STEPS
    # a step trained again after a restart had the same weights (the checkpoint's) and batch
    trained: dict[int, float] = {}
    for s in steps:
        if s["step"] in trained:
            assert s["loss"] == pytest.approx(trained[s["step"]], rel=1e-3), (s, trained)
        trained[s["step"]] = s["loss"]
    assert sorted(trained) == list(range(1, STEPS + 1))
    # one step's loss is noisy (a new batch each step): the mean of five at each end
    first = sum(trained[n] for n in range(1, 6)) / 5
    last = sum(trained[n] for n in range(STEPS - 4, STEPS + 1)) / 5
    assert last < first, (first, last, steps)


SCRIPT_ERROR = textwrap.dedent(
    """\
    import os, sys
    rank = int(os.environ["RANK"])
    print(f"RESTART_PROBE rank {rank} restart {os.environ.get('DSCLUSTER_RESTART')}", flush=True)
    sys.exit(3 if rank == 1 else 0)
    """
)


# --retry-on-error with one restart: each attempt is a whole stage-and-run play (~1 min here).
@pytest.mark.parametrize(("retry", "restarts"), [(False, 2), (True, 1)], ids=["plain", "retry"])
def test_a_script_error_is_not_retried_unless_asked(
    provisioned: pathlib.Path, tmp_path: pathlib.Path, retry: bool, restarts: int
):
    script = tmp_path / "restart_fails.py"
    script.write_text(SCRIPT_ERROR)
    argv = ["--max-restarts", str(restarts), "--no-doctor", "--master-port", PORT]
    argv += ["--timeout", "180", *(["--retry-on-error"] if retry else [])]
    started = time.monotonic()
    proc = dsc("launch", "-i", str(provisioned), *argv, "--", str(script), timeout=900)
    print(f"launch (retry {retry}): {time.monotonic() - started:.0f} s")
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = proc.stderr.strip().splitlines()
    assert f"job failed on rank 1 ({HOSTS[1]}), every node reachable" in err[-1], err[-1]
    record = record_of(err)
    attempts = record["attempts"]
    tries = restarts + 1 if retry else 1
    assert len(attempts) == tries, attempts
    assert all(a["ended_why"] == "script error" and a["nodes"] == HOSTS for a in attempts)
    assert record["stopped"] == (
        f"{restarts} of --max-restarts {restarts} used"
        if retry
        else "a script error is not retried (--retry-on-error retries it)"
    )
    # rank 1 ran in every attempt, with its restart number, each in its own log (stdout has
    # the last one's); another rank may not have started before the attempt was ended
    for n, attempt in enumerate(attempts):
        log = pathlib.Path(attempt["log"]).read_text()
        assert re.findall(r"RESTART_PROBE rank 1 restart (\d)", log) == [str(n)], log[-3000:]


SLEEPER = textwrap.dedent(
    """\
    import os, time
    for i in range(120):
        print(f"rank {os.environ['RANK']} tick {i}", flush=True)
        time.sleep(1)
    """
)


@pytest.mark.disruptive
def test_min_nodes_stops_at_once_with_one_line(provisioned: pathlib.Path, tmp_path: pathlib.Path):
    script = tmp_path / "restart_sleeper.py"
    script.write_text(SLEEPER)
    victim = HOSTS[2]
    launch = Launch(
        provisioned, "--max-restarts", "2", "--min-nodes", str(NODES), "--no-doctor",
        "--master-port", PORT, "--timeout", "300", "--", str(script),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert launch.proc.poll() is None, launch.text()
            found = subprocess.run(
                ["docker", "exec", container(victim), "pgrep", "-f", script.name],
                capture_output=True, timeout=60, check=False,
            )  # fmt: skip
            if found.returncode == 0:
                break
            time.sleep(1)
        else:
            pytest.fail(f"no rank on {victim} within 300 s: {launch.text()}")
        docker("kill", container(victim))
        killed = time.monotonic()
        rc = launch.wait(BOUND + 60)
        took = time.monotonic() - killed
    finally:
        launch.kill()
        whole_again([], [victim])
    print(f"the launch ended {took:.0f} s after the kill")
    assert rc != 0, launch.text()
    assert took < BOUND, f"the launch ended {took:.0f} s after the kill"
    line = launch.err[-1]
    assert line.startswith("dscluster: error: launch "), line
    assert (
        f"stopped: {NODES - 1} node(s) left ({', '.join(HOSTS[:2])}) after losing {victim}, "
        f"fewer than --min-nodes {NODES}" in line
    ), line
    record = record_of(launch.err)
    assert len(record["attempts"]) == 1 and record["attempts"][0]["ended_why"] == (
        f"lost nodes {victim}"
    )


def snapshot(inventory: pathlib.Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(inventory.rglob("*"))}


@pytest.mark.parametrize(
    ("extra", "nodes"), [((), NODES), (("--exclude", HOSTS[2]), NODES - 1)], ids=["all", "exclude"]
)
def test_min_nodes_above_the_runs_nodes_is_refused_before_anything(
    provisioned: pathlib.Path, tmp_path: pathlib.Path, extra: tuple[str, ...], nodes: int
):
    """Only the inventory knows the node count: refused in one line, nothing written."""
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('this must not run')\n")
    before = snapshot(provisioned)
    proc = dsc(
        "launch", "-i", str(provisioned), "--max-restarts", "1", "--min-nodes", str(nodes + 1),
        *extra, "--master-port", PORT, "--", str(script), timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"dscluster: error: --min-nodes {nodes + 1}: this run has {nodes} node(s)"
    ), err[0]
    assert err[0].endswith(f"give --min-nodes {nodes} or fewer"), err[0]
    assert snapshot(provisioned) == before

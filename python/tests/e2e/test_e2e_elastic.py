"""torchrun's elastic mode on the shared e2e cluster, for real: `launch --launcher torchrun
--nnodes 2:3 --max-restarts 2` of a gloo job, the last worker's container killed mid-run; the
agents on the two nodes left re-rendezvous, restart the workers from the step the job saved,
and the job finishes 0 within a bound. Needs a Docker engine and a provisioned cluster."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from .e2e_cluster import NAME, NODES, docker
from .test_e2e_faults import container, restart

pytestmark = pytest.mark.docker

WORKER = f"{NAME}-n{NODES}"
HEAD = container(f"{NAME}-n1")
# Not the launchers' default 29500: other jobs may run on a shared cluster meanwhile.
PORT = "29521"
STEPS = 40
KILL_AT = 10
# Seconds from the kill to the CLI's exit: the workers' collective timeout (20 s below),
# the dead agent's keep-alive and torch's last call (30 s), the restart, the steps left
# (0.5 s each), the play fetching the log. 70 s on an idle 2-core machine, 132 s at a load of
# 12; below the watcher's own bound (ELASTIC_RESTART_BOUND, 300 s), which would end a stall.
BOUND = 240

# Each step all-reduces a one; rank 0 saves the next step in the job directory (shared by
# the nodes), where a restarted run resumes. Every line the test reads is one os.write.
ELASTIC_JOB = textwrap.dedent(
    """\
    import datetime, os, sys, time
    import torch
    import torch.distributed as dist

    steps, saved = int(sys.argv[1]), sys.argv[2]
    # a short collective timeout: a peer gone fails the step in seconds, not 30 minutes
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    start = int(open(saved).read()) if os.path.exists(saved) else 0

    def say(text):
        line = f"ELASTIC rank={rank} world={world} restart={restart} {text}\\n"
        os.write(1, line.encode())

    say(f"start={start}")
    for step in range(start, steps):
        t = torch.ones(1)
        dist.all_reduce(t)
        if int(t.item()) != world:
            sys.exit(f"step {step}: all_reduce gave {t.item()}, not {world}")
        if rank == 0:
            with open(saved + ".tmp", "w") as f:
                f.write(str(step + 1))
            os.replace(saved + ".tmp", saved)
        time.sleep(0.5)
    say(f"done={steps}")
    dist.destroy_process_group()
    """
)
SAID_RE = re.compile(r"ELASTIC rank=(\d+) world=(\d+) restart=(\d+) (\w+)=(\d+)")


def saved_step(name: str) -> int:
    """The step this test's job saved last (its file `name`), read on the head (0 before its
    first): not an earlier run's, in an older job directory."""
    script = f"cat /shared/dscluster/jobs/launch-*/{name} 2>/dev/null"
    found = subprocess.run(
        ["docker", "exec", HEAD, "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return int(found.stdout) if found.stdout.strip().isdigit() else 0


def reachable_from_head(limit: float = 90) -> None:
    """Until the head reaches every node over ssh as the training user: the job must start on
    all of them, and test_e2e_faults starts a killed node again just before."""
    nodes = " ".join(f"{NAME}-n{i}" for i in range(2, NODES + 1))
    script = (
        f"for h in {nodes}; do ssh -o BatchMode=yes -o ConnectTimeout=5 $h true || exit 1; done"
    )
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        argv = ["docker", "exec", "-u", "ds", HEAD, "sh", "-c", script]
        if subprocess.run(argv, capture_output=True, timeout=60, check=False).returncode == 0:
            return
        time.sleep(2)
    pytest.fail(f"the head does not reach every node over ssh within {limit} s")


@pytest.mark.disruptive
def test_torchrun_elastic_goes_on_without_a_killed_worker(
    cluster: pathlib.Path, tmp_path: pathlib.Path
):
    reachable_from_head()
    script = tmp_path / "elastic_job.py"
    script.write_text(ELASTIC_JOB)
    argv = [sys.executable, "-m", "dscluster", "launch", "-i", str(cluster)]
    argv += ["--launcher", "torchrun", "--nnodes", "2:3", "--max-restarts", "2"]
    argv += ["--master-port", PORT, "--no-doctor", "--timeout", "400"]
    saved = f"elastic_step_{uuid.uuid4().hex}"
    argv += ["--", str(script), str(STEPS), saved]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while saved_step(saved) < KILL_AT:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"step {KILL_AT} not reached within 300 s"
            time.sleep(0.5)
        docker("kill", container(WORKER))
        killed = time.monotonic()
        out, err = proc.communicate(timeout=BOUND + 60)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        restart(WORKER)
    assert proc.returncode == 0, out[-4000:] + err[-3000:]
    slots = dict(re.findall(r"^(\S+) slots=(\d+)", (cluster / "hostfile").read_text(), re.M))
    world = sum(map(int, slots.values()))
    left = world - int(slots[WORKER])
    # (rank, world, restart, what, step) of each line the job said
    said = [(int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5])) for m in SAID_RE.finditer(out)]
    # the first run on every node, from step 0
    first = [s for s in said if s[3] == "start" and s[1] == world]
    assert sorted(s[0] for s in first) == list(range(world)), said
    assert {(s[2], s[4]) for s in first} == {(0, 0)}, said
    # the restarted run on the nodes left, from the step saved before the kill; the restart
    # count is each agent's own (pytorch#135712): one that restarted only because the others
    # re-rendezvoused counts none
    again = [s for s in said if s[3] == "start" and s[1] == left]
    assert sorted(s[0] for s in again) == list(range(left)), said
    assert all(s[4] >= KILL_AT for s in again) and max(s[2] for s in again) > 0, said
    done = [s for s in said if s[3] == "done"]
    assert sorted(s[0] for s in done) == list(range(left)), said
    assert all(s[1] == left and s[4] == STEPS for s in done), said
    assert len(said) == world + 2 * left, said  # no other start, no rank of the 3 finished
    assert f"torchrun's agents run the workers without {WORKER}: 2 nodes, restart " in out
    assert f"torchrun's agents finished the job on 2 nodes, without {WORKER}" in out
    assert "job exited 0" in err.strip().splitlines()[-1]
    assert took < BOUND, f"the job ended {took:.0f} s after the kill"
    print(f"elastic: the job ended {took:.0f} s after the kill")

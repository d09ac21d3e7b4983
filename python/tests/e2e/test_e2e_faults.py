"""Faults on the shared e2e cluster, for real: a rank killed and a worker container killed in
the middle of a smoke job end the CLI within a bounded time naming the lost node; provision
with a stopped worker finishes for the others, names it and leaves the launch files alone,
`--allow-degraded` goes on without it, and a later provision brings it back.
Needs a Docker engine and a provisioned cluster (test_e2e provisions it)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

from .e2e_cluster import NAME, NODES, docker, dsc

pytestmark = pytest.mark.docker

WORKER = f"{NAME}-n{NODES}"
# Not the launchers' default 29500: other jobs may run on a shared cluster meanwhile.
PORT = "29519"
# Seconds from the fault to the CLI's exit: ssh notices a dead node within ~15 s
# (ServerAliveInterval 5 x 3), the launcher gets 10 s of grace, the play fetches the log.
BOUND = 90


def container(host: str) -> str:
    return f"dsc-{host}"


def start_smoke(cluster: pathlib.Path, steps: int = 400) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "dscluster", "smoke", "-i", str(cluster), "--steps", str(steps)]
    argv += ["--timeout", "600", "--master-port", PORT, "--no-doctor"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_ranks(proc: subprocess.Popen[str], host: str, limit: float = 300) -> None:
    """Until the smoke job's rank runs on host (staging and launching take a while)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        found = subprocess.run(
            ["docker", "exec", container(host), "pgrep", "-f", "smoke_job.py"],
            capture_output=True,
            text=True,
            check=False,
        )
        if found.returncode == 0:
            return
        time.sleep(1)
    proc.kill()
    pytest.fail(f"no smoke_job.py rank on {host} within {limit} s: {proc.communicate()}")


def wait_for_init(proc: subprocess.Popen[str], host: str, limit: float = 300) -> None:
    """Until host's rank finished distributed init (its DeepSpeed comm op loaded, read from the
    launcher log on the head): from then on the ranks are in the training loop's collectives."""
    head = container(f"{NAME}-n1")
    script = (
        "log=$(ls -td /shared/dscluster/jobs/smoke-*/ | head -1)launcher.log; "
        f"grep -q '^{host}: .*deepspeed_shm_comm_op built successfully' \"$log\""
    )
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if (
            subprocess.run(["docker", "exec", head, "sh", "-c", script], check=False).returncode
            == 0
        ):
            return
        time.sleep(1)
    proc.kill()
    pytest.fail(f"{host}'s rank did not finish init within {limit} s: {proc.communicate()}")


def finish(proc: subprocess.Popen[str], since: float) -> tuple[str, str, float]:
    out, err = proc.communicate(timeout=600)
    return out, err, time.monotonic() - since


def restart(host: str) -> None:
    """Start a stopped or killed node and wait until its sshd answers again."""
    docker("start", container(host))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["docker", "exec", container(host), "systemctl", "is-active", "ssh"],
            capture_output=True,
            text=True,
            check=False,
        )
        if state.stdout.strip() == "active":
            return
        time.sleep(1)
    pytest.fail(f"sshd on {host} did not come back within 120 s")


def assert_lost(rc: int, err: str, took: float, host: str) -> None:
    assert rc == 1, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"dscluster: error: smoke job failed, lost node(s) {host} ("), line
    assert took < BOUND, f"the CLI exited {took:.0f} s after the fault"


def no_rank_left(hosts: list[str]) -> None:
    """The job's ranks on the healthy nodes were ended too (they held the port)."""
    for host in hosts:
        left = subprocess.run(
            ["docker", "exec", container(host), "pgrep", "-af", "smoke_job.py"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert left.returncode == 1, f"ranks left on {host}: {left.stdout}"


def test_smoke_with_a_killed_rank_ends_bounded_and_names_its_node(cluster: pathlib.Path):
    victim = f"{NAME}-n2"
    proc = start_smoke(cluster)
    wait_for_ranks(proc, victim)
    time.sleep(3)  # the healthy ranks then wait at rendezvous for the killed one
    docker("exec", container(victim), "pkill", "-9", "-f", "smoke_job.py")
    killed = time.monotonic()
    _, err, took = finish(proc, killed)
    assert_lost(proc.returncode, err, took, victim)
    report = json.loads((cluster / "reports" / "smoke-latest.json").read_text())
    assert report["ok"] is False and list(report["lost_nodes"]) == [victim]
    no_rank_left([f"{NAME}-n{i}" for i in range(1, NODES + 1)])


@pytest.mark.disruptive
def test_smoke_with_a_killed_worker_container_ends_bounded_and_names_it(cluster: pathlib.Path):
    proc = start_smoke(cluster)
    try:
        wait_for_init(proc, WORKER)  # ranks in collectives, not at rendezvous
        time.sleep(2)
        docker("kill", container(WORKER))
        killed = time.monotonic()
        _, err, took = finish(proc, killed)
    finally:
        if proc.poll() is None:
            proc.kill()
        restart(WORKER)
    assert_lost(proc.returncode, err, took, WORKER)
    # pdsh's exit 255, or ssh's own error when DeepSpeed's runner tries to end the job there
    assert f"({WORKER}: ssh" in err.strip().splitlines()[-1]
    no_rank_left([f"{NAME}-n{i}" for i in range(1, NODES)])


@pytest.mark.disruptive
def test_provision_with_a_stopped_worker_then_degraded_then_back(cluster: pathlib.Path):
    hostfile, env_file = cluster / "hostfile", cluster / ".deepspeed_env"
    degraded = cluster / "degraded.json"
    assert dsc("hostfile", "-i", str(cluster)).returncode == 0
    before = hostfile.read_bytes(), env_file.read_bytes()
    assert len(before[0].splitlines()) == NODES
    docker("stop", container(WORKER))
    try:
        # The whole site.yml: no play may stop the healthy nodes because one is down.
        started = time.monotonic()
        proc = dsc("provision", "-i", str(cluster), timeout=1200)
        took = time.monotonic() - started
        assert proc.returncode == 1, proc.stdout[-3000:]
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith(f"dscluster: error: provisioning (site.yml) failed on {WORKER}: "), (
            line
        )
        assert "hostfile and .deepspeed_env left unchanged" in line
        assert (hostfile.read_bytes(), env_file.read_bytes()) == before
        assert not degraded.exists()
        # the others went through every play (the summary table: failed 0, unreachable 0)
        rows = [r.split("│") for r in proc.stdout.splitlines() if r.count("│") == 7]
        summary = {r[1].strip(): [c.strip() for c in r[2:7]] for r in rows}
        for i in range(1, NODES):
            ok, _, failed, unreachable, _ = summary[f"{NAME}-n{i}"]
            assert (failed, unreachable) == ("0", "0") and int(ok) > 50, summary
        assert summary[WORKER][3] != "0", summary
        print(f"provision with {WORKER} stopped: {took:.0f} s")

        # --allow-degraded: the hostfile without the node, said in a warning, recorded
        proc = dsc("provision", "-i", str(cluster), "--tags", "preflight", "--allow-degraded")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"provisioned {NODES - 1} of {NODES} hosts" in proc.stdout
        warning = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: degraded")]
        assert len(warning) == 1 and f"{WORKER} left out of the hostfile" in warning[0]
        assert WORKER not in hostfile.read_text()
        assert len(hostfile.read_text().splitlines()) == NODES - 1
        assert list(json.loads(degraded.read_text())["excluded"]) == [WORKER]
        # later hostfiles keep it out, saying so each time
        proc = dsc("hostfile", "-i", str(cluster))
        assert proc.returncode == 0 and f"{WORKER} left out" in proc.stderr
        assert WORKER not in hostfile.read_text()
    finally:
        restart(WORKER)
    # a partial run (--tags) that reaches every node does not clear it: not provisioned yet
    proc = dsc("provision", "-i", str(cluster), "--tags", "preflight")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"warning: degraded cluster: {WORKER} left out" in proc.stderr
    assert WORKER not in hostfile.read_text()
    # the full site.yml that succeeds on every node clears the record: the full hostfile is
    # back. (Not --limit WORKER: the run above left the others' cluster known_hosts without
    # the stopped node's host key, and only cluster_ssh on them puts it back.)
    proc = dsc("provision", "-i", str(cluster), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"degraded record cleared: {WORKER} back in the hostfile" in proc.stdout
    assert not degraded.exists()
    assert (hostfile.read_bytes(), env_file.read_bytes()) == before

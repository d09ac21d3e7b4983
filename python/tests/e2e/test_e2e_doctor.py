"""`dscluster doctor` on the real local cluster: healthy first, then real faults injected
into the nodes (python/tests/faults.py), a few at a time on different nodes and checks.
Each round asserts the exact set of (node, check) that fail: the injected ones are named
and nothing else is blamed. Every fault is undone in a finally."""

from __future__ import annotations

import contextlib
import json
import pathlib
import time

import pytest

from . import faults
from .e2e_cluster import NAME, NODES, docker, dsc

pytestmark = pytest.mark.docker

HEAD, N2, N3 = (f"{NAME}-n{i}" for i in range(1, 4))


def container(host: str) -> str:
    return f"dsc-{host}"


def run_doctor(cluster: pathlib.Path) -> tuple[int, dict, str]:
    proc = dsc("doctor", "-i", str(cluster), "--json", timeout=600)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"doctor printed no JSON (rc {proc.returncode}): {proc.stderr[-2000:]}")
    return proc.returncode, report, proc.stderr


def failed(report: dict) -> set[tuple[str, str]]:
    return {(f["host"], f["check"]) for f in report["failures"]}


def said(report: dict) -> str:
    """Every failure as doctor said it: the message of an assertion on failed()."""
    return "\n".join(f"{f['host']} {f['check']}: {f['detail']}" for f in report["failures"])


def detail(report: dict, host: str, check: str) -> str:
    return "; ".join(report["checks"][check][host]["details"])


@contextlib.contextmanager
def injected(*undos):
    undo_list = list(undos)
    try:
        yield undo_list
    finally:
        for undo in reversed(undo_list):
            undo()


def test_healthy_cluster_passes_every_check(cluster: pathlib.Path):
    assert NODES == 3
    assert dsc("hostfile", "-i", str(cluster)).returncode == 0
    started = time.monotonic()
    rc, report, _ = run_doctor(cluster)
    took = time.monotonic() - started
    assert rc == 0, report["failures"]
    assert report["ok"] is True
    assert report["hosts"] == [HEAD, N2, N3]
    for check, cells in report["checks"].items():
        for host, cell in cells.items():
            # a shared-storage cluster with enough disk: nothing is skipped or warned
            assert cell["status"] == "pass", (check, host, cell)
    assert "→" not in json.dumps(report["failures"])
    saved = json.loads((cluster / "reports" / "doctor-latest.json").read_text())
    assert saved["ok"] is True
    # the table and summary for people
    proc = dsc("doctor", "-i", str(cluster))
    assert proc.returncode == 0
    assert "doctor: every check passed on 3 nodes" in proc.stdout
    for check in ("ssh", "ports", "versions", "memlock"):
        assert check in proc.stdout
    print(f"doctor on a healthy 3-node cluster: {took:.1f} s")


def test_round_1_known_hosts_other_deepspeed_shm_libaio(cluster: pathlib.Path):
    """n2 lost n3's pinned key; n3 has a hand-installed deepspeed and a 64 MiB /dev/shm;
    the head lost libaio. Then provision puts n3's deepspeed back."""
    with injected(
        faults.remove_known_host(container(N2), N3),
        faults.shrink_shm(container(N3), "64m"),
        faults.hide_libaio(container(HEAD)),
    ):
        assert faults.install_other_deepspeed(container(N3), "0.19.7") == "0.19.7"
        rc, report, _ = run_doctor(cluster)
        assert rc == 1
        assert failed(report) == {
            (N2, "ssh"),
            (N3, "versions"),
            (N3, "shm"),
            (HEAD, "libaio"),
        }, said(report)
        assert "Host key verification failed" in detail(report, N2, "ssh")
        assert f"{N2} → {N3}" in detail(report, N2, "ssh")
        assert f"deepspeed 0.19.7 here, 0.19.8 on {HEAD}, {N2}" in detail(report, N3, "versions")
        assert "/dev/shm is 64 MiB" in detail(report, N3, "shm")
        assert "libaio.so.1" in detail(report, HEAD, "libaio")
        # people get one line per failure with the fix
        proc = dsc("doctor", "-i", str(cluster))
        assert proc.returncode == 1
        assert f"FAIL {N3} versions: deepspeed 0.19.7 here" in proc.stdout
        assert "fix: run 'dscluster provision'" in proc.stdout
        assert proc.stdout.strip().splitlines()[-1].startswith("doctor: 4 failure(s) on ")
    # provision puts the locked deepspeed back on n3 (ml_stack reinstalls the locked wheels):
    # the ml_stack play alone (the other faults were undone above), not the whole site.yml
    prov = dsc("provision", "-i", str(cluster), "--tags", "ml_stack")
    assert prov.returncode == 0, prov.stderr[-2000:]
    rc, report, _ = run_doctor(cluster)
    assert rc == 0, report["failures"]
    assert "deepspeed 0.19.8" in detail(report, N3, "versions")


def test_round_2_rendezvous_port_ephemeral_ports_ifname_memlock(cluster: pathlib.Path):
    """The head drops new connections to the rendezvous port; n3 drops new connections to
    its whole ephemeral range; n2's nccl.conf names an interface it lacks; n3's memlock for
    the training user is 16 KiB. smoke refuses to start and says why."""
    with injected(
        faults.block_tcp(container(HEAD), "29500"),
        faults.block_tcp(container(N3), faults.ephemeral_range(container(N3))),
        faults.wrong_nccl_ifname(container(N2), "ib9"),
        faults.lower_memlock(container(N3), "ds", 16),
    ):
        rc, report, _ = run_doctor(cluster)
        assert rc == 1
        assert failed(report) == {
            (HEAD, "rendezvous"),
            (N3, "ports"),
            (N2, "ifname"),
            (N3, "memlock"),
        }, said(report)
        assert f"no node reaches {HEAD}:29500" in detail(report, HEAD, "rendezvous")
        assert f"no node reaches {N3}'s ephemeral ports" in detail(report, N3, "ports")
        assert "NCCL_SOCKET_IFNAME=ib9 matches no interface" in detail(report, N2, "ifname")
        assert "16 KiB" in detail(report, N3, "memlock")
        started = time.monotonic()
        smoke = dsc("smoke", "-i", str(cluster), "--steps", "5", timeout=600)
        assert smoke.returncode == 1
        last = smoke.stderr.strip().splitlines()[-1]
        assert "doctor: 4 failure(s)" in last and "smoke not started" in last, last
        assert time.monotonic() - started < 240


def test_round_3_stale_hosts_entry_pdsh_missing_hostfile_slots(cluster: pathlib.Path):
    """n2 resolves n3 to a stale address; pdsh is gone from the head; the hostfile claims
    two slots on n3, a CPU node with one."""
    with injected(
        faults.stale_hosts_entry(container(N2), N3),
        faults.remove_pdsh(container(HEAD)),
        faults.edit_hostfile(cluster, N3, 2),
    ):
        rc, report, _ = run_doctor(cluster)
        assert rc == 1
        # n2 cannot log in to n3 either (ssh goes to the stale address): the same node
        assert failed(report) == {(N2, "resolve"), (N2, "ssh"), (HEAD, "pdsh"), (N3, "slots")}, (
            said(report)
        )
        assert f"resolves {N3} to 10.255.255.1" in detail(report, N2, "resolve")
        assert "pdsh is not installed on the head" in detail(report, HEAD, "pdsh")
        assert "slots=2" in detail(report, N3, "slots")
        assert {report["checks"]["memlock"][h]["status"] for h in (HEAD, N2, N3)} == {"skip"}


@pytest.mark.disruptive
def test_stopped_node_fails_reach_only_and_doctor_ends_bounded(cluster: pathlib.Path):
    docker("stop", container(N3))
    try:
        started = time.monotonic()
        rc, report, _ = run_doctor(cluster)
        took = time.monotonic() - started
    finally:
        docker("start", container(N3))
    assert rc == 1
    assert failed(report) == {(N3, "reach")}, said(report)
    assert report["checks"]["ssh"][N3]["status"] == "skip"
    assert took < 180, f"doctor took {took:.0f} s with a node down"

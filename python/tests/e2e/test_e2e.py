"""End to end on real containers: local up -> provision -> hostfile -> DeepSpeed's own
parsers on the head -> smoke job across every slot. Slow; needs a Docker engine."""

from __future__ import annotations

import json
import pathlib
import time

import pytest
import yaml

from dscluster.hostfile import render_hostfile

from .e2e_cluster import NAME, NODES, docker, dsc

pytestmark = pytest.mark.docker


def container_ids() -> list[str]:
    return sorted(
        docker("ps", "-q", "--no-trunc", "--filter", f"label=dscluster.cluster={NAME}").split()
    )


def test_local_up_is_idempotent(cluster: pathlib.Path):
    before_ids, before_inv = container_ids(), (cluster / "hosts.yml").read_text()
    again = dsc("local", "up", "--name", NAME, "--nodes", str(NODES))
    assert again.returncode == 0, again.stderr
    assert container_ids() == before_ids
    assert (cluster / "hosts.yml").read_text() == before_inv
    data = yaml.safe_load(before_inv)["all"]
    assert list(data["children"]["head"]["hosts"]) == [f"{NAME}-n1"]
    assert list(data["children"]["workers"]["hosts"]) == [f"{NAME}-n{i}" for i in (2, 3)]
    assert "StrictHostKeyChecking=yes" in data["vars"]["ansible_ssh_common_args"]


def test_provision(cluster: pathlib.Path, first_provision):
    proc = first_provision  # the run itself is conftest's, shared with the second_cluster modules
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"provisioned {NODES} hosts" in proc.stdout
    for i in range(1, NODES + 1):
        assert (cluster / "facts" / f"{NAME}-n{i}.json").is_file()


def test_wrong_nccl_socket_ifname_fails_preflight_naming_the_node(cluster: pathlib.Path):
    host_vars = cluster / "host_vars"
    host_vars.mkdir(exist_ok=True)
    override = host_vars / f"{NAME}-n2.yml"
    override.write_text("dscluster_nccl_socket_ifname: ib9\n")
    try:
        proc = dsc("provision", "-i", str(cluster), "--playbook", "preflight.yml", timeout=300)
    finally:
        override.unlink()
    assert proc.returncode == 1, proc.stdout[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("dscluster: error: provisioning (preflight.yml) failed on "), line
    assert f"{NAME}-n2: NCCL_SOCKET_IFNAME=ib9 matches no interface with an IPv4 address" in line
    assert "this node has: eth0 (" in line
    assert f"{NAME}-n1:" not in line and f"{NAME}-n3:" not in line


def test_launch_files_accepted_by_deepspeed(cluster: pathlib.Path, tmp_path: pathlib.Path):
    proc = dsc("hostfile", "-i", str(cluster))
    assert proc.returncode == 0, proc.stderr
    hostfile = (cluster / "hostfile").read_text()
    env_text = (cluster / ".deepspeed_env").read_text()
    assert hostfile.splitlines()[0].startswith(f"{NAME}-n1 ")
    head = f"dsc-{NAME}-n1"
    docker("exec", head, "mkdir", "-p", "/tmp/dscheck")
    for name in ("hostfile", ".deepspeed_env"):
        docker("cp", str(cluster / name), f"{head}:/tmp/dscheck/{name}")
    # and slots above one, as on GPU nodes (this cluster's CPU nodes have one each)
    multi = tmp_path / "hostfile_multi"
    multi.write_text(render_hostfile([("gpu-4", 4), ("gpu-2", 2)]))
    docker("cp", str(multi), f"{head}:/tmp/dscheck/hostfile_multi")
    # DeepSpeed's own code paths: the launcher's hostfile parser, and the PDSH runner's
    # export handling of .deepspeed_env lines (split on '=', then add_export).
    check = r"""
import json, types
from deepspeed.launcher.runner import fetch_hostfile
from deepspeed.launcher.multinode_runner import PDSHRunner
pool = fetch_hostfile('/tmp/dscheck/hostfile')
multi = fetch_hostfile('/tmp/dscheck/hostfile_multi')
args = types.SimpleNamespace(user_args=[], user_script='x.py', launcher_args='', ssh_port=None)
runner = PDSHRunner(args, 'e30=')
raw = {}
for line in open('/tmp/dscheck/.deepspeed_env').readlines():
    key, val = line.split('=', maxsplit=1)
    runner.add_export(key, val)
    raw[key.strip()] = val.strip()
print(json.dumps({'pool': dict(pool), 'multi': dict(multi), 'exports': runner.exports, 'raw': raw}))
"""
    # DeepSpeed logs to stdout while importing: the JSON is the last line.
    printed = docker("exec", head, "/opt/dscluster/venv/bin/python", "-c", check)
    out = json.loads(printed.strip().splitlines()[-1])
    assert out["pool"] == {f"{NAME}-n{i}": 1 for i in range(1, NODES + 1)}
    assert out["multi"] == {"gpu-4": 4, "gpu-2": 2}
    assert list(out["multi"]) == ["gpu-4", "gpu-2"]  # the head first, as written
    assert out["exports"] == out["raw"]  # nothing quoted or changed by DeepSpeed
    assert out["exports"]["PATH"].startswith("/opt/dscluster/venv/bin:")
    assert "GLOO_SOCKET_IFNAME" in out["exports"]
    assert len(env_text.splitlines()) == len(out["raw"])


def test_smoke_zero2_across_every_slot(cluster: pathlib.Path):
    started = time.monotonic()
    proc = dsc("smoke", "-i", str(cluster), "--zero", "2", "--json", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((cluster / "reports" / "smoke-latest.json").read_text())
    assert report["ok"] is True
    assert report["world_size"] == NODES
    # doctor ran first and passed
    assert "smoke: running doctor first" in proc.stderr
    assert json.loads((cluster / "reports" / "doctor-latest.json").read_text())["ok"] is True
    assert report["backend"] == "gloo"
    assert {r["host"] for r in report["ranks"]} == {f"{NAME}-n{i}" for i in range(1, NODES + 1)}
    assert all(r["last_loss"] < r["first_loss"] for r in report["ranks"])
    assert len({r["checksum"] for r in report["ranks"]}) == 1
    # Every rank timed its first step from the launch this command made (a figure, not a
    # target: make bench holds the speed ones); the ops it needs are pre-built, not JIT.
    elapsed = time.monotonic() - started
    assert all(0 < (r["first_step_s"] or 0) < elapsed for r in report["ranks"]), report["ranks"]
    assert {"cpu_adam", "deepspeed_shm_comm"} <= set(report["installed_ops"])
    assert [row["bytes"] for row in report["allreduce"]] == [1 << 20, 8 << 20, 32 << 20]
    for row in report["allreduce"]:
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (NODES - 1) / NODES)
    assert time.monotonic() - started < 900
    # The ranks' bytecode went to the training user's PYTHONPYCACHEPREFIX (the venv is root's):
    # on every node the next job's imports read it instead of compiling DeepSpeed again.
    env = dict(ln.split("=", 1) for ln in (cluster / ".deepspeed_env").read_text().splitlines())
    prefix = env["PYTHONPYCACHEPREFIX"]
    assert prefix == "/opt/dscluster/pycache"
    python = f"{env['PATH'].split(':')[0]}/python"
    for i in range(1, NODES + 1):
        out = docker(
            "exec", "-u", "ds", f"dsc-{NAME}-n{i}", "sh", "-c",
            f"PYTHONPYCACHEPREFIX={prefix} {python} -v -c 'import deepspeed.runtime.engine' 2>&1",
        )  # fmt: skip
        read = [ln for ln in out.splitlines() if ln.startswith("# code object from ")]
        engine = [ln for ln in read if "/deepspeed/runtime/engine.cpython-" in ln]
        assert engine and engine[0].startswith(f"# code object from '{prefix}/"), read[-20:]


@pytest.mark.disruptive
def test_smoke_with_a_stopped_worker_ends_bounded_and_names_it(cluster: pathlib.Path):
    lost = f"{NAME}-n{NODES}"
    docker("stop", f"dsc-{NAME}-n{NODES}")
    try:
        started = time.monotonic()
        # --no-doctor: doctor would refuse to start (test_e2e_doctor covers that); this is
        # about the launcher's own bounded exit when a node is gone
        proc = dsc("smoke", "-i", str(cluster), "--timeout", "45", "--no-doctor", timeout=600)
        took = time.monotonic() - started
    finally:
        docker("start", f"dsc-{NAME}-n{NODES}")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("dscluster: error: smoke job failed, lost node(s) " + lost)
    assert took < 300, f"smoke took {took:.0f} s with a node down"
    report = json.loads((cluster / "reports" / "smoke-latest.json").read_text())
    assert report["ok"] is False
    assert list(report["lost_nodes"]) == [lost]

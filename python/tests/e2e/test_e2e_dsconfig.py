"""`dscluster dsconfig` end to end on the shared e2e cluster: configs checked by the cluster's
own DeepSpeed and run by the smoke job, with the checkpoint settings the storage kind asks
for, saved and loaded for real.

- ZeRO-3 + CPU offload on the cluster's shared volume (storage `external`): one shared
  checkpoint directory, tag validation Fail; the smoke job trains, saves, loads it back.
- ZeRO-3 + NVMe offload on a copy of the inventory that declares no shared storage: the
  launcher play makes node-local checkpoint and scratch directories, the job files are pushed
  to every node, and the config says use_node_local_storage; the job swaps to node-local
  scratch through DeepSpeed's async_io op.
- Bad NVMe paths: on shared storage refused before any node is touched; missing on the nodes
  reported per node, nothing written.
Needs a Docker engine and a provisioned cluster."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest
import yaml

from .e2e_cluster import NAME, NODES, dsc

pytestmark = pytest.mark.docker

HOSTS = [f"{NAME}-n{i}" for i in range(1, NODES + 1)]
PORT = "29519"  # not the launchers' default, nor the other e2e modules'


def node_sh(host: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "exec", f"dsc-{host}", "bash", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def latest_report(inv: pathlib.Path) -> dict:
    return json.loads((inv / "reports" / "smoke-latest.json").read_text())


def test_zero3_cpu_offload_config_runs_with_a_shared_checkpoint(cluster: pathlib.Path):
    out = cluster / "dsconfig" / "ds_config_zero3_cpu.json"
    out.unlink(missing_ok=True)
    # A learning rate that moves the smoke job's small model within its steps.
    proc = dsc(
        "dsconfig", "-i", str(cluster), "--zero", "3", "--offload", "cpu", "--lr", "0.003",
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout
    # DeepSpeed on the head accepted it with the cluster's world size.
    assert f"accepts it: ZeRO-3, train_batch_size {NODES} = 1 x 1 x world" in proc.stderr
    config = json.loads(out.read_text())
    zero = config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert zero["offload_param"] == {"device": "cpu", "pin_memory": False}
    assert config["train_batch_size"] == NODES
    assert "bf16" not in config and "fp16" not in config  # CPU nodes: fp32
    assert config["checkpoint"] == {"tag_validation": "Fail", "use_node_local_storage": False}

    run = dsc(
        "smoke", "-i", str(cluster), "--ds-config", str(out), "--steps", "12", "--no-doctor",
        "--master-port", PORT, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = latest_report(cluster)
    assert report["ok"] is True and report["ds_config"] == "ds_config.json"
    (entry,) = report["configs"]
    assert (entry["zero_stage"], entry["offload"], entry["status"]) == (3, "cpu", "passed")
    assert entry["checks"]["checkpoint_restored_on_every_rank"] is True
    for r in entry["ranks"]:
        assert r["engine"]["zero_stage"] == 3 and r["engine"]["param_offload"], r
        ckpt = r["checkpoint"]
        assert ckpt["dir"] == f"/shared/dscluster/checkpoints/{report['run_id']}"
        assert ckpt["node_local"] is False and ckpt["loaded"] and ckpt["restored"], ckpt
    # One shared directory: every node saw every rank's files; it is gone after the run.
    assert len({r["checkpoint"]["files_here"] for r in entry["ranks"]}) == 1
    for host in HOSTS:
        left = node_sh(host, f"test ! -e /shared/dscluster/checkpoints/{report['run_id']}")
        assert left.returncode == 0, f"checkpoint left on {host}"


def test_nvme_path_problems_are_named_and_nothing_is_written(cluster: pathlib.Path):
    out = cluster / "dsconfig" / "bad.json"
    out.unlink(missing_ok=True)
    shared = dsc(
        "dsconfig", "-i", str(cluster), "--zero", "3", "--offload", "nvme",
        "--nvme-path", "/shared/nvme", "--out", str(out),
    )  # fmt: skip
    assert shared.returncode == 1
    assert "is on shared storage (external at /shared)" in shared.stderr
    assert len(shared.stderr.strip().splitlines()) == 1
    missing = dsc(
        "dsconfig", "-i", str(cluster), "--zero", "3", "--offload", "nvme",
        "--nvme-path", "/nonexistent/nvme", "--out", str(out), timeout=600,
    )  # fmt: skip
    assert missing.returncode == 1
    line = missing.stderr.strip().splitlines()[-1]
    assert line.startswith("dscluster: error: ") and "problem(s), nothing written" in line, line
    for host in HOSTS:
        assert f"{host}: NVMe path /nonexistent/nvme does not exist" in line
    assert not out.exists()


@pytest.fixture
def local_storage_inventory(cluster: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    """The e2e cluster's inventory, copied, saying there is no shared storage."""
    inv = tmp_path / "nolocal"
    inv.mkdir()
    shutil.copytree(cluster / "facts", inv / "facts")
    data = yaml.safe_load((cluster / "hosts.yml").read_text())
    data["all"]["vars"]["dscluster_shared_storage"] = "none"
    (inv / "hosts.yml").write_text(yaml.safe_dump(data, sort_keys=False))
    return inv


def test_zero3_nvme_config_with_node_local_checkpoints(local_storage_inventory: pathlib.Path):
    inv = local_storage_inventory
    # The launcher play makes the node-local checkpoint directory on every node.
    play = dsc("provision", "-i", str(inv), "--tags", "launcher", timeout=900)
    assert play.returncode == 0, play.stdout[-3000:] + play.stderr[-3000:]
    for host in HOSTS:
        made = node_sh(
            host,
            "stat -c '%U %a' /var/lib/dscluster/checkpoints /var/lib/dscluster/scratch",
        )
        # the checkpoints are the training user's alone (SECURITY.md)
        assert made.stdout.split("\n")[:2] == ["ds 700", "ds 750"], (host, made.stdout)
    # DeepSpeed's default swap buffers (5 x 1e8 elements) lock far more memory than a
    # container may (docker's default ulimit -l): refused, naming every node.
    big = dsc("dsconfig", "-i", str(inv), "--zero", "3", "--offload", "nvme", timeout=600)
    assert big.returncode == 1, big.stdout[-2000:] + big.stderr[-3000:]
    line = big.stderr.strip().splitlines()[-1]
    for host in HOSTS:
        # the whole stderr on failure: the tasks the check ran before the verdict
        assert f"{host}: NVMe offload locks 1907 MiB per rank for its swap buffers" in line, (
            big.stdout[-2000:] + big.stderr[-4000:]
        )
    assert not (inv / "dsconfig" / "ds_config_zero3_nvme.json").exists()
    # Buffers that fit (and hold the smoke model's largest parameter, 256 x 256).
    proc = dsc(
        "dsconfig", "-i", str(inv), "--zero", "3", "--offload", "nvme", "--lr", "0.003",
        "--nvme-buffer-size", "100000", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = inv / "dsconfig" / "ds_config_zero3_nvme.json"
    config = json.loads(out.read_text())
    zero = config["zero_optimization"]
    for key in ("offload_optimizer", "offload_param"):
        assert zero[key]["device"] == "nvme"
        assert zero[key]["nvme_path"] == "/var/lib/dscluster/scratch"
    assert config["aio"]["block_size"] == 1048576
    assert config["checkpoint"]["use_node_local_storage"] is True
    assert "use_node_local_storage True" in proc.stderr

    run = dsc(
        "smoke", "-i", str(inv), "--ds-config", str(out), "--steps", "12", "--no-doctor",
        "--master-port", PORT, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = latest_report(inv)
    (entry,) = report["configs"]
    assert (entry["offload"], entry["status"]) == ("nvme", "passed"), entry
    assert entry["checks"]["checkpoint_restored_on_every_rank"] is True
    for r in entry["ranks"]:
        assert r["engine"]["optimizer_swap_nvme"] and r["engine"]["param_swap_nvme"], r
        ckpt = r["checkpoint"]
        assert ckpt["dir"] == f"/var/lib/dscluster/checkpoints/{report['run_id']}"
        assert ckpt["node_local"] is True and ckpt["restored"], ckpt
    # Job files were pushed to every node (no shared storage), and the run cleaned up.
    job = f"/shared/dscluster/jobs/{report['run_id']}"
    for host in HOSTS:
        staged = node_sh(host, f"test -f {job}/ds_config.json && test -f {job}/smoke_job.py")
        assert staged.returncode == 0, f"job files not on {host}"
        gone = node_sh(
            host,
            f"test ! -e /var/lib/dscluster/checkpoints/{report['run_id']} && "
            f"test ! -e /var/lib/dscluster/scratch/smoke-nvme/{report['run_id']}",
        )
        assert gone.returncode == 0, f"checkpoint or swap left on {host}"

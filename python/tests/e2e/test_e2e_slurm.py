"""End to end: the `slurm` role on the shared local cluster (real slurm-wlm 22.05 + munge in the
node containers), then real jobs through srun, salloc and sbatch (torchrun with c10d
rendezvous running the project's DeepSpeed smoke job across two nodes).

Needs the cluster test_e2e provisions (the session fixture `cluster`). Run alone against a
provisioned cluster: DSCLUSTER_E2E_NAME=dev DSCLUSTER_E2E_REUSE=1 pytest tests/test_e2e_slurm.py
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time
import uuid

import hostlist
import pytest
import yaml

from dscluster.jobs import SMOKE_JOB_FILES

from .. import rolefiles
from .e2e_cluster import NAME, NODES, docker, dsc

pytestmark = pytest.mark.docker

HEAD = f"dsc-{NAME}-n1"
HOSTS = [f"{NAME}-n{i}" for i in range(1, NODES + 1)]
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
JOBS = rolefiles.REPO / "python" / "src" / "dscluster" / "jobs"


def on_head(*argv: str, user: str = "ds", timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "exec", "-u", user, "-w", "/tmp", HEAD, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def submit_and_wait(script: str, timeout: float) -> tuple[str, str]:
    """sbatch the script as ds, then poll scontrol every second until the job ends (sbatch
    --wait backs off to long sleeps); returns (JobState, ExitCode)."""
    sub = on_head("sbatch", "--parsable", script)
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        show = on_head("scontrol", "show", "job", "--oneliner", job).stdout
        fields = dict(f.split("=", 1) for f in show.split() if "=" in f)
        if fields.get("JobState") in TERMINAL_STATES:
            return fields["JobState"], fields.get("ExitCode", "")
        time.sleep(1)
    on_head("scancel", job)
    raise AssertionError(f"job {job} ({script}) did not end within {timeout} s")


def inventory_vars(cluster: pathlib.Path) -> dict:
    return yaml.safe_load((cluster / "hosts.yml").read_text())["all"]["vars"]


def changes(proc: subprocess.CompletedProcess[str]) -> int:
    m = re.search(r"provisioned \d+ hosts, (\d+) changes", proc.stdout)
    assert m, proc.stdout[-2000:] + proc.stderr[-2000:]
    return int(m.group(1))


@pytest.fixture(scope="module")
def slurm_switch(cluster: pathlib.Path):
    """Writes `dscluster_slurm: <bool>` into the inventory's group_vars/all.yml (other keys
    kept); restores the file as it was at the end of the module."""
    path = cluster / "group_vars" / "all.yml"
    before = path.read_text() if path.exists() else None

    def switch(on: bool) -> None:
        data = (yaml.safe_load(before) if before else None) or {}
        data["dscluster_slurm"] = on
        path.parent.mkdir(exist_ok=True)
        path.write_text("---\n" + yaml.safe_dump(data, sort_keys=True))

    yield switch
    if before is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(before)


def test_slurm_play_is_off_without_the_switch(cluster: pathlib.Path, slurm_switch):
    slurm_switch(False)
    proc = dsc("provision", "-i", str(cluster), "--playbook", "slurm.yml", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "Select the Slurm cluster" in out
    assert "Slurm and munge" not in out  # the role's play matched no host
    assert changes(proc) == 0


def test_slurm_play_provisions_and_verifies(cluster: pathlib.Path, slurm_switch):
    slurm_switch(True)
    proc = dsc("provision", "-i", str(cluster), "--playbook", "slurm.yml", timeout=900)
    # The role's verify fails the play unless munge credentials cross nodes, slurm.conf is the
    # same everywhere, every node registers idle with its CPUs, and srun reaches every node.
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"provisioned {NODES} hosts" in proc.stdout
    for task in ("Check munge credentials cross", "Check srun ran on every node"):
        assert task in proc.stdout + proc.stderr

    # The cluster's one munge key: made on the controller, outside the repo, 0400, on every node.
    key = pathlib.Path(inventory_vars(cluster)["dscluster_state_dir"]) / "munge.key"
    repo = rolefiles.REPO
    assert key.stat().st_mode & 0o777 == 0o400
    assert not key.resolve().is_relative_to(repo)
    sums = set()
    for host in HOSTS:
        node = f"dsc-{host}"
        stat = docker("exec", node, "stat", "-c", "%U %a", "/etc/munge/munge.key").split()
        assert stat == ["munge", "400"], (host, stat)
        sums.add(docker("exec", node, "sha256sum", "/etc/munge/munge.key", "/etc/slurm/slurm.conf"))
        assert docker("exec", node, "systemctl", "is-active", "munge", "slurmd").split() == [
            "active",
            "active",
        ]
    assert len(sums) == 1, sums  # same key and slurm.conf everywhere
    assert docker("exec", HEAD, "systemctl", "is-active", "slurmctld").strip() == "active"

    conf = docker("exec", HEAD, "cat", "/etc/slurm/slurm.conf")
    assert f"ClusterName={NAME}\n" in conf
    assert re.search(rf"^SlurmctldHost={NAME}-n1\(", conf, re.M)
    assert "ProctrackType=proctrack/linuxproc" in conf and "TaskPlugin=task/none" in conf
    nodes = {}
    for host in HOSTS:
        facts = json.loads((cluster / "facts" / f"{host}.json").read_text())
        cpus = facts["accelerators"]["cpus"]
        assert re.search(rf"^NodeName={host} .*CPUs={cpus} ", conf, re.M), conf
        nodes[host] = cpus
    sinfo = on_head("sinfo", "--noheader", "--Node", "--format=%N %t %c")
    assert sinfo.returncode == 0, sinfo.stderr
    seen = {n: (state, int(c)) for n, state, c in map(str.split, sinfo.stdout.splitlines())}
    assert {n: c for n, (_, c) in seen.items()} == nodes, sinfo.stdout
    assert {state for state, _ in seen.values()} <= {"idle", "mix", "alloc"}, sinfo.stdout


def test_srun_runs_on_every_node(cluster: pathlib.Path):
    proc = on_head("srun", f"-N{NODES}", "hostname", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == HOSTS


def test_salloc_sets_the_bracketed_node_list(cluster: pathlib.Path):
    proc = on_head("salloc", "-N2", "bash", "-c", "echo $SLURM_JOB_NODELIST", timeout=120)
    assert proc.returncode == 0, proc.stderr
    nodelist = proc.stdout.strip().splitlines()[-1]
    assert nodelist == f"{NAME}-n[1-2]"
    assert hostlist.expand_hostlist(nodelist) == HOSTS[:2]


def test_inventory_slurm_inside_a_real_allocation(cluster: pathlib.Path, tmp_path: pathlib.Path):
    """`dscluster inventory slurm` fed the environment of a real allocation (salloc -N3
    --exclusive: every CPU of each node), and
    its expansion checked against scontrol's in the same allocation."""
    proc = on_head(
        "salloc", f"-N{NODES}", "--exclusive", "bash", "-c",
        'env | grep ^SLURM_; echo "HOSTNAMES=$(scontrol show hostnames | paste -sd,)"',
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert env["SLURM_JOB_NODELIST"] == f"{NAME}-n[1-{NODES}]"
    out = tmp_path / "slurm-inv"
    gen = subprocess.run(
        [sys.executable, "-m", "dscluster", "inventory", "slurm", "--name", "e2e-slurm",
         "--out", str(out)],
        env={**os.environ, **{k: v for k, v in env.items() if k.startswith("SLURM_")}},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    data = yaml.safe_load((out / "hosts.yml").read_text())["all"]
    hosts = [*data["children"]["head"]["hosts"], *data["children"]["workers"]["hosts"]]
    assert hosts == env["HOSTNAMES"].split(",") == HOSTS
    assert data["vars"]["dscluster_slurm_job_id"] in (env["SLURM_JOB_ID"], int(env["SLURM_JOB_ID"]))
    # Slots: the CPUs Slurm gave the job on each node (SLURM_JOB_CPUS_PER_NODE, e.g. 2(x3)).
    cpus = {h: json.loads((cluster / "facts" / f"{h}.json").read_text())["accelerators"]["cpus"]
            for h in HOSTS}  # fmt: skip
    assert (out / "hostfile").read_text().splitlines() == [f"{h} slots={cpus[h]}" for h in HOSTS]


@pytest.mark.parametrize(("mode", "nodes"), [("deepspeed", 2), ("torchrun", 2), ("srun", 3)])
def test_generated_sbatch_script_runs_the_deepspeed_job(
    cluster: pathlib.Path, tmp_path: pathlib.Path, mode: str, nodes: int
):
    """Each launch mode's script from `dscluster sbatch`, submitted with `sbatch --wait`: the
    smoke job's DeepSpeed ZeRO-2 engine runs on every allocated node, every rank reports and
    the loss falls. torchrun uses c10d rendezvous on the allocation's first node; srun starts
    one task per slot with MPI-style ranks from Slurm's ids."""
    ivars = inventory_vars(cluster)
    job_dir = f"{ivars.get('dscluster_shared_dir', '/shared')}/sbatch-{mode}-{uuid.uuid4().hex[:6]}"
    script = tmp_path / f"{mode}.sbatch"
    gen = dsc(
        "sbatch", "--launcher", mode, "--nodes", str(nodes), "--slots", "1",
        "--job-name", f"e2e-{mode}", "--time", "10:00", "--chdir", job_dir,
        "--slurm-output", f"{job_dir}/%x-%j.out", "-i", str(cluster), "-o", str(script),
        "--", f"{job_dir}/smoke_job.py", "--zero", "2", "--steps", "10",
        "--report", f"{job_dir}/report.json", "--dist-timeout", "60",
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    try:
        docker("exec", HEAD, "install", "-d", "-o", "ds", "-m", "0755", job_dir)
        docker("cp", str(script), f"{HEAD}:{job_dir}/job.sbatch")
        staged = [f"{job_dir}/{name}" for name in SMOKE_JOB_FILES]  # the job and its modules
        for name, there in zip(SMOKE_JOB_FILES, staged, strict=True):
            docker("cp", str(JOBS / name), f"{HEAD}:{there}")
        docker("exec", HEAD, "chown", "ds", f"{job_dir}/job.sbatch", *staged)
        state = submit_and_wait(f"{job_dir}/job.sbatch", timeout=400)
        output = on_head("bash", "-c", f"cat {job_dir}/*.out").stdout
        assert state == ("COMPLETED", "0:0"), f"{state}\n{output[-3000:]}"
        report = json.loads(on_head("cat", f"{job_dir}/report.json").stdout)
    finally:
        docker("exec", HEAD, "rm", "-rf", job_dir)
    assert report["ok"] is True, report["checks"]
    assert report["world_size"] == nodes
    ranks = report["ranks"]
    assert sorted(r["rank"] for r in ranks) == list(range(nodes))
    assert {r["host"] for r in ranks} == set(HOSTS[:nodes])  # one rank on each allocated node
    assert all(r["last_loss"] < r["first_loss"] for r in ranks), ranks
    assert report["checks"]["checksums_agree"] is True


def test_lightning_under_sbatch_srun(cluster: pathlib.Path, tmp_path: pathlib.Path, user_stack):
    """Seed 003's Lightning form: `srun python train.py --devices S --nodes N` with one Slurm
    task per slot; Lightning takes its ranks from Slurm (SLURMEnvironment) and must count
    every task, on every node, and its loss must fall."""
    ivars = inventory_vars(cluster)
    job_dir = (
        f"{ivars.get('dscluster_shared_dir', '/shared')}/sbatch-lightning-{uuid.uuid4().hex[:6]}"
    )
    script = tmp_path / "lightning.sbatch"
    gen = dsc(
        "sbatch", "--launcher", "srun", "--nodes", str(NODES), "--slots", "1",
        "--job-name", "e2e-lightning", "--time", "10:00", "--chdir", job_dir,
        "--slurm-output", f"{job_dir}/%x-%j.out", "-i", str(cluster), "-o", str(script),
        "--", f"{job_dir}/train.py", "--devices", "1", "--nodes", str(NODES),
        "--accelerator", "cpu",
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    example = rolefiles.REPO / "examples" / "lightning" / "train.py"
    try:
        docker("exec", HEAD, "install", "-d", "-o", "ds", "-m", "0755", job_dir)
        docker("cp", str(script), f"{HEAD}:{job_dir}/job.sbatch")
        docker("cp", str(example), f"{HEAD}:{job_dir}/train.py")
        docker("exec", HEAD, "chown", "ds", f"{job_dir}/job.sbatch", f"{job_dir}/train.py")
        state = submit_and_wait(f"{job_dir}/job.sbatch", timeout=600)
        output = on_head("bash", "-c", f"cat {job_dir}/*.out").stdout
    finally:
        docker("exec", HEAD, "rm", "-rf", job_dir)
    assert state == ("COMPLETED", "0:0"), f"{state}\n{output[-3000:]}"
    ranks = [json.loads(m[1]) for m in re.finditer(r"RESULT (\{.*\})", output)]
    assert sorted(r["rank"] for r in ranks) == list(range(NODES)), output[-3000:]
    assert {r["world_size"] for r in ranks} == {NODES}  # Lightning's own count
    assert {r["cluster_environment"] for r in ranks} == {"SLURMEnvironment"}
    assert {r["host"] for r in ranks} == set(HOSTS)
    assert all(r["last_loss"] < r["first_loss"] for r in ranks), ranks


def test_slurm_play_again_changes_nothing(cluster: pathlib.Path, slurm_switch):
    slurm_switch(True)
    proc = dsc("provision", "-i", str(cluster), "--playbook", "slurm.yml", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert changes(proc) == 0, proc.stdout[-3000:]

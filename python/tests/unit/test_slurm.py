"""`dscluster inventory slurm` and `dscluster sbatch`: node lists, slots, written files, and the
batch scripts run by bash against recording shims of scontrol / srun / torchrun / deepspeed."""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import hostlist
import pytest
import yaml
from rich.console import Console

from dscluster import cli, inventory, sbatch
from dscluster.cli import flags
from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.sources import slurm

DS_HOSTFILE_RE = re.compile(r"^(\S+)\s+slots=(\d+)")  # DeepSpeed's runner._parse_hostfile


# ---- dscluster.cli.main in this process, its output captured ---------------------------------


def run_cli(*argv: str) -> tuple[int, str, str]:
    args = cli.build_parser().parse_args(list(argv))
    flags.check_required(args)
    out_buf, err_buf = io.StringIO(), io.StringIO()
    out = Console(file=out_buf, soft_wrap=True, width=200)
    err = Console(file=err_buf, soft_wrap=True, width=200)
    try:
        rc = int(args.func(args, out, err))
    except DsclusterError as exc:
        err_buf.write(f"dscluster: error: {exc}\n")
        rc = 1
    return rc, out_buf.getvalue(), err_buf.getvalue()


def one_line_error(result: tuple[int, str, str]) -> str:
    rc, _, err = result
    assert rc == 1, result
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dscluster: error: ")
    return lines[0]


@pytest.fixture
def slurm_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No Slurm variables and no scontrol from the machine running the tests."""
    for key in list(os.environ):
        if key.startswith("SLURM_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if shutil.which("scontrol"):
        pytest.skip("a real scontrol is installed; these tests need a machine without Slurm")
    return monkeypatch


# ---- node lists ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("cpu7", ["cpu7"]),
        ("n[001-010]", [f"n{i:03d}" for i in range(1, 11)]),
        (
            "gpu-[001-004,010],cpu7",
            ["gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-010", "cpu7"],
        ),
        ("a[1-3,5]b", ["a1b", "a2b", "a3b", "a5b"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[1-2]", ["n1", "n2"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("n[1],m[2-3]", ["n1", "m2", "m3"]),
        ("n[98-101]", ["n98", "n99", "n100", "n101"]),
    ],
)
def test_expand_nodelist(nodelist, expected):
    assert slurm.expand_nodelist(nodelist) == expected
    assert slurm.expand_nodelist(nodelist) == hostlist.expand_hostlist(nodelist)


def test_expand_large_odd_list_matches_hostlist_and_expectation():
    nodelist = "gpu-[00001-06000],cpu[1-3000,3005-4004],x[7-9]y[08-10]"
    expected = (
        [f"gpu-{i:05d}" for i in range(1, 6001)]
        + [f"cpu{i}" for i in range(1, 3001)]
        + [f"cpu{i}" for i in range(3005, 4005)]
        + [f"x{a}y{b:02d}" for a in (7, 8, 9) for b in (8, 9, 10)]
    )
    nodes = slurm.expand_nodelist(nodelist)
    assert nodes == expected
    assert nodes == hostlist.expand_hostlist(nodelist)
    assert len(nodes) == 10_009
    # and back: python-hostlist's compressed form expands to the same nodes
    assert set(slurm.expand_nodelist(hostlist.collect_hostlist(nodes))) == set(nodes)


@pytest.mark.parametrize(
    ("nodelist", "needle"),
    [
        ("", "node list is empty"),
        ("n[1-", "cannot expand node list"),
        ("n[3-1]", "cannot expand node list"),
        ("n[a-b]", "cannot expand node list"),
        ("n1,n[1-2]", "node n1 appears twice"),
    ],
)
def test_expand_nodelist_errors(nodelist, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)) as info:
        slurm.expand_nodelist(nodelist)
    assert "\n" not in str(info.value)


# ---- per-node counts and slots ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4", [4]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("72(x2)", [72, 72]),
        ("1,2,3", [1, 2, 3]),
        ("36(x2),18,4(x1)", [36, 36, 18, 4]),
    ],
)
def test_parse_cpus_per_node(value, expected):
    assert slurm.parse_cpus_per_node(value) == expected


@pytest.mark.parametrize("value", ["", "2(x)", "x3", "2(3)", "2(x3)1", "-1", "2,,3"])
def test_parse_cpus_per_node_rejects(value):
    with pytest.raises(DsclusterError, match="is not N or N\\(xM\\)"):
        slurm.parse_cpus_per_node(value)


NODES3 = ["n1", "n2", "n3"]


@pytest.mark.parametrize(
    ("env", "slots", "source"),
    [
        ({}, [1, 1, 1], "default"),
        (
            {"SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "2"},
            [4, 4, 4],
            "SLURM_GPUS_ON_NODE",
        ),
        (
            {"SLURM_GPUS_ON_NODE": "0", "SLURM_NTASKS_PER_NODE": "2"},
            [2, 2, 2],
            "SLURM_NTASKS_PER_NODE",
        ),
        ({"SLURM_JOB_GPUS": "0,1,2"}, [3, 3, 3], "SLURM_JOB_GPUS"),
        ({"SLURM_GPUS_PER_NODE": "a100:4"}, [4, 4, 4], "SLURM_GPUS_PER_NODE"),
        ({"SLURM_GPUS_PER_NODE": "2"}, [2, 2, 2], "SLURM_GPUS_PER_NODE"),
        ({"SLURM_GPUS_PER_NODE": "gpu:a100:2(IDX:0-1)"}, [2, 2, 2], "SLURM_GPUS_PER_NODE"),
        ({"SLURM_GPUS_PER_NODE": "a100:2,v100:1"}, [3, 3, 3], "SLURM_GPUS_PER_NODE"),
        ({"SLURM_JOB_CPUS_PER_NODE": "8(x2),4"}, [8, 8, 4], "SLURM_JOB_CPUS_PER_NODE"),
        (
            {"SLURM_NTASKS_PER_NODE": "3", "SLURM_JOB_CPUS_PER_NODE": "8(x3)"},
            [3, 3, 3],
            "SLURM_NTASKS_PER_NODE",
        ),
    ],
)
def test_slots_from_env(env, slots, source):
    assert slurm.slots_from_env(env, NODES3) == slots
    assert slurm.slots_and_source(env, NODES3) == (slots, source)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SLURM_JOB_CPUS_PER_NODE": "8(x2)"}, "describes 2 nodes but the node list has 3"),
        ({"SLURM_JOB_CPUS_PER_NODE": "0(x3)"}, "gives a node 0 CPUs"),
        ({"SLURM_GPUS_PER_NODE": "a100:many"}, "cannot read a GPU count"),
    ],
)
def test_slots_from_env_errors(env, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        slurm.slots_from_env(env, NODES3)


# ---- dscluster inventory slurm ------------------------------------------------------------


def read_hosts(out: pathlib.Path) -> dict:
    text = (out / "hosts.yml").read_text()
    assert text.startswith("---\n# Written by `dscluster inventory slurm`")
    return yaml.safe_load(text)


def test_inventory_slurm_from_allocation(tmp_path, slurm_env, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[001-003],cpu7")
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "8(x3),2")
    out = tmp_path / "inv"
    rc, stdout, err = run_cli("inventory", "slurm", "--out", str(out), "--name", "site-a")
    assert rc == 0, err
    assert "4 nodes, head gpu-001, slots from SLURM_JOB_CPUS_PER_NODE" in stdout
    data = read_hosts(out)["all"]
    assert data["vars"] == {
        "dscluster_cluster_name": "site-a",
        "dscluster_source": "slurm",
        "dscluster_slurm_job_id": "4711",
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes",
    }
    assert data["children"]["head"]["hosts"] == {
        "gpu-001": {"dscluster_expected_slots": 8, "dscluster_cpu_slots": 8}
    }
    assert list(data["children"]["workers"]["hosts"]) == ["gpu-002", "gpu-003", "cpu7"]
    assert data["children"]["workers"]["hosts"]["cpu7"]["dscluster_expected_slots"] == 2
    hostfile = (out / "hostfile").read_text()
    assert hostfile == "gpu-001 slots=8\ngpu-002 slots=8\ngpu-003 slots=8\ncpu7 slots=2\n"
    assert all(DS_HOSTFILE_RE.match(line) for line in hostfile.splitlines())
    # Ansible itself reads it: one head, the rest workers, vars per host
    inv = load(out)
    assert inv.head == "gpu-001"
    assert inv.hosts == ["gpu-001", "gpu-002", "gpu-003", "cpu7"]
    assert inv.var("cpu7", "dscluster_expected_slots") == 2


def test_inventory_slurm_gpus_and_known_hosts(tmp_path, slurm_env, monkeypatch):
    known = tmp_path / "known_hosts"
    known.write_text("n1 ssh-ed25519 AAAA\n")
    monkeypatch.setenv("SLURM_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    out = tmp_path / "inv"
    rc, _, err = run_cli(
        "inventory", "slurm", "--out", str(out), "--known-hosts", str(known), "--user", "ubuntu"
    )
    assert rc == 0, err
    data = read_hosts(out)["all"]
    assert data["vars"]["ansible_ssh_common_args"] == (
        f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
    )
    assert data["vars"]["ansible_user"] == "ubuntu"
    assert "dscluster_slurm_job_id" not in data["vars"]
    # GPU counts are detected on the nodes; no CPU slot count is configured for them
    assert data["children"]["workers"]["hosts"] == {"n2": {"dscluster_expected_slots": 4}}
    assert (out / "hostfile").read_text() == "n1 slots=4\nn2 slots=4\n"


def test_inventory_slurm_nodelist_and_slots_flags(tmp_path, slurm_env, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "other[1-9]")
    out = tmp_path / "inv"
    rc, _, err = run_cli(
        "inventory", "slurm", "--out", str(out), "--nodelist", "x[01-02]", "--slots", "3"
    )
    assert rc == 0, err
    assert (out / "hostfile").read_text() == "x01 slots=3\nx02 slots=3\n"


def test_inventory_slurm_uses_scontrol_when_no_list(tmp_path, slurm_env, monkeypatch):
    shims = make_shims(tmp_path)
    monkeypatch.setenv("PATH", f"{shims}:/usr/bin:/bin")
    monkeypatch.setenv("SHIM_NODES", "c1 c2 c3")  # what the shim's scontrol reports
    out = tmp_path / "inv"
    rc, _, err = run_cli("inventory", "slurm", "--out", str(out))
    assert rc == 0, err
    assert (out / "hostfile").read_text() == "c1 slots=1\nc2 slots=1\nc3 slots=1\n"


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        ([], {}, "run inside an allocation (salloc or sbatch) or pass --nodelist"),
        (["--nodelist", "n[1-"], {}, "cannot expand node list 'n[1-'"),
        (["--nodelist", "n1,n1"], {}, "node n1 appears twice"),
        (["--nodelist", "n[1-2]", "--slots", "0"], {}, "--slots 0 is out of range"),
        (["--nodelist", "bad_[1-2]!"], {}, "cannot go in a DeepSpeed hostfile"),
        (["--name", "Bad Name", "--nodelist", "n1"], {}, "inventory name 'Bad Name'"),
        (
            ["--nodelist", "n[1-3]"],
            {"SLURM_JOB_CPUS_PER_NODE": "2(x2)"},
            "describes 2 nodes but the node list has 3",
        ),
        (["--nodelist", "n1", "--known-hosts", "/nonexistent/kh"], {}, "is not a file"),
    ],
)
def test_inventory_slurm_errors_one_line_nothing_written(tmp_path, slurm_env, argv, env, needle):
    for key, value in env.items():
        slurm_env.setenv(key, value)
    out = tmp_path / "inv"
    line = one_line_error(run_cli("inventory", "slurm", "--out", str(out), *argv))
    assert needle in line
    assert not out.exists()


# ---- shims: scontrol, srun, pdsh and a venv with recording torchrun / deepspeed -----------

SCONTROL = """\
import os, sys
import hostlist
args = sys.argv[1:]
if args[:2] != ["show", "hostnames"]:
    sys.exit("scontrol shim: only 'show hostnames'")
if "SHIM_NODES" in os.environ and len(args) == 2:
    print("\\n".join(os.environ["SHIM_NODES"].split()))
    sys.exit(0)
nodelist = args[2] if len(args) > 2 else os.environ.get("SLURM_JOB_NODELIST")
if not nodelist:
    sys.exit("scontrol: error: host list is empty")
print("\\n".join(hostlist.expand_hostlist(nodelist)))
"""

# Records its options, checks they are consistent the way Slurm does, then runs the command
# once per task locally with the ids Slurm would give it.
SRUN = """\
import json, os, subprocess, sys
import hostlist
argv = sys.argv[1:]
opts = {}
while argv and argv[0].startswith("--"):
    key, _, value = argv.pop(0)[2:].partition("=")
    opts[key] = value
with open(os.environ["SHIM_LOG"] + "/srun.jsonl", "a") as fh:
    fh.write(json.dumps({"opts": opts, "command": argv}) + "\\n")
nodes = hostlist.expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
n, ntasks, per = int(opts["nodes"]), int(opts["ntasks"]), int(opts["ntasks-per-node"])
assert n == len(nodes) and ntasks == n * per, (opts, nodes)
assert "overcommit" in opts or int(opts["cpus-per-task"]) * per <= int(os.environ["SHIM_CPUS"])
rc = 0
for node_id, node in enumerate(nodes):
    for local in range(per):
        env = dict(os.environ, SLURM_PROCID=str(node_id * per + local), SLURM_NTASKS=str(ntasks),
                   SLURM_LOCALID=str(local), SLURM_NODEID=str(node_id), SLURMD_NODENAME=node)
        rc = max(rc, subprocess.run(argv, env=env).returncode)
sys.exit(rc)
"""

# torchrun: records its arguments, then starts --nproc-per-node ranks as torchrun would.
TORCHRUN = """\
import json, os, subprocess, sys
argv = sys.argv[1:]
opts = {}
while argv and argv[0].startswith("--"):
    key, _, value = argv.pop(0)[2:].partition("=")
    opts[key] = value
with open(os.environ["SHIM_LOG"] + "/torchrun.jsonl", "a") as fh:
    fh.write(json.dumps({"opts": opts, "node": os.environ["SLURMD_NODENAME"]}) + "\\n")
nproc, node = int(opts["nproc-per-node"]), int(os.environ["SLURM_NODEID"])
for local in range(nproc):
    env = dict(os.environ, RANK=str(node * nproc + local), LOCAL_RANK=str(local),
               WORLD_SIZE=str(int(opts["nnodes"]) * nproc))
    subprocess.run([sys.executable, "-u", *argv], env=env, check=True)
"""

# deepspeed: reads the hostfile and DS_ENV_FILE exactly as DeepSpeed's runner does, records.
DEEPSPEED = """\
import json, os, re, sys
argv = sys.argv[1:]
hostfile = argv[argv.index("--hostfile") + 1]
pool = {}
for line in open(hostfile):
    m = re.search(r"^(\\S+)\\s+slots=(\\d+)", line)
    assert m and m.group(1) not in pool, line
    pool[m.group(1)] = int(m.group(2))
name = os.getenv("DS_ENV_FILE", ".deepspeed_env")
exports = {}
for var in open(name).readlines():
    key, val = var.split("=", maxsplit=1)
    exports[key.strip()] = val.strip()
record = {"argv": argv, "cwd": os.getcwd(), "pool": pool, "exports": exports,
          "hostfile": hostfile, "PDSH_RCMD_TYPE": os.environ.get("PDSH_RCMD_TYPE"),
          "PATH": os.environ["PATH"], "MASTER_ADDR": os.environ.get("MASTER_ADDR")}
with open(os.environ["SHIM_LOG"] + "/deepspeed.json", "w") as fh:
    json.dump(record, fh)
"""

JOB = """\
import json, os, sys
out = sys.argv[sys.argv.index("--out") + 1]
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "FROM_INVENTORY", "PYTHONUNBUFFERED")
record = {k: os.environ.get(k) for k in keys}
record["argv"] = sys.argv[1:]
record["path0"] = os.environ["PATH"].split(":")[0]
os.makedirs(out, exist_ok=True)
if os.environ.get("FAIL_RANK") == record["RANK"]:
    sys.exit(3)
with open(os.path.join(out, f"rank{record['RANK']}.json"), "w") as fh:
    json.dump(record, fh)
"""


def _script(path: pathlib.Path, body: str) -> None:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


def make_shims(tmp_path: pathlib.Path) -> pathlib.Path:
    shims = tmp_path / "shims"
    shims.mkdir(exist_ok=True)
    _script(shims / "scontrol", SCONTROL)
    _script(shims / "srun", SRUN)
    (shims / "pdsh").write_text("#!/bin/sh\nexit 0\n")
    (shims / "pdsh").chmod(0o755)
    return shims


def make_venv(tmp_path: pathlib.Path) -> pathlib.Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    _script(venv / "bin" / "torchrun", TORCHRUN)
    _script(venv / "bin" / "deepspeed", DEEPSPEED)
    return venv


USER_ARGS = ["job.py", "--out", "ranks dir", "--note", 'it\'s "quoted" $HOME `x`']


def submit(
    tmp_path: pathlib.Path, script: pathlib.Path, *, nodelist="n[1-2]", cpus="4(x2)", extra=None
) -> subprocess.CompletedProcess[str]:
    """Run the batch script as sbatch would on the first node: Slurm's variables, submit dir."""
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir(exist_ok=True)
    (submit_dir / "job.py").write_text(JOB)
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    env = {
        "PATH": f"{tmp_path / 'shims'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(len(hostlist.expand_hostlist(nodelist))),
        "SLURM_JOB_CPUS_PER_NODE": cpus,
        "SLURM_SUBMIT_DIR": str(submit_dir),
        "SHIM_LOG": str(log),
        "SHIM_CPUS": str(min(slurm.parse_cpus_per_node(cpus))),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        **(extra or {}),
    }
    return subprocess.run(
        ["bash", str(script)],
        cwd=submit_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ranks(tmp_path: pathlib.Path) -> list[dict]:
    files = sorted((tmp_path / "submit" / "ranks dir").glob("rank*.json"))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: int(r["RANK"]))


def write_script(tmp_path: pathlib.Path, mode: str, *extra: str) -> pathlib.Path:
    venv = make_venv(tmp_path) if not (tmp_path / "venv").exists() else tmp_path / "venv"
    make_shims(tmp_path)
    script = tmp_path / f"{mode}.sbatch"
    rc, out, err = run_cli(
        "sbatch",
        "--launcher",
        mode,
        "--venv",
        str(venv),
        "-o",
        str(script),
        *extra,
        "--",
        *USER_ARGS,
    )
    assert rc == 0, err
    assert out.strip() == str(script)
    assert script.stat().st_mode & 0o777 == 0o755
    syntax = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    return script


def sbatch_lines(script: pathlib.Path) -> list[str]:
    return [ln for ln in script.read_text().splitlines() if ln.startswith("#SBATCH")]


# ---- dscluster sbatch ---------------------------------------------------------------------


def test_sbatch_header_as_given(tmp_path):
    script = write_script(
        tmp_path,
        "torchrun",
        "--nodes", "2", "--slots", "2", "--partition", "debug", "--time", "0:10:00",
        "--job-name", "smoke", "--slurm-output", "slurm-%j.out", "--chdir", "/shared/jobs",
    )  # fmt: skip
    assert sbatch_lines(script) == [
        "#SBATCH --job-name=smoke",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --partition=debug",
        "#SBATCH --time=0:10:00",
        "#SBATCH --output=slurm-%j.out",
        "#SBATCH --chdir=/shared/jobs",
    ]
    assert script.read_text().startswith("#!/bin/bash\n#SBATCH")
    assert "gpus-per-node" not in script.read_text()


def test_sbatch_minimal_header(tmp_path):
    script = write_script(tmp_path, "srun")
    assert sbatch_lines(script) == []
    assert "set -euo pipefail" in script.read_text()


def test_sbatch_srun_mode_one_task_per_slot(tmp_path):
    script = write_script(tmp_path, "srun", "--slots", "2", "--master-port", "29611")
    proc = submit(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert call["opts"] == {
        "nodes": "2",
        "ntasks": "4",
        "ntasks-per-node": "2",
        "cpus-per-task": "2",
        "kill-on-bad-exit": "1",
    }
    got = ranks(tmp_path)
    assert [r["RANK"] for r in got] == ["0", "1", "2", "3"]
    assert {r["WORLD_SIZE"] for r in got} == {"4"}
    assert [r["LOCAL_RANK"] for r in got] == ["0", "1", "0", "1"]
    assert {(r["MASTER_ADDR"], r["MASTER_PORT"], r["LOCAL_WORLD_SIZE"]) for r in got} == {
        ("n1", "29611", "2")
    }
    assert {tuple(r["argv"]) for r in got} == {tuple(USER_ARGS[1:])}  # quoting kept
    assert got[0]["path0"] == str(tmp_path / "venv" / "bin")
    assert "n1 n2" in proc.stdout


def test_sbatch_srun_mode_gpus_on_node_win(tmp_path):
    script = write_script(tmp_path, "srun", "--slots", "1")
    proc = submit(tmp_path, script, nodelist="g[01-03]", cpus="8(x3)",
                  extra={"SLURM_GPUS_ON_NODE": "2"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = ranks(tmp_path)
    assert len(got) == 6 and {r["WORLD_SIZE"] for r in got} == {"6"}
    assert {r["MASTER_ADDR"] for r in got} == {"g01"}
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert "overcommit" not in call["opts"] and call["opts"]["cpus-per-task"] == "4"


def test_sbatch_srun_mode_more_gpus_than_cpus_overcommits(tmp_path):
    script = write_script(tmp_path, "srun")
    proc = submit(tmp_path, script, cpus="2(x2)", extra={"SLURM_GPUS_ON_NODE": "4"})
    assert proc.returncode == 0, proc.stderr
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert call["opts"]["overcommit"] == "" and call["opts"]["cpus-per-task"] == "1"
    assert len(ranks(tmp_path)) == 8


def test_sbatch_torchrun_mode(tmp_path):
    script = write_script(tmp_path, "torchrun", "--slots", "2", "--master-port", "29400")
    proc = submit(tmp_path, script, nodelist="n[1-2]", cpus="2(x2)")
    assert proc.returncode == 0, proc.stderr
    [call] = [json.loads(ln) for ln in (tmp_path / "log" / "srun.jsonl").read_text().splitlines()]
    assert call["opts"] == {
        "nodes": "2",
        "ntasks": "2",
        "ntasks-per-node": "1",
        "cpus-per-task": "2",
        "kill-on-bad-exit": "1",
    }
    assert call["command"][0] == str(tmp_path / "venv" / "bin" / "torchrun")
    agents = [
        json.loads(ln) for ln in (tmp_path / "log" / "torchrun.jsonl").read_text().splitlines()
    ]
    assert [a["node"] for a in agents] == ["n1", "n2"]
    assert {json.dumps(a["opts"], sort_keys=True) for a in agents} == {
        json.dumps(
            {
                "nnodes": "2",
                "nproc-per-node": "2",
                "rdzv-backend": "c10d",
                "rdzv-endpoint": "n1:29400",
                "rdzv-id": "42",
            },
            sort_keys=True,
        )
    }
    got = ranks(tmp_path)
    assert [r["RANK"] for r in got] == ["0", "1", "2", "3"]
    assert {tuple(r["argv"]) for r in got} == {tuple(USER_ARGS[1:])}


def test_sbatch_deepspeed_mode(tmp_path):
    script = write_script(tmp_path, "deepspeed", "--slots", "3", "--master-port", "29555")
    proc = submit(tmp_path, script, nodelist="w[1-3]", cpus="3(x3)")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "log" / "deepspeed.json").read_text())
    submit_dir = tmp_path / "submit"
    assert rec["argv"] == [
        "--hostfile", f"{submit_dir}/hostfile.42", "--launcher", "pdsh",
        "--master_addr", "w1", "--master_port", "29555", *USER_ARGS,
    ]  # fmt: skip
    assert rec["pool"] == {"w1": 3, "w2": 3, "w3": 3}
    assert rec["cwd"] == str(submit_dir)
    assert rec["PDSH_RCMD_TYPE"] == "ssh"
    assert rec["exports"]["PATH"].startswith(f"{tmp_path / 'venv'}/bin:")
    assert rec["exports"]["PYTHONUNBUFFERED"] == "1"
    assert rec["PATH"].split(":")[0] == f"{tmp_path / 'venv'}/bin"
    assert (submit_dir / "deepspeed_env.42").is_file()


def test_sbatch_deepspeed_mode_gpus_and_chdir(tmp_path):
    jobs = tmp_path / "jobs"
    script = write_script(tmp_path, "deepspeed", "--chdir", str(jobs))
    jobs.mkdir()
    proc = submit(tmp_path, script, extra={"SLURM_GPUS_ON_NODE": "8"})
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "log" / "deepspeed.json").read_text())
    assert rec["pool"] == {"n1": 8, "n2": 8}
    assert rec["hostfile"] == f"{jobs}/hostfile.42"


def test_sbatch_script_refuses_outside_a_job(tmp_path):
    script = write_script(tmp_path, "srun")
    proc = subprocess.run(
        ["bash", str(script)],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "submit this script with sbatch" in proc.stderr


def test_sbatch_fails_without_scontrol(tmp_path):
    script = write_script(tmp_path, "srun")
    proc = submit(tmp_path, script, extra={"PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0  # the prelude fails instead of guessing the nodes
    assert not (tmp_path / "log" / "srun.jsonl").exists()


@pytest.mark.parametrize("mode", ["srun", "torchrun"])
def test_sbatch_rank_failure_fails_the_job(tmp_path, mode):
    script = write_script(tmp_path, mode, "--slots", "2")
    proc = submit(tmp_path, script, extra={"FAIL_RANK": "2"})
    assert proc.returncode != 0


def write_inventory(tmp_path: pathlib.Path, venv: pathlib.Path) -> pathlib.Path:
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        textwrap.dedent(
            f"""\
            all:
              vars:
                dscluster_venv: {venv}
                dscluster_master_port: 29777
              children:
                head:
                  hosts:
                    n1: {{}}
                workers:
                  hosts:
                    n2: {{}}
            """
        )
    )
    (inv / ".deepspeed_env").write_text(
        f"PATH={venv}/bin:/usr/bin:/bin\nFROM_INVENTORY=a b,c@d\nOMP_NUM_THREADS=2\n"
    )
    return inv


def test_sbatch_takes_defaults_and_env_from_inventory(tmp_path):
    venv = make_venv(tmp_path)
    make_shims(tmp_path)
    inv = write_inventory(tmp_path, venv)
    script = tmp_path / "inv.sbatch"
    rc, _, err = run_cli(
        "sbatch", "--launcher", "srun", "-i", str(inv), "-o", str(script), "--", *USER_ARGS
    )
    assert rc == 0, err
    proc = submit(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    got = ranks(tmp_path)
    assert {(r["MASTER_PORT"], r["FROM_INVENTORY"]) for r in got} == {("29777", "a b,c@d")}
    assert got[0]["path0"] == str(venv / "bin")

    script = tmp_path / "inv-ds.sbatch"
    rc, _, err = run_cli(
        "sbatch", "--mode", "deepspeed", "-i", str(inv), "--out", str(script), "--", *USER_ARGS
    )
    assert rc == 0, err
    proc = submit(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads((tmp_path / "log" / "deepspeed.json").read_text())
    assert rec["exports"] == {
        "PATH": f"{venv}/bin:/usr/bin:/bin",
        "PYTHONUNBUFFERED": "1",
        "FROM_INVENTORY": "a b,c@d",
        "OMP_NUM_THREADS": "2",
    }
    assert "--master_port" in rec["argv"] and "29777" in rec["argv"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--launcher", "srun", "--nodes", "0"], "--nodes 0 is out of range"),
        (["--launcher", "srun", "--slots", "0"], "--slots 0 is out of range"),
        (["--launcher", "srun", "--master-port", "70000"], "--master-port 70000 is out of range"),
        (["--launcher", "srun", "--time", "ten minutes"], "is not a Slurm time"),
        (["--launcher", "srun", "--job-name", "a b"], "has blanks, quotes or shell characters"),
        (["--launcher", "srun", "--partition", "p;rm"], "has blanks, quotes or shell characters"),
        (["--launcher", "srun", "--venv", "venv"], "is not an absolute path"),
        (["--launcher", "srun", "--slurm-output", "a b"], "has blanks, quotes or shell"),
        # the old spellings (hidden aliases) still parse; errors name today's flag
        (["--mode", "srun", "--nodes", "0"], "--nodes 0 is out of range"),
        (["--mode", "srun", "--slots-per-node", "0"], "--slots 0 is out of range"),
        (["--mode", "srun", "--cpu-slots", "0"], "--slots 0 is out of range"),
        (["--mode", "srun", "--port", "70000"], "--master-port 70000 is out of range"),
        (["--mode", "srun", "--output", "a b"], "--slurm-output 'a b' has blanks"),
    ],
)
def test_sbatch_errors_one_line_nothing_written(tmp_path, argv, needle):
    script = tmp_path / "x.sbatch"
    line = one_line_error(run_cli("sbatch", *argv, "-o", str(script), "--", "job.py"))
    assert needle in line
    assert not script.exists()


@pytest.mark.parametrize("flag", ["--launcher", "--mode"])
def test_sbatch_launcher_is_one_of_its_choices(tmp_path, capsys, flag):
    """An unknown launcher is a usage error (exit 2) naming the choices, nothing written;
    render_sbatch refuses one too, in one line."""
    script = tmp_path / "x.sbatch"
    with pytest.raises(SystemExit) as exit_:
        run_cli("sbatch", flag, "mpirun", "-o", str(script), "--", "job.py")
    assert exit_.value.code == 2
    assert "invalid choice: 'mpirun'" in capsys.readouterr().err
    assert not script.exists()
    with pytest.raises(SystemExit) as exit_:
        run_cli("sbatch", "-o", str(script), "--", "job.py")
    assert exit_.value.code == 2
    assert "required: --launcher" in capsys.readouterr().err
    with pytest.raises(DsclusterError, match="--launcher 'mpirun' is not a launch mode"):
        sbatch.render_sbatch(sbatch.SbatchOptions(launcher="mpirun", command=["job.py"]))


def test_sbatch_old_spellings_write_the_same_script(tmp_path):
    """--mode, --slots-per-node, --port, --output and --script: the same script as today's
    --launcher, --slots, --master-port, --slurm-output and -o/--out."""
    venv = make_venv(tmp_path)
    new, old = tmp_path / "new.sbatch", tmp_path / "old.sbatch"
    common = ["--venv", str(venv), "--nodes", "2"]
    assert run_cli(
        "sbatch", "--launcher", "torchrun", "--slots", "2", "--master-port", "29400",
        "--slurm-output", "s-%j.out", *common, "--out", str(new), "--", *USER_ARGS,
    )[0] == 0  # fmt: skip
    assert run_cli(
        "sbatch", "--mode", "torchrun", "--slots-per-node", "2", "--port", "29400",
        "--output", "s-%j.out", *common, "--script", str(old), "--", *USER_ARGS,
    )[0] == 0  # fmt: skip
    assert old.read_text() == new.read_text()
    assert "#SBATCH --output=s-%j.out" in new.read_text() and "PORT=29400" in new.read_text()


def test_sbatch_bad_inventory_env_is_one_line(tmp_path):
    venv = make_venv(tmp_path)
    inv = write_inventory(tmp_path, venv)
    (inv / ".deepspeed_env").write_text("PATH=/x\n# comment\n")
    script = tmp_path / "x.sbatch"
    line = one_line_error(
        run_cli("sbatch", "--launcher", "srun", "-i", str(inv), "-o", str(script), "--", "job.py")
    )
    assert "line 2 is not KEY=VALUE" in line
    assert not script.exists()


def test_render_sbatch_is_pure_and_quotes():
    opts = sbatch.SbatchOptions(launcher="torchrun", command=["t.py", "a b", "$(rm -rf /)"])
    text = sbatch.render_sbatch(opts)
    assert "t.py 'a b' '$(rm -rf /)'" in text
    assert f"VENV={sbatch.DEFAULT_VENV}" in text and f"PORT={inventory.DEFAULT_MASTER_PORT}" in text

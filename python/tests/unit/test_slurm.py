"""`dscluster inventory slurm`: node lists, slots and the files written."""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import hostlist
import pytest
import yaml

from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.sources import slurm

from .clirun import DS_HOSTFILE_RE, one_line_error, run_cli, run_main
from .slurm_shims import make_shims


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
    # Refused by the argument checks (exit 2) or while reading the hosts (exit 1).
    line = one_line_error(run_main("inventory", "slurm", "--out", str(out), *argv), rc=(1, 2))
    assert needle in line
    assert not out.exists()

"""`dscluster inventory static`: a plain host list -> hosts.yml + hostfile."""

from __future__ import annotations

import re

import pytest
import yaml

from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.sources import static

from .clirun import DS_HOSTFILE_RE, one_line_error, run_cli, run_main


@pytest.mark.parametrize(
    ("text", "slots", "expected"),
    [
        ("a,b,c", 1, [("a", 1), ("b", 1), ("c", 1)]),
        ("a:4,b:2", 1, [("a", 4), ("b", 2)]),
        ("node[1-3]", 2, [("node1", 2), ("node2", 2), ("node3", 2)]),
        ("gpu-[01-02,10]:8,cpu7", 1, [("gpu-01", 8), ("gpu-02", 8), ("gpu-10", 8), ("cpu7", 1)]),
        (" a , b.example.org:3 ", 1, [("a", 1), ("b.example.org", 3)]),
    ],
)
def test_parse_hosts(text, slots, expected):
    assert static.parse_hosts(text, slots) == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a,b,a", "host a appears twice"),
        ("n[1-3],n2", "host n2 appears twice"),
        ("a,,b", "has an empty entry"),
        ("", "has an empty entry"),
        ("n[1-3", "unclosed '['"),
        ("n1-3]", "unmatched ']'"),
        ("n[3-1]", "cannot expand host list"),
        ("bad host", "cannot go in a DeepSpeed hostfile"),
        ("a:0", "has slots=0"),
        ("-a", "cannot go in a DeepSpeed hostfile"),
    ],
)
def test_parse_hosts_errors(text, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)) as info:
        static.parse_hosts(text)
    assert "\n" not in str(info.value)


def test_order_head():
    entries = [("a", 1), ("b", 2), ("c", 3)]
    assert static.order_head(entries, None) == entries
    assert static.order_head(entries, "b") == [("b", 2), ("a", 1), ("c", 3)]
    with pytest.raises(DsclusterError, match="--head x is not in the host list"):
        static.order_head(entries, "x")


def test_inventory_static_writes_hosts_and_hostfile(tmp_path):
    out = tmp_path / "inv"
    key = tmp_path / "id_ed25519"
    key.write_text("a key\n")  # --key-file must exist
    rc, stdout, err = run_cli(
        "inventory", "static", "--hosts", "gpu-01:4,gpu-02:2,cpu[1-2]", "--head", "gpu-02",
        "--user", "ubuntu", "--key-file", str(key), "--name", "lab", "--out", str(out),
    )  # fmt: skip
    assert rc == 0, err
    assert "4 hosts, head gpu-02" in stdout and "8 slots" in stdout
    text = (out / "hosts.yml").read_text()
    assert text.startswith("---\n# Written by `dscluster inventory static")
    data = yaml.safe_load(text)["all"]
    assert data["vars"] == {
        "dscluster_cluster_name": "lab",
        "dscluster_source": "static",
        "ansible_user": "ubuntu",
        "ansible_ssh_private_key_file": str(key),
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=yes",
    }
    assert data["children"]["head"]["hosts"] == {
        "gpu-02": {
            "ansible_host": "gpu-02",
            "dscluster_expected_slots": 2,
            "dscluster_cpu_slots": 2,
        }
    }
    assert list(data["children"]["workers"]["hosts"]) == ["gpu-01", "cpu1", "cpu2"]
    hostfile = (out / "hostfile").read_text()
    assert hostfile == "gpu-02 slots=2\ngpu-01 slots=4\ncpu1 slots=1\ncpu2 slots=1\n"
    assert all(DS_HOSTFILE_RE.match(line) for line in hostfile.splitlines())
    inv = load(out)
    assert inv.head == "gpu-02"
    assert inv.hosts == ["gpu-02", "gpu-01", "cpu1", "cpu2"]


def test_inventory_static_rewrites_atomically(tmp_path):
    out = tmp_path / "inv"
    assert run_cli("inventory", "static", "--hosts", "a,b", "--out", str(out))[0] == 0
    assert run_cli("inventory", "static", "--hosts", "c", "--out", str(out))[0] == 0
    assert (out / "hostfile").read_text() == "c slots=1\n"
    assert sorted(p.name for p in out.iterdir()) == ["hostfile", "hosts.yml"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--hosts", "a,b,a"], "host a appears twice"),
        (["--hosts", "a,b", "--head", "c"], "--head c is not in the host list (a, b)"),
        (["--hosts", "a_b!"], "cannot go in a DeepSpeed hostfile"),
        (["--hosts", "a", "--slots", "0"], "--slots 0 is out of range"),
        (["--hosts", "a", "--name", "Lab"], "inventory name 'Lab'"),
        (["--hosts", "a", "--known-hosts", "/nonexistent"], "is not a file"),
    ],
)
def test_inventory_static_errors_one_line_nothing_written(tmp_path, argv, needle):
    out = tmp_path / "inv"
    # Refused by the argument checks (exit 2) or while reading the hosts (exit 1).
    line = one_line_error(run_main("inventory", "static", "--out", str(out), *argv), rc=(1, 2))
    assert needle in line
    assert not out.exists()

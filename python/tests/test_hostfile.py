from __future__ import annotations

import pathlib
import re

import pytest

from dscluster import hostfile, inventory
from dscluster.errors import DsclusterError

from .conftest import write_facts

# DeepSpeed's own hostfile pattern (deepspeed/launcher/runner.py::_parse_hostfile); the e2e
# test also runs DeepSpeed's fetch_hostfile on the cluster against the written file.
DS_HOSTFILE_RE = re.compile(r"^(\S+)\s+slots=(\d+)")


def test_render_hostfile_head_first_and_parseable():
    text = hostfile.render_hostfile([("head-1", 4), ("w-1", 2)])
    assert text == "head-1 slots=4\nw-1 slots=2\n"
    parsed = [DS_HOSTFILE_RE.match(line).groups() for line in text.splitlines()]
    assert parsed == [("head-1", "4"), ("w-1", "2")]


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ([], "no hosts"),
        ([("a", 1), ("a", 2)], "appears twice"),
        ([("a", 0)], "slots=0"),
        ([("a", -1)], "slots=-1"),
        ([("a b", 1)], "cannot go in a DeepSpeed hostfile"),
        ([("n[1-2]", 1)], "cannot go in a DeepSpeed hostfile"),
        ([("a,b", 1)], "cannot go in a DeepSpeed hostfile"),
    ],
)
def test_render_hostfile_rejects(entries, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        hostfile.render_hostfile(entries)


def test_render_env_plain_lines():
    text = hostfile.render_env({"PATH": "/opt/v/bin:/usr/bin", "NCCL_SOCKET_IFNAME": "eth0"})
    assert text == "PATH=/opt/v/bin:/usr/bin\nNCCL_SOCKET_IFNAME=eth0\n"
    for line in text.splitlines():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=[^\s\"'`$\\]+", line)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("PATH", "$HOME/bin", "'$'"),
        ("X", "a`b`", "'`'"),
        ("X", 'say "hi"', "'\"'"),
        ("X", "a\\b", "'\\\\'"),
        ("X", "", "empty"),
        ("X", " padded", "surrounding blanks"),
        ("1X", "v", "not a shell variable name"),
        ("X-Y", "v", "not a shell variable name"),
        ("X", "two\nlines", "'\\n'"),
    ],
)
def test_render_env_rejects_values_deepspeed_would_mangle(key, value, needle):
    with pytest.raises(DsclusterError, match=re.escape(needle)):
        hostfile.render_env({key: value})


def test_derive_env_cpu_pins_interfaces_and_threads(inventory_dir):
    facts = [
        hostfile.NodeFacts("a", "cpu", 0, 2, "eth0", "10.0.0.1", "/opt/v", "/opt/ext", 8, {}),
        hostfile.NodeFacts("b", "cpu", 0, 4, "eth0", "10.0.0.2", "/opt/v", "/opt/ext", 8, {}),
    ]
    env = hostfile.derive_env(facts)
    assert env["PATH"].startswith("/opt/v/bin:")
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["OMP_NUM_THREADS"] == "2"  # 8 cpus / 4 slots on the busiest node
    assert env["TORCH_EXTENSIONS_DIR"] == "/opt/ext"  # as recorded, not derived


def test_derive_env_no_interface_pin_when_names_differ():
    facts = [
        hostfile.NodeFacts("a", "cuda", 4, 1, "eth0", "", "/opt/v", "/opt/ext", 8, {}),
        hostfile.NodeFacts("b", "cuda", 4, 1, "ens5", "", "/opt/v", "/opt/ext", 8, {}),
    ]
    env = hostfile.derive_env(facts)
    assert "NCCL_SOCKET_IFNAME" not in env
    assert "OMP_NUM_THREADS" not in env


def test_derive_env_refuses_different_venvs():
    facts = [
        hostfile.NodeFacts("a", "cpu", 0, 1, "eth0", "", "/opt/v", "/opt/ext", 2, {}),
        hostfile.NodeFacts("b", "cpu", 0, 1, "eth0", "", "/opt/w", "/opt/ext", 2, {}),
    ]
    with pytest.raises(DsclusterError, match=r"different venv paths.*ml_stack_venv"):
        hostfile.derive_env(facts)


def test_write_launch_files_heterogeneous_slots(inventory_dir: pathlib.Path):
    inv = inventory.load(inventory_dir)
    files = hostfile.write_launch_files(inv)
    assert files.hostfile.read_text() == "node-a slots=4\nnode-b slots=2\nnode-c slots=2\n"
    assert files.world_size == 8
    env = dict(line.split("=", 1) for line in files.env_file.read_text().splitlines())
    assert env["PATH"].startswith("/opt/dscluster/venv/bin:")
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_missing_facts_names_host_and_writes_nothing(inventory_dir: pathlib.Path):
    (inventory_dir / "facts" / "node-b.json").unlink()
    (inventory_dir / "hostfile").write_text("old slots=1\n")
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="no recorded facts for node-b"):
        hostfile.write_launch_files(inv)
    assert (inventory_dir / "hostfile").read_text() == "old slots=1\n"
    assert not (inventory_dir / ".deepspeed_env").exists()


def test_bad_env_value_writes_neither_file(inventory_dir: pathlib.Path):
    hosts = inventory_dir / "hosts.yml"
    hosts.write_text(
        hosts.read_text().replace(
            "dscluster_cpu_slots: 1",
            "dscluster_cpu_slots: 1\n    dscluster_extra_env: {MY_VAR: '$HOME'}",
        )
    )
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="MY_VAR"):
        hostfile.write_launch_files(inv)
    assert not (inventory_dir / "hostfile").exists()
    assert not (inventory_dir / ".deepspeed_env").exists()


def test_zero_slot_accelerator_node_refused(inventory_dir: pathlib.Path):
    write_facts(inventory_dir / "facts", "node-c", cpu_slots=0)
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="node-c has slots=0"):
        hostfile.write_launch_files(inv)
    assert not (inventory_dir / "hostfile").exists()


def test_incomplete_facts_are_an_error(inventory_dir: pathlib.Path):
    (inventory_dir / "facts" / "node-a.json").write_text('{"host": "node-a"}')
    inv = inventory.load(inventory_dir)
    with pytest.raises(DsclusterError, match="recorded facts of node-a are incomplete"):
        hostfile.write_launch_files(inv)

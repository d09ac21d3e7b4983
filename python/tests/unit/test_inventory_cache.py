"""The remembered `ansible-inventory --list` (dscluster.inventory_cache): a command that
succeeded leaves its reading of a static inventory; the next process reads it instead of
starting Ansible, and any change to what Ansible would read (a variables file, an ANSIBLE_*
variable, ansible.cfg) is a miss. Scripts, plugins and vault data are never kept; a refused
command writes nothing. Real ansible-inventory throughout."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

from dscluster import cli, inventory, inventory_cache
from dscluster.errors import DsclusterError
from dscluster.util import tool


@pytest.fixture
def cache(tmp_path: pathlib.Path, monkeypatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("DSCLUSTER_CACHE", str(root))
    monkeypatch.setattr(inventory_cache, "_seen", {})
    monkeypatch.setattr(inventory_cache, "_pending", {})
    return root / "inventory"


@pytest.fixture
def calls(monkeypatch) -> list[list[str]]:
    """Every ansible-inventory run of inventory.load, the real one behind it."""
    seen: list[list[str]] = []
    real = inventory.run

    def counting(argv, **kwargs):
        seen.append(list(argv))
        return real(argv, **kwargs)

    monkeypatch.setattr(inventory, "run", counting)
    return seen


def new_process() -> None:
    """What a new dscluster process starts with: nothing read yet in memory."""
    inventory_cache._seen.clear()
    inventory_cache._pending.clear()


def test_a_succeeded_command_leaves_the_reading_and_the_next_process_uses_it(
    inventory_dir, cache, calls
):
    assert cli.main(["hostfile", "-i", str(inventory_dir)]) == 0
    assert len(calls) == 1
    (entry,) = cache.glob("*.json")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    first = inventory.load(inventory_dir)  # the same process: its memory, no second run
    new_process()
    second = inventory.load(inventory_dir)
    assert len(calls) == 1
    assert (second.groups, second.hostvars, second.hosts) == (
        first.groups, first.hostvars, ["node-a", "node-b", "node-c"]
    )  # fmt: skip


def test_every_input_ansible_reads_is_in_the_key(inventory_dir, cache, calls, monkeypatch):
    inventory.load(inventory_dir)
    inventory_cache.flush()
    group_vars = inventory_dir / "group_vars" / "all"
    group_vars.mkdir(parents=True)
    changes = [
        lambda: (group_vars / "ports.yml").write_text("dscluster_master_port: 29601\n"),
        (inventory_dir / "host_vars").mkdir,  # an empty directory reads the same
        lambda: (group_vars / "ports.yml").write_text("dscluster_master_port: 29602\n"),
        lambda: monkeypatch.setenv("ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED", "true"),
        lambda: (inventory_dir / "ansible.cfg").write_text("[defaults]\nforks = 7\n"),
        lambda: monkeypatch.setenv("ANSIBLE_CONFIG", str(inventory_dir / "ansible.cfg")),
        lambda: (inventory_dir / "ansible.cfg").write_text("[defaults]\nforks = 8\n"),
    ]
    runs = [len(calls)]
    for change in changes:
        change()
        new_process()
        inv = inventory.load(inventory_dir)
        inventory_cache.flush()
        runs.append(len(calls))
    assert runs == [1, 2, 2, 3, 4, 4, 5, 6]
    assert inventory.master_port(inv) == 29602
    new_process()
    inventory.load(inventory_dir)
    assert len(calls) == 6  # unchanged since: read from the cache
    assert len(list(cache.glob("*.json"))) == 6


def test_scripts_plugins_and_vault_data_are_never_kept(inventory_dir, tmp_path, cache):
    program = tool("ansible-inventory")
    hosts = inventory_dir / "hosts.yml"
    assert inventory_cache.key(hosts, program) is not None
    script = tmp_path / "inventory.sh"
    script.write_text("#!/bin/sh\necho '{}'\n")
    script.chmod(0o755)
    assert inventory_cache.key(script, program) is None
    plugin = tmp_path / "aws_ec2.yml"
    plugin.write_text("plugin: amazon.aws.aws_ec2\nregions: [us-east-1]\n")
    assert inventory_cache.key(plugin, program) is None
    secret = inventory_dir / "group_vars" / "all" / "secret.yml"
    secret.parent.mkdir(parents=True)
    secret.write_text("token: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n")
    assert inventory_cache.key(hosts, program) is None
    secret.unlink()
    assert inventory_cache.key(hosts, program) is not None
    dangling = inventory_dir / "group_vars" / "all" / "gone.yml"
    dangling.symlink_to(tmp_path / "nowhere")
    assert inventory_cache.key(hosts, program) is not None  # a dangling link is not a file


def test_a_refused_or_failed_command_writes_nothing(inventory_dir, cache, calls, monkeypatch):
    from dscluster import launch_files  # noqa: PLC0415

    hosts = inventory_dir / "hosts.yml"
    good = hosts.read_text()
    hosts.write_text(good.replace("dscluster_cpu_slots: 1", "dscluster_cpu_slots: 0"))
    assert cli.main(["hostfile", "-i", str(inventory_dir)]) != 0  # refused by the rules
    assert not inventory_cache._pending and not cache.exists()
    hosts.write_text(good)

    def fails(inv):
        raise DsclusterError(f"{inv.head}: a fault after the inventory was read")

    # Read fine, then the command fails: still nothing written.
    monkeypatch.setattr(launch_files, "write_launch_files", fails)
    assert cli.main(["hostfile", "-i", str(inventory_dir)]) == 1
    assert len(calls) == 2 and not cache.exists()


def test_an_entry_not_the_users_own_or_not_json_is_a_miss(inventory_dir, cache, calls):
    inventory.load(inventory_dir)
    inventory_cache.flush()
    (entry,) = cache.glob("*.json")
    entry.chmod(0o644)  # readable by others: not trusted
    new_process()
    inventory.load(inventory_dir)
    assert len(calls) == 2
    entry.chmod(0o600)
    entry.write_text("{not json")
    new_process()
    inv = inventory.load(inventory_dir)
    assert len(calls) == 3 and inv.head == "node-a"
    inventory_cache.flush()  # the miss was read afresh and is kept again, whole
    new_process()
    inventory.load(inventory_dir)
    assert len(calls) == 3


def test_an_unwritable_cache_is_only_a_miss(inventory_dir, cache, calls):
    cache.parent.mkdir()
    cache.write_text("a file where the directory would be")
    assert cli.main(["hostfile", "-i", str(inventory_dir)]) == 0
    new_process()
    assert cli.main(["hostfile", "-i", str(inventory_dir)]) == 0
    assert len(calls) == 2
    assert not [p for p in cache.parent.iterdir() if p.name != "inventory"]


def test_the_newest_entries_are_kept(inventory_dir, cache, monkeypatch):
    monkeypatch.setattr(inventory_cache, "MAX_ENTRIES", 3)
    for i in range(5):
        inventory_cache.remember(f"{i:064x}", "{}")
        inventory_cache.flush()
        os.utime(cache / f"{i:064x}.json", ns=(i * 10**9, i * 10**9))
    assert sorted(p.stem for p in cache.glob("*.json")) == [f"{i:064x}" for i in (2, 3, 4)]

"""validate_inventory over real inventories, run by Ansible on the controller: the storage
kind, the path set and the `storage` group (the role reads hostvars/groups and connects to
nothing), reported together, one numbered line per problem."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from .. import rolefiles

ROOT = rolefiles.REPO
PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "validate_inventory.yml"
ANSIBLE = pathlib.Path(sys.executable).parent / "ansible-playbook"


def validate(tmp_path: pathlib.Path, variables: dict, storage: list[str] | None = None):
    data: dict = {
        "all": {
            "vars": {"ansible_connection": "local", **variables},
            "children": {
                "head": {"hosts": {"h1": {}}},
                "workers": {"hosts": {"h2": {}, "h3": {}}},
            },
        }
    }
    if storage is not None:
        data["all"]["children"]["storage"] = {"hosts": {h: {} for h in storage}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(data))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(rolefiles.ROLES),
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_NOCOLOR="1",
    )
    proc = subprocess.run(
        [str(ANSIBLE), "-i", str(inv), str(PLAYBOOK)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", ["nfs", "lustre", "external", "none"])
def test_every_storage_kind_with_the_path_set_passes(tmp_path, kind):
    rc, out = validate(
        tmp_path,
        {
            "dscluster_shared_storage": kind,
            "dscluster_shared_dir": "/fsx",
            "dscluster_jobs_dir": "/fsx/jobs",
            "dscluster_checkpoint_dir": "/fsx/ckpt",
            "dscluster_wheelhouse_dir": "/fsx/wheels",
            "dscluster_scratch_dir": "/opt/dlami/nvme",
        },
        storage=["h2"],
    )
    assert rc == 0, out


def test_problems_are_reported_together(tmp_path):
    rc, out = validate(
        tmp_path,
        {"dscluster_shared_storage": True, "dscluster_checkpoint_dir": "relative/ckpt"},
        storage=["s9"],
    )
    assert rc != 0
    assert "The inventory has 3 problem(s)" in out
    assert (
        '[1] dscluster_checkpoint_dir is "relative/ckpt"; it must be an absolute path' in out
        or 'dscluster_checkpoint_dir is \\"relative/ckpt\\"' in out
    )
    assert "dscluster_shared_storage is true; it must be one of nfs, lustre, external, none" in out
    assert "s9 is in `storage` but in neither `head` nor `workers`" in out


def test_unknown_storage_kind_names_the_value(tmp_path):
    rc, out = validate(tmp_path, {"dscluster_shared_storage": "nfs4"})
    assert rc != 0
    assert "The inventory has 1 problem(s)" in out
    assert 'dscluster_shared_storage is "nfs4"' in out or 'is \\"nfs4\\"' in out

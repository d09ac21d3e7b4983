"""cluster_ssh's login round (vars/main.yml), rendered by Ansible on the controller: the order
each node logs in to the others (each starts after itself, so no sshd gets every node's first
login at once) and the problems its round's output gives, in the play's order."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import yaml

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "cluster_ssh_logins.yml"
ANSIBLE = pathlib.Path(sys.executable).parent / "ansible-playbook"


def rounds(tmp_path: pathlib.Path, hosts: dict[str, dict]) -> dict[str, dict]:
    inv = tmp_path / "hosts.yml"
    data = {"all": {"vars": {"ansible_connection": "local"}, "hosts": hosts}}
    inv.write_text(yaml.safe_dump(data))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(rolefiles.REPO / "ansible.cfg"),
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_NOCOLOR="1",
    )
    proc = subprocess.run(
        [str(ANSIBLE), "-i", str(inv), str(PLAYBOOK)],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {}
    for raw in proc.stdout.splitlines():
        line = raw.strip()
        if line.startswith('"msg": "ROUND '):
            data = json.loads(json.loads(line[len('"msg": ') :])[len("ROUND ") :])
            found[data["host"]] = data
    assert sorted(found) == sorted(hosts), proc.stdout
    return found


def test_each_node_starts_after_itself_and_every_step_reaches_each_node_once(tmp_path):
    names = [f"n{i:02d}" for i in range(1, 13)]  # more than sshd's MaxStartups (10)
    found = rounds(tmp_path, {n: {} for n in names})
    for i, n in enumerate(names):
        assert found[n]["order"] == names[i + 1 :] + names[: i + 1]
        assert found[n]["problems"] == []
    for step in range(len(names)):
        assert sorted(found[n]["order"][step] for n in names) == names


def test_problems_are_listed_in_the_play_order_whatever_the_login_order(tmp_path):
    found = rounds(
        tmp_path,
        {
            "a": {},
            "b": {"test_login_lines": ["c\t255\tHost key verification failed.", "a\t0\ta"]},
            "c": {
                "test_login_lines": ["a\t0\tb", "b\t255\tPermission denied (publickey).", "c\t0\tc"]
            },
        },
    )  # fmt: skip
    assert found["a"]["problems"] == []
    assert found["b"]["problems"] == [
        "b (no answer: ssh: no output)",
        "c (rc=255, output: Host key verification failed.)",
    ]
    assert found["c"]["problems"] == [
        "a (rc=0, output: b)",
        "b (rc=255, output: Permission denied (publickey).)",
    ]

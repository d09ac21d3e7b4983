"""cluster_ssh's login round (vars/main.yml), rendered by Ansible on the controller: the order
each node logs in to the others (each starts after itself, so no sshd gets every node's first
login at once) and the problems its round's output gives, in the play's order."""

from __future__ import annotations

import pathlib

import yaml

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "cluster_ssh_logins.yml"


def rounds(tmp_path: pathlib.Path, hosts: dict[str, dict]) -> dict[str, dict]:
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    rc, _, out = rolefiles.run_local_play(PLAYBOOK, {}, "ROUND", inventory=inv)
    assert rc == 0, out
    found = {data["host"]: data for data in rolefiles.tagged(out, "ROUND")}
    assert sorted(found) == sorted(hosts), out
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

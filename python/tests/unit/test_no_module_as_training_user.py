"""No Ansible module runs as the training user (issue 74).

A module run with `become_user: ds` is AnsiballZ run by the node's python3 as `ds`, with
HOME=/home/ds: Python imports ~ds/.local/.../usercustomize.py, and whatever it returns
(`ansible_facts` included, which outrank role defaults and group_vars and are cached) root then
believes; any live process of ds can also ptrace it. So every task, block, play and role entry
runs its module as root, and only the command it starts drops to the user (`runuser -u USER
--`). This reads every YAML file of the roles and playbooks and names each place that sets
`become_user` (or the `ansible_become_user` variable), whatever the value.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import yaml

from .. import rolefiles

REPO = rolefiles.REPO
KEYS = ("become_user", "ansible_become_user")


def yaml_files() -> list[pathlib.Path]:
    """Every task, handler, playbook and vars file of the collection (molecule's too)."""
    found = [REPO / "site.yml"]
    for top in ("roles", "playbooks"):
        for pattern in ("*.yml", "*.yaml"):
            found += (REPO / top).rglob(pattern)
    return sorted(p for p in set(found) if p.is_file())


def settings(node: object, where: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """(where, key) for every mapping that sets one of KEYS: a play, a task, a block or its
    rescue / always, a handler, a role entry, vars, apply of include_role / include_tasks.
    `where` names the enclosing plays, blocks and tasks by name (or by index)."""
    if isinstance(node, dict):
        name = node.get("name")
        here = (*where, str(name)) if isinstance(name, str) else where
        for key, value in node.items():
            if key in KEYS:
                yield " > ".join(here) or "(top)", key
            yield from settings(value, here)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            named = isinstance(item, dict) and isinstance(item.get("name"), str)
            yield from settings(item, where if named else (*where, f"[{i}]"))


def offenders(files: list[pathlib.Path], root: pathlib.Path = REPO) -> list[str]:
    found = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        data = yaml.safe_load(path.read_text())
        found += [f"{rel}: {where}: {key}" for where, key in settings(data)]
    return found


def test_no_task_play_or_block_runs_its_module_as_another_user():
    files = yaml_files()
    assert len(files) > 50 and REPO / "roles/cluster_ssh/tasks/verify.yml" in files
    found = offenders(files)
    assert found == [], (
        "these run an Ansible module as another user (the training user can then change its "
        "result); run the module as root and the command through `runuser -u USER --`:\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (  # a task
            "- name: t\n  ansible.builtin.command: id\n  become_user: ds\n",
            ["t: become_user"],
        ),
        (  # in a block's rescue, and a block's own
            "- name: b\n  become_user: x\n  block:\n    - name: t1\n      ansible.builtin.ping:\n"
            "  rescue:\n    - name: t2\n      ansible.builtin.ping:\n"
            "      become_user: '{{ u }}'\n",
            ["b: become_user", "b > t2: become_user"],
        ),
        (  # a play, one of its handlers, a role entry, and the variable form
            "- name: p\n  hosts: all\n  become_user: ds\n  roles:\n    - role: r\n"
            "      become_user: ds\n  handlers:\n    - name: h\n      ansible.builtin.ping:\n"
            "      vars:\n        ansible_become_user: ds\n",
            ["p: become_user", "p > [0]: become_user", "p > h: ansible_become_user"],
        ),
        (  # an include's apply, unnamed
            "- ansible.builtin.include_role:\n    name: r\n    apply:\n      become_user: ds\n",
            ["[0] > r: become_user"],
        ),
        ("- name: t\n  ansible.builtin.command: id\n  become: true\n", []),
    ],
)
def test_the_check_finds_become_user_wherever_it_is_set(tmp_path, text, want):
    """The check itself: a become_user added to a task, block, rescue, play, handler, role
    entry or include's apply is named, with the file, in a role and in a playbook alike."""
    rels = ("playbooks/launch.yml", "roles/r/tasks/main.yml")
    for rel in rels:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    files = sorted(tmp_path.rglob("*.yml"))
    want_named = [f"{rel}: {w}" for rel in rels for w in want]
    assert offenders(files, root=tmp_path) == want_named

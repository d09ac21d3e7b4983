"""Roles' variables rendered by Ansible for recorded facts (playbooks/os_vars.yml): each
inventory host takes one recorded `ansible -m setup` output (fixtures/os_facts/<os>.json),
then every role's defaults and vars are loaded as a play loads them, its OS checked by
roles/_os_check, and the named variables printed."""

from __future__ import annotations

import os
import pathlib
import re

import yaml

from .. import rolefiles

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "os_facts"
PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "os_vars.yml"


def render(
    tmp: pathlib.Path, hosts: dict[str, tuple[str, dict]], wanted: dict[str, list[str]]
) -> tuple[dict, str]:
    """hosts: inventory name -> (recorded facts' name, more host vars); wanted: role -> the
    variables to print, rendered in this order. Returns ({host: {role: {name: value}}}, the
    play's output); a host that failed has only the roles rendered before it failed."""
    inventory = tmp / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        name: {
                            "ansible_connection": "local",
                            "os_facts_file": str(FIXTURES / f"{facts}.json"),
                            **more,
                        }
                        for name, (facts, more) in hosts.items()
                    }
                }
            }
        )
    )
    extra = {
        "os_vars_wanted": wanted,
        "os_vars_roles": list(wanted),
        "os_vars_roles_dir": str(rolefiles.ROLES),
    }
    # the recorded facts stay in this run, never in the user's fact cache
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(rolefiles.ROLES), ANSIBLE_CACHE_PLUGIN="memory")
    _, _, out = rolefiles.run_local_play(PLAYBOOK, extra, "RENDER", env=env, inventory=inventory)
    result: dict = {}
    host = None
    for line in out.splitlines():
        started = re.match(r"ok: \[(\S+)\] => \{", line)
        if started:
            host = started.group(1)
        if "RENDER " in line and host is not None:
            data = next(rolefiles.tagged(line, "RENDER"))
            result.setdefault(host, {})[data["role"]] = data["values"]
    return result, out

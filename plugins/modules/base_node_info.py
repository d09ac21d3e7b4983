#!/usr/bin/python
"""What the base role's checks read on a node, in one round trip instead of one task each.

Run by roles/base/tasks (preflight.yml before anything changes, apply.yml after the writes)
with vars/main.yml's __base_state_request as its parts.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import subprocess

from ansible.module_utils.basic import AnsibleModule

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
try:
    from ansible.module_utils import node_read  # type: ignore[attr-defined]
except ImportError:
    from ansible_collections.dscluster.cluster.plugins.module_utils import node_read

DOCUMENTATION = r"""
module: base_node_info
short_description: Read what the base role checks and decides on, in one run
description:
  - Reads only the parts asked for in I(parts), each from its value there, and returns each
    under its name; a part left out or null, or a switch (session_limits, etc_hosts, chrony)
    that is false, is neither read nor returned.
  - Reads only. Fails, with the reason, where I(parts.session_limits) is asked and sshd's
    limits cannot be read.
options:
  parts:
    description: The parts to read.
    type: dict
    required: true
    suboptions:
      dpkg:
        description:
          - A dpkg-query argv (the base packages' states); returns its {rc, stdout, stderr}.
        type: list
        elements: str
      shm_df:
        description: Given (any value), read C(df -Pk /dev/shm); returns its {rc, stdout, stderr}.
        type: bool
      owners:
        description: The training ids; returns {uid, gid}, the account and group names holding them.
        type: dict
        suboptions:
          uid:
            description: The uid.
            type: int
            required: true
          gid:
            description: The gid.
            type: int
            required: true
      account:
        description:
          - A user; returns its passwd entry as getent lists it (password, uid, gid, gecos,
            home, shell), or null.
        type: str
      group:
        description: A group; returns its gid, or null where there is no such group.
        type: str
      stats:
        description:
          - Paths; returns {path, stat} for each, a file's {sha1, uid, gid, mode}, a
            directory's {isdir, uid, gid, mode}, null where it is not there (links followed).
        type: list
        elements: str
      session_limits:
        description:
          - Read C(/proc/<sshd>/limits), the hard limits login sessions inherit (containers).
        type: bool
      limits_file:
        description: A limits file; returns its text, or null where it is missing.
        type: str
      etc_hosts:
        description: Read the text of C(/etc/hosts).
        type: bool
      own_name:
        description: A host name; returns {rc, stdout, stderr} of C(getent hosts <name>).
        type: str
      chrony:
        description: Read C(systemctl is-active chrony) (its first line).
        type: bool
      shared_dir:
        description: The shared directory; returns {exists, isdir}.
        type: str
author: dscluster
"""

EXAMPLES = r"""
- name: Read /dev/shm and the training account
  base_node_info:
    parts:
      shm_df: true
      account: ds
      stats: [/etc/hosts]
  register: reading
"""

RETURN = r"""
state:
  description: The parts asked for, each under its name (see I(parts)).
  type: dict
  returned: success
"""

SESSION_LIMITS = """
pid="$(systemctl show --property=MainPID --value ssh.service 2>/dev/null)"
if [ -z "$pid" ] || [ "$pid" = 0 ]; then pid=1; fi
cat "/proc/$pid/limits"
"""


class Unreadable(Exception):
    """A part that must be read cannot be; the message says why."""


def run(argv, shell=False):
    try:
        proc = subprocess.run(argv, shell=shell, capture_output=True, text=True, check=False)
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc)}
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def owners(uid, gid):
    users, groups = [], []
    with contextlib.suppress(KeyError):
        users.append(pwd.getpwuid(uid).pw_name)
    with contextlib.suppress(KeyError):
        groups.append(grp.getgrgid(gid).gr_name)
    return {"uid": users, "gid": groups}


def account(name):
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    fields = (entry.pw_passwd, entry.pw_uid, entry.pw_gid, entry.pw_gecos, entry.pw_dir)
    return [str(f) for f in fields] + [entry.pw_shell]


def group_gid(name):
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def session_limits(_):
    limits = run(SESSION_LIMITS, shell=True)
    if limits["rc"] != 0:
        raise Unreadable("cannot read the limits of sshd: " + limits["stderr"].strip())
    return limits["stdout"]


def chrony(_):
    state = run(["systemctl", "is-active", "chrony"])["stdout"].strip().splitlines()
    return state[0] if state else ""


# part -> how to read it from its value in parts
READERS = {
    "dpkg": run,
    "shm_df": lambda _: run(["df", "-Pk", "/dev/shm"]),
    "owners": lambda ids: owners(int(ids["uid"]), int(ids["gid"])),
    "account": account,
    "group": group_gid,
    "stats": lambda paths: {path: node_read.describe(path) for path in paths},
    "limits_file": read,
    "own_name": lambda name: run(["getent", "hosts", name]),
    "shared_dir": lambda path: {"exists": os.path.lexists(path), "isdir": os.path.isdir(path)},
}
# parts read only when their value is true
SWITCHED = {
    "session_limits": session_limits,
    "etc_hosts": lambda _: read("/etc/hosts") or "",
    "chrony": chrony,
}


def read_state(want: dict) -> dict:
    """The parts of want that are given (not None; a switch: true), each read from its value."""
    out = {
        part: reader(want[part]) for part, reader in READERS.items() if want.get(part) is not None
    }
    out |= {part: reader(True) for part, reader in SWITCHED.items() if want.get(part)}
    return out


IDS = {"uid": {"type": "int", "required": True}, "gid": {"type": "int", "required": True}}
PARTS = {
    "dpkg": {"type": "list", "elements": "str"},
    "shm_df": {"type": "bool"},
    "owners": {"type": "dict", "options": IDS},
    "account": {"type": "str"},
    "group": {"type": "str"},
    "stats": {"type": "list", "elements": "str"},
    "session_limits": {"type": "bool"},
    "limits_file": {"type": "str"},
    "etc_hosts": {"type": "bool"},
    "own_name": {"type": "str"},
    "chrony": {"type": "bool"},
    "shared_dir": {"type": "str"},
}


def main() -> None:
    module = AnsibleModule(
        argument_spec={"parts": {"type": "dict", "required": True, "options": PARTS}},
        supports_check_mode=True,
    )
    try:
        state = read_state(module.params["parts"])
    except Unreadable as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()

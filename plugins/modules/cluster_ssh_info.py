#!/usr/bin/python
"""What the cluster_ssh role decides on, read on a node in one round trip.

The role skips a write whose file already reads as that write would leave it; anything else
(a file missing, another content, owner or mode) leaves the write to run.
"""

from __future__ import annotations

import base64
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
try:
    from ansible.module_utils import node_read  # type: ignore[attr-defined]
except ImportError:
    from ansible_collections.dscluster.cluster.plugins.module_utils import node_read

DOCUMENTATION = r"""
module: cluster_ssh_info
short_description: Read the SSH user, the node's host key and the cluster's key files
description:
  - Reads, in one run, the SSH user's account, this node's public host key, and how the
    files the cluster_ssh role writes read now (owner, group, mode, sha1), so that a converged
    node skips those writes.
  - Reads only. The training user owns C(~/.ssh), so nothing there is followed or read through
    a link (lstat, O_NOFOLLOW); a link, a FIFO or a file with other hard links reads as
    C(unsafe) (and so as differing), and is never read.
  - Fails, naming it, where the public host key cannot be read.
options:
  user:
    description: The SSH user (the training user), whose C(~/.ssh) is read.
    type: str
    required: true
  host_key:
    description: This node's public host key file.
    type: str
    required: true
  known_hosts:
    description: The cluster's known_hosts file.
    type: str
    required: true
author: dscluster
"""

EXAMPLES = r"""
- name: Read the SSH user, this node's host key and the cluster's key files
  cluster_ssh_info:
    user: ds
    host_key: /etc/ssh/ssh_host_ed25519_key.pub
    known_hosts: /etc/ssh/ssh_known_hosts
  register: reading
"""

RETURN = r"""
state:
  description:
    - The reading. C(account) is the user's {uid, gid, home}, or null where there is no such
      user (then C(ssh_dir) is null and C(files) and C(authorized) are empty).
    - C(host_key) is the public host key file, base64 (as slurp returns it).
    - C(ssh_dir) is {uid, gid, mode, isdir} of C(~user/.ssh), or null.
    - C(files) maps id_ed25519, id_ed25519.pub and authorized_keys under C(~user/.ssh) to
      {sha1, uid, gid, mode} (or {uid, gid, mode, unsafe}), or null where missing.
    - C(authorized) lists every key line of authorized_keys as {key ("type base64"), line}.
    - C(known_hosts) is {sha1, uid, gid, mode} of the known_hosts file, or null.
  type: dict
  returned: success
"""

KEY_TYPES = ("ssh-", "ecdsa-", "sk-")
KEY_FILES = ("id_ed25519", "id_ed25519.pub", "authorized_keys")


def authorized(path: str) -> list[dict]:
    keys: list[dict] = []
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return keys
        with open(path, encoding="utf-8", errors="replace", opener=node_read.no_follow) as fh:
            for line in fh:
                key = key_of(line)
                if key:
                    keys.append({"key": key, "line": line.strip()})
    except OSError:
        pass
    return keys


def key_of(line: str) -> str | None:
    """The "type base64" of a key line, after its options (from="a,b",no-pty ...) as sshd
    skips them (to the first blank outside quotes); None for a comment or anything else."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    if not text.startswith(KEY_TYPES):
        quoted, i = False, 0
        while i < len(text):
            if text[i] == "\\" and quoted:
                i += 2
                continue
            if text[i] == '"':
                quoted = not quoted
            elif text[i] in " \t" and not quoted:
                break
            i += 1
        text = text[i:]
    fields = text.split()
    if len(fields) >= 2 and fields[0].startswith(KEY_TYPES):
        return f"{fields[0]} {fields[1]}"
    return None


class NoHostKey(Exception):
    """This node's public host key cannot be read; the message names it."""


def read_state(user: str, host_key_file: str, known_hosts: str) -> dict:
    try:
        with open(host_key_file, "rb") as fh:
            host_key = base64.b64encode(fh.read()).decode()
    except OSError as exc:
        raise NoHostKey(f"cannot read this node's public host key {host_key_file}: {exc}") from exc
    state: dict = {
        "account": None,
        "host_key": host_key,
        "ssh_dir": None,
        "files": {},
        "authorized": [],
        "known_hosts": node_read.describe_no_follow(known_hosts),
    }
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return state
    state["account"] = {"uid": entry.pw_uid, "gid": entry.pw_gid, "home": entry.pw_dir}
    ssh_dir = os.path.join(entry.pw_dir, ".ssh")
    state["ssh_dir"] = node_read.describe_no_follow(ssh_dir)
    for name in KEY_FILES:
        state["files"][name] = node_read.describe_no_follow(os.path.join(ssh_dir, name))
    state["authorized"] = authorized(os.path.join(ssh_dir, "authorized_keys"))
    return state


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "user": {"type": "str", "required": True},
            "host_key": {"type": "str", "required": True},
            "known_hosts": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        state = read_state(p["user"], p["host_key"], p["known_hosts"])
    except NoHostKey as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()

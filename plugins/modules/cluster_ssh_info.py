#!/usr/bin/python
"""What the cluster_ssh role needs from a node, read in one round trip: the SSH user's account
(where configure.yml writes ~/.ssh, and its group) and this node's public host key (the
cluster's known_hosts)."""

from __future__ import annotations

import base64
import pwd

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: cluster_ssh_info
short_description: Read the SSH user's account and the node's public host key
description:
  - Reads, in one run, the SSH user's account (its uid, gid and home, where the cluster_ssh
    role writes C(~/.ssh)) and this node's public host key (for the cluster's known_hosts).
  - Reads only.
  - Fails, naming it, where the public host key cannot be read.
options:
  user:
    description: The SSH user (the training user).
    type: str
    required: true
  host_key:
    description: This node's public host key file.
    type: str
    required: true
author: dscluster
"""

EXAMPLES = r"""
- name: Read the SSH user and this node's host key
  cluster_ssh_info:
    user: ds
    host_key: /etc/ssh/ssh_host_ed25519_key.pub
  register: reading
"""

RETURN = r"""
state:
  description:
    - The reading. C(account) is the user's {uid, gid, home}, or null where there is no such
      user.
    - C(host_key) is the public host key file, base64 (as slurp returns it).
  type: dict
  returned: success
"""


class NoHostKey(Exception):
    """This node's public host key cannot be read; the message names it."""


def read_state(user: str, host_key_file: str) -> dict:
    try:
        with open(host_key_file, "rb") as fh:
            host_key = base64.b64encode(fh.read()).decode()
    except OSError as exc:
        raise NoHostKey(f"cannot read this node's public host key {host_key_file}: {exc}") from exc
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        account = None
    else:
        account = {"uid": entry.pw_uid, "gid": entry.pw_gid, "home": entry.pw_dir}
    return {"account": account, "host_key": host_key}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "user": {"type": "str", "required": True},
            "host_key": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        state = read_state(p["user"], p["host_key"])
    except NoHostKey as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()

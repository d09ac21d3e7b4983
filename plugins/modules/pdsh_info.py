#!/usr/bin/python
"""What the pdsh role decides on, read on a node in one round trip.

configure.yml skips a write whose file already reads as that write would leave it.
"""

from __future__ import annotations

import os
import subprocess

from ansible.module_utils.basic import AnsibleModule

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
try:
    from ansible.module_utils import node_read  # type: ignore[attr-defined]
except ImportError:
    from ansible_collections.dscluster.cluster.plugins.module_utils import node_read

DOCUMENTATION = r"""
module: pdsh_info
short_description: Read whether pdsh is installed and how its rcmd file reads
description:
  - Reads, in one run, which of the packages dpkg lists as installed, and how the rcmd file
    the pdsh role writes (and its directory) read now (owner, group, mode, sha1), so that a
    converged node skips apt and the write.
  - Reads only; a package dpkg does not know, or a node without dpkg-query, is not installed.
options:
  packages:
    description: The packages to look up.
    type: list
    elements: str
    required: true
  rcmd_file:
    description: pdsh's default rcmd file (C(/etc/pdsh/rcmd_default)).
    type: str
    required: true
author: dscluster
"""

EXAMPLES = r"""
- name: Read whether pdsh is installed and how its rcmd file reads
  pdsh_info:
    packages: [pdsh]
    rcmd_file: /etc/pdsh/rcmd_default
  register: reading
"""

RETURN = r"""
state:
  description:
    - The reading. C(installed) lists the packages dpkg lists as installed (C(ii)).
    - C(rcmd_dir) is {uid, gid, mode, isdir} of the rcmd file's directory, or null.
    - C(rcmd_file) is {sha1, uid, gid, mode} of the rcmd file, or null.
  type: dict
  returned: success
"""


def installed(packages: list[str]) -> list[str]:
    try:
        proc = subprocess.run(
            ["dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\n", *packages],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return []
    return [f[0] for f in (line.split() for line in proc.stdout.splitlines()) if f[1:2] == ["ii"]]


def read_state(packages: list[str], rcmd_file: str) -> dict:
    return {
        "installed": installed(packages),
        "rcmd_dir": node_read.describe(os.path.dirname(rcmd_file)),
        "rcmd_file": node_read.describe(rcmd_file),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "required": True},
            "rcmd_file": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    state = read_state(module.params["packages"], module.params["rcmd_file"])
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""Which of the pdsh role's packages dpkg lists as installed, read in one cheap round trip:
a converged node skips apt (whose cache alone costs more than this reading)."""

from __future__ import annotations

import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: pdsh_info
short_description: Read which pdsh packages are installed
description:
  - Reads which of the packages dpkg lists as installed, so that a converged node skips apt.
  - Reads only; a package dpkg does not know, or a node without dpkg-query, is not installed.
options:
  packages:
    description: The packages to look up.
    type: list
    elements: str
    required: true
author: dscluster
"""

EXAMPLES = r"""
- name: Read whether pdsh is installed
  pdsh_info:
    packages: [pdsh]
  register: reading
"""

RETURN = r"""
state:
  description:
    - The reading. C(installed) lists the packages dpkg lists as installed (C(ii)).
  type: dict
  returned: success
"""


def installed(packages: list[str]) -> list[str]:
    if not packages:  # dpkg-query --show with no names lists every package
        return []
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


def read_state(packages: list[str]) -> dict:
    return {"installed": installed(packages)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "required": True},
        },
        supports_check_mode=True,
    )
    state = read_state(module.params["packages"])
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()

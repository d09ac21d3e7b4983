#!/usr/bin/python
"""Which of the pdsh role's packages dpkg lists as installed, and pdsh's default remote command,
read in one cheap round trip: a converged node skips apt (whose cache alone costs more than
this reading) and the second reading of pdsh's options."""

from __future__ import annotations

import subprocess

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: pdsh_info
short_description: Read which pdsh packages are installed, and pdsh's options
description:
  - Reads which of the packages dpkg lists as installed, so that a converged node skips apt.
  - Reads only; a package dpkg does not know, or a node without dpkg-query, is not installed.
  - With C(query_host), also what C(pdsh -q -w <query_host>) prints (its options, among them
    the default remote command), or null where there is no pdsh to run.
options:
  packages:
    description: The packages to look up.
    type: list
    elements: str
    required: true
  query_host:
    description: The host C(pdsh -q) is asked about; none reads no options.
    type: str
author: dscluster
"""

EXAMPLES = r"""
- name: Read whether pdsh is installed
  pdsh_info:
    packages: [pdsh]
    query_host: "{{ inventory_hostname }}"
  register: reading
"""

RETURN = r"""
state:
  description:
    - The reading. C(installed) lists the packages dpkg lists as installed (C(ii)).
    - C(query) is the output of C(pdsh -q -w <query_host>), or null (no query_host, no pdsh,
      or pdsh failed).
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


def query(host: str | None) -> str | None:
    if not host:
        return None
    try:
        proc = subprocess.run(
            ["pdsh", "-q", "-w", host], capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def read_state(packages: list[str], query_host: str | None = None) -> dict:
    return {"installed": installed(packages), "query": query(query_host)}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "required": True},
            "query_host": {"type": "str"},
        },
        supports_check_mode=True,
    )
    state = read_state(module.params["packages"], module.params["query_host"])
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()

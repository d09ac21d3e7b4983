#!/usr/bin/python
"""Directories and whole files root writes on a node, in one module run.

A role that writes several small files (nccl_env: its helper, nccl.conf, its local fact)
checks and writes them together, where copy and file would cost a round trip or more each.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
try:
    from ansible.module_utils import file_writes  # type: ignore[attr-defined]
except ImportError:
    from ansible_collections.dscluster.cluster.plugins.module_utils import (
        file_writes,
    )

DOCUMENTATION = r"""
module: node_files
short_description: Make directories and write whole files on a node in one run
description:
  - Makes each directory (its missing parents root's, mode 0755), then writes each file whole,
    each with an owner, a group and a mode. Only what differs is written, atomically (a file
    made beside it, renamed over it).
  - Every directory is opened from / without following links. A link, a FIFO, a file with
    other hard links, or a file or directory of another owner is refused with one line naming
    it, and nothing below it is written.
  - Check mode says what would change and writes nothing; diff mode shows each file written.
options:
  directories:
    description: Directories to make (path, owner, group, mode), in this order.
    type: list
    elements: dict
    default: []
  files:
    description: Files written whole (path, content, owner, group, mode), after the directories.
    type: list
    elements: dict
    default: []
author: dscluster
"""

EXAMPLES = r"""
- name: Install a helper and its configuration
  node_files:
    directories:
      - {path: /opt/dscluster/bin, mode: "0755"}
    files:
      - {path: /opt/dscluster/bin/helper.py, content: "print('hi')\n", mode: "0755"}
      - {path: /etc/helper.conf, content: "A=1\n", mode: "0644"}
"""

RETURN = r"""
written:
  description: The paths made or written (content) in this run, or that check mode would.
  type: list
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    run = file_writes.Writes(module.check_mode, module._diff)
    try:
        run.apply(module.params["directories"], module.params["files"])
    except file_writes.ERRORS as exc:
        module.fail_json(msg=f"node_files: {exc}", written=run.written)
    module.exit_json(**run.result())


if __name__ == "__main__":
    main()

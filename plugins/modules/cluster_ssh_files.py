#!/usr/bin/python
"""cluster_ssh's writes on a node in one module run (one SSH round trip).

copy and template each cost three (a remote stat, the file's transfer, the copy module) and
authorized_key one more: on a node started from a baked image, which gets every one of them,
that was ten round trips per node and about 11 s of a 16-node provision on 2 cores.
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
module: cluster_ssh_files
short_description: Write the cluster's SSH files on a node in one run
description:
  - Makes a directory, writes files whole (one of them secret, never shown), and adds a line
    to a file where no line holds its match, each with an owner, a group and a mode; only
    what differs is written, atomically (a file made beside it, renamed over it).
  - Root never follows a link there (the training user owns ~/.ssh). Every directory is opened
    from / without following links, and a link, a FIFO, a file with other hard links, or a file
    or directory of another owner is refused with one line naming it.
  - Check mode says what would change and writes nothing; diff mode shows the public files.
options:
  directory:
    description: A directory to make (path, owner, group, mode); parents must exist.
    type: dict
  files:
    description: Files written whole (path, content, owner, group, mode).
    type: list
    elements: dict
    default: []
  secret:
    description: A file written whole from I(secret_content) (path, owner, group, mode).
    type: dict
  secret_content:
    description: The secret file's content (no_log).
    type: str
  line:
    description:
      - Make I(line) (path, line, match, owner, group, mode) the one line of a file that holds
        I(match), a word or words of the line. The first line holding it is replaced, any
        other line holding it removed, and the line appended where none holds it. Other lines
        are kept as they are. The file is made where it is missing.
    type: dict
author: dscluster
"""

EXAMPLES = r"""
- name: Install the cluster key pair and authorise it
  cluster_ssh_files:
    directory: {path: /home/ds/.ssh, owner: ds, group: "2000", mode: "0700"}
    secret: {path: /home/ds/.ssh/id_ed25519, owner: ds, group: "2000", mode: "0600"}
    secret_content: "{{ lookup('ansible.builtin.file', key, rstrip=False) }}"
    files:
      - path: /home/ds/.ssh/id_ed25519.pub
        content: "{{ lookup('ansible.builtin.file', key ~ '.pub', rstrip=False) }}"
        owner: ds
        group: "2000"
        mode: "0644"
    line:
      path: /home/ds/.ssh/authorized_keys
      line: 'from="10.0.0.1,10.0.0.2" ssh-ed25519 AAAA... dscluster'
      match: "ssh-ed25519 AAAA..."
      owner: ds
      group: "2000"
      mode: "0600"
"""

RETURN = r"""
written:
  description: The paths made or written (content) in this run, in the order above.
  type: list
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directory": {"type": "dict"},
            "files": {"type": "list", "elements": "dict", "default": []},
            "secret": {"type": "dict"},
            "secret_content": {"type": "str", "no_log": True},
            "line": {"type": "dict"},
        },
        required_together=[["secret", "secret_content"]],
        supports_check_mode=True,
    )
    p = module.params
    run = file_writes.Writes(module.check_mode, module._diff)
    try:
        if p["directory"]:
            run.directory(p["directory"])
        run.files(p["files"])
        if p["secret"]:
            run.whole(p["secret"], p["secret_content"], show=False)
        if p["line"]:
            run.line(p["line"])
    except file_writes.ERRORS as exc:
        module.fail_json(msg=f"cluster_ssh_files: {exc}", written=run.written)
    module.exit_json(**run.result())


if __name__ == "__main__":
    main()

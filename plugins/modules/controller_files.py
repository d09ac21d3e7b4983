#!/usr/bin/python
"""The documentation of the controller_files action (plugins/action/controller_files.py).

The action writes on the controller itself; this file only fails, in one line, where a
configuration finds the module and not its action.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: controller_files
short_description: Make directories and write whole files on the controller, with no module run
description:
  - The controller's side of node_files, for the records the controller keeps (what a check
    proved, a cluster's key directory). Runs in the task's worker on the controller, as the
    controller's user (become has no effect), whatever host the task is for.
  - The same writer as node_files (plugins/module_utils/file_writes.py) and its refusals;
    directories made (missing parents 0755), then whole files, each only where it differs,
    atomically; no path component may be a link, another user's, or open to others' writes.
  - Check mode says what would change and writes nothing; diff mode shows each file written.
options:
  directories:
    description: Directories to make (path, mode), in this order.
    type: list
    elements: dict
    default: []
  files:
    description: >-
      Files written whole (path, content, mode), after the directories. A content that is a
      mapping or a list (older ansible-core reads a templated JSON string as one) is written
      as JSON, indented by 4 with sorted keys.
    type: list
    elements: dict
    default: []
  absent:
    description: >-
      Absolute paths removed last: a link itself (not what it names), a directory with all
      below it. A path already gone changes nothing.
    type: list
    elements: path
    default: []
author: dscluster
"""

EXAMPLES = r"""
- name: Record what the logins proved
  controller_files:
    directories:
      - {path: "{{ dscluster_state_dir }}", mode: "0700"}
    files:
      - {path: "{{ dscluster_state_dir }}/verified.json", content: "{}\n", mode: "0600"}
  run_once: true
"""

RETURN = r"""
written:
  description: >-
    The paths on the controller that this run made or wrote, or that check mode would have.
  type: list
  returned: always
removed:
  description: The paths of `absent` that this run removed, or that check mode would have.
  type: list
  returned: always
"""


def main() -> None:
    # The action validates the options; the module only names them, then says what is missing.
    spec = {name: {"type": "raw"} for name in ("directories", "files", "absent")}
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    module.fail_json(
        msg="controller_files runs on the controller through its action plugin; add the "
        "collection's plugins/action to action_plugins (ansible.cfg) or call it as "
        "dscluster.cluster.controller_files"
    )


if __name__ == "__main__":
    main()

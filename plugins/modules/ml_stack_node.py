#!/usr/bin/python
"""The documentation of the ml_stack_node action (plugins/action/ml_stack_node.py).

The action decides on the controller itself; this file only fails, in one line, where a
configuration finds the module and not its action.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ml_stack_node
short_description: ml_stack's side of one node, decided on the controller
description:
  - Reads the ml_stack role's variables, the build plan (__ml_stack_plan), the controller's
    layers (__ml_stack_controller_digests, __ml_stack_uv_version) and this node's local facts,
    and returns what plugins/module_utils/ml_stack_node.py makes of them, registered as
    __ml_stack_node by tasks/node.yml.
  - Runs in the task's worker on the controller; nothing runs on the node and nothing is
    written. It takes no options.
options: {}
author: dscluster
"""

EXAMPLES = r"""
- name: Decide this node's part of the stack (controller)
  ml_stack_node:
  register: __ml_stack_node
"""

RETURN = r"""
root_paths:
  description: The paths root runs programs from or writes through (each must be root's up to /).
  type: list
  elements: str
  returned: always
dirs:
  description: The training user's directories (torch extensions, bytecode prefix).
  type: list
  elements: dict
  returned: always
reading_argv:
  description: record_versions.py's argv, with the controller's expectation (--want).
  type: list
  elements: str
  returned: always
seed_argv:
  description: pycache_seed.py's argv, run as the training user by runuser.
  type: list
  elements: str
  returned: always
ranks:
  description: The ranks this node runs (its accelerators, else dscluster_cpu_slots).
  type: int
  returned: always
seed_possible:
  description: Whether a bytecode prefix is configured (ml_stack_pycache_dir).
  type: bool
  returned: always
seed_for_ranks:
  description: Several ranks and a prefix that the recorded fact says lacks a job's imports.
  type: bool
  returned: always
pycache_warm_recorded:
  description: What the node's ml_stack fact says of its prefix (false where it says nothing).
  type: bool
  returned: always
"""


def main() -> None:
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.fail_json(
        msg="ml_stack_node runs on the controller through its action plugin; add the "
        "collection's plugins/action to action_plugins (ansible.cfg) or call it as "
        "dscluster.cluster.ml_stack_node"
    )


if __name__ == "__main__":
    main()

#!/usr/bin/python
"""The documentation of the ml_stack_plan action (plugins/action/ml_stack_plan.py).

The action plans on the controller itself; this file only fails, in one line, where a
configuration finds the module and not its action.
"""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ml_stack_plan
short_description: ml_stack's torch and DeepSpeed build plan, made on the controller
description:
  - Reads the build host's facts (ml_stack_build_host's Python, architecture, CPU model, OS
    and its accelerators, nvidia and habana local facts), this node's NVIDIA fact and the
    ml_stack role's variables, and returns the plan that plugins/module_utils/ml_stack_plan.py
    makes of them (accelerator, torch variant and spec, wheelhouse key and path, the base
    layer's lock and its refusal, the controller's download arguments, the build environment,
    the user layer's key).
  - C(refusal) is one line when this node cannot run the planned build (no torch build for
    its accelerator, a driver or a GPU too old for the build's CUDA), else empty.
  - Runs in the task's worker on the controller; nothing runs on the node and nothing is
    written. An inventory file the plan reads (ml_stack_base_lock_file,
    ml_stack_requirements_file) that the controller cannot read fails it in one line.
options:
  role_path:
    description: The ml_stack role's directory (its files/locks hold the shipped locks).
    type: path
    required: true
author: dscluster
"""

EXAMPLES = r"""
- name: Plan the torch and DeepSpeed build (controller)
  ml_stack_plan:
    role_path: "{{ role_path }}"
  register: __ml_stack_plan
"""

RETURN = r"""
key:
  description: >-
    The base layer's wheelhouse key (variant, torch, DeepSpeed, Python, architecture, a hash of
    the build's inputs).
  type: str
  returned: always
variant:
  description: The torch build (cpu, cu126, cu128, cu130, pypi, hpu; none when there is none).
  type: str
  returned: always
refusal:
  description: Why this node cannot run the planned build, in one line; empty when it can.
  type: str
  returned: always
"""


def main() -> None:
    # The action validates the options; the module only names them, then says what is missing.
    module = AnsibleModule(argument_spec={"role_path": {"type": "raw"}}, supports_check_mode=True)
    module.fail_json(
        msg="ml_stack_plan runs on the controller through its action plugin; add the "
        "collection's plugins/action to action_plugins (ansible.cfg) or call it as "
        "dscluster.cluster.ml_stack_plan"
    )


if __name__ == "__main__":
    main()

"""The ml_stack_node action: this node's part of ml_stack (plugins/module_utils/ml_stack_node.py:
the paths root checks, the training user's directories, the stack's reading and the bytecode
seed), computed in the task's worker on the controller (no module run, nothing on the node).

It reads the role's variables by name (ml_stack_node.OPTIONS), the build plan
(__ml_stack_plan), the controller's layers (__ml_stack_controller_digests,
__ml_stack_uv_version), the modules a job imports (__ml_stack_warm_modules) and this node's
local facts; the result is registered as __ml_stack_node.
"""

from __future__ import annotations

import os
import sys

from ansible.plugins.action import ActionBase

# This plugin's own module_utils (a clone's or an installed collection's), never another's.
_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _UTILS not in sys.path:
    sys.path.insert(0, _UTILS)
import ml_stack_node  # type: ignore[import-not-found]  # noqa: E402


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        self.validate_argument_spec(argument_spec={})
        resolve = self._templar.resolve_variable_expression
        local = (task_vars or {}).get("ansible_facts", {}).get("ansible_local") or {}
        result.update(
            ml_stack_node.node_plan(
                resolve("__ml_stack_plan"),
                local,
                {name: resolve(name) for name in ml_stack_node.OPTIONS},
                digests=resolve("__ml_stack_controller_digests"),
                uv_version=str(resolve("__ml_stack_uv_version")),
                warm_modules=[str(m) for m in resolve("__ml_stack_warm_modules")],
            )
        )
        result["changed"] = False
        return result

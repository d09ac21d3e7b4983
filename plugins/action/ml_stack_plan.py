"""The ml_stack_plan action: ml_stack's build plan (plugins/module_utils/ml_stack_plan.py) for
the build host's facts and the role's variables, with this node's refusal, computed in the
task's worker on the controller (no module run, nothing on the node).

It reads the build host's facts (ml_stack_build_host's: Python, architecture, CPU model, OS
and its accelerators, nvidia and habana local facts; once per host, as the set_fact it replaces
did), this node's NVIDIA fact, and the role's variables by name (ml_stack_plan.OPTIONS). Its
one argument is the role's path (the shipped locks); the result is the plan, registered as
__ml_stack_plan.
"""

from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# This plugin's own module_utils (a clone's or an installed collection's), never another's.
_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _UTILS not in sys.path:
    sys.path.insert(0, _UTILS)
import ml_stack_plan  # type: ignore[import-not-found]  # noqa: E402

SPEC = {"role_path": {"type": "path", "required": True}}
# The build host's facts the plan reads (by their names under ansible_facts), and its local ones.
FACTS = (
    "python",
    "architecture",
    "processor",
    "distribution",
    "distribution_major_version",
)
LOCAL = ("accelerators", "nvidia", "habana")


def _facts_of(facts) -> dict:
    local = facts.get("ansible_local") or {}
    return {name: facts[name] for name in FACTS if name in facts} | {
        "ansible_local": {name: local[name] for name in LOCAL if name in local}
    }


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=SPEC)
        resolve = self._templar.resolve_variable_expression
        options = {name: resolve(name) for name in (*ml_stack_plan.OPTIONS, "__ml_stack_os_table")}
        build_host = resolve("ml_stack_build_host")
        facts = _facts_of(resolve("hostvars[ml_stack_build_host].ansible_facts"))
        if "python" not in facts or "architecture" not in facts:
            raise AnsibleActionFail(
                f"ml_stack_build_host={build_host} has no Python or architecture facts: "
                "gather its facts (it must be reachable) before ml_stack runs."
            )
        try:
            built = ml_stack_plan.plan(
                facts,
                options,
                role_path=args["role_path"],
                python=resolve("ansible_playbook_python"),
            )
        except ml_stack_plan.PlanError as err:
            raise AnsibleActionFail(str(err)) from err
        own = (task_vars or {}).get("ansible_facts", {}).get("ansible_local") or {}
        node = {
            "host": resolve("inventory_hostname"),
            "nvidia": own.get("nvidia") or {},
        }
        built["refusal"] = ml_stack_plan.node_refusal(built, node, options)
        built.update(ml_stack_plan.node_of((task_vars or {}).get("ansible_facts", {}), options))
        result.update(built)
        result["changed"] = False
        return result

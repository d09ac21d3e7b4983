"""Action plugin for the test playbooks: a host's facts from a recorded `ansible -m setup`
JSON file (its `ansible_facts`) and/or given as `facts` (by the names setup returns them by:
ansible_local, ansible_python, ...), set as gathered facts, so roles read `ansible_facts[...]`
as on the recorded machine without reaching it. Like setup's, they land under `ansible_facts`
only (ansible.cfg: inject_facts_as_vars = False), where an extra var or a host var never
reaches. A recorded fact wins over a given one of the same name (`facts` adds what a recording
lacks); facts already gathered are updated, each given top-level fact replacing its own."""

from __future__ import annotations

import json

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        facts = dict(self._task.args.get("facts") or {})
        if self._task.args.get("path"):
            with open(self._task.args["path"], encoding="utf-8") as recorded:
                facts |= json.load(recorded)["ansible_facts"]
        result["ansible_facts"] = facts
        result["changed"] = False
        return result

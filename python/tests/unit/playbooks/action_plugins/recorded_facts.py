"""Action plugin for the test playbooks: a host's facts from a recorded `ansible -m setup`
JSON file (its `ansible_facts`), set as gathered facts, so roles read `ansible_facts[...]` and
`ansible_*` as on the recorded machine without reaching it."""

from __future__ import annotations

import json

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        with open(self._task.args["path"], encoding="utf-8") as recorded:
            result["ansible_facts"] = json.load(recorded)["ansible_facts"]
        result["changed"] = False
        return result

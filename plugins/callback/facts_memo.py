# Copyright: dscluster maintainers
# Apache-2.0
"""Decode and clean a host's cached facts once per change, not once per task.

ansible-core 2.19 builds every task's variables for every host from the fact cache: it decodes
the host's whole JSON payload again (the jsonfile plugin keeps the encoded string in memory),
then `clean_facts` deep-copies it, lists every connection plugin on disk and matches each fact
name against each of them, to push the facts into the top-level namespace. On a 3-node
re-converge that is a fifth of the controller's main process (py-spy: 635 of 2,958 samples),
and the main process queues each task for each host in turn. With this callback enabled, the
decoded facts are kept beside the payload they came from and used while the cache holds that
same payload (a new one, written when facts change, is decoded afresh); the cleaned facts of
that payload are kept too, and every caller still gets its own deep copy, as before. With
fact injection off (inject_facts_as_vars = False, as ansible.cfg and dscluster set it)
ansible-core calls no clean_facts when it builds variables: the decoded payload is what is
kept then.

It patches ansible-core's private cache interposer and the variable manager's clean_facts, so
it applies only to the versions it was written against (2.19); on others, or with
DSCLUSTER_FACTS_MEMO=0, it does nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

# This tree's plugin_utils, by path (callback_switch.py's docstring says why).
_SWITCH = importlib.util.spec_from_file_location(
    "dscluster_callback_switch", Path(__file__).parents[1] / "plugin_utils" / "callback_switch.py"
)
callback_switch = importlib.util.module_from_spec(_SWITCH)
_SWITCH.loader.exec_module(callback_switch)

DOCUMENTATION = r"""
name: facts_memo
type: aggregate
short_description: decode and clean each host's cached facts once per change
description:
  - The fact cache's decoded payload, and the cleaned top-level facts made from it, are kept
    while the cache holds the same payload; every caller still gets its own copy.
  - Applies to ansible-core 2.19 only; set C(DSCLUSTER_FACTS_MEMO=0) to turn it off.
requirements:
  - enable in configuration (callbacks_enabled)
"""

_INSTALLED: dict[str, bool] = {}


class _Entry:
    """One host's payload (the encoded string the cache holds), its decoded facts, and the
    cleaned facts made from them (None until first asked)."""

    __slots__ = ("cleaned", "decoded", "payload")

    def __init__(self, payload: str, decoded: dict) -> None:
        self.payload = payload
        self.decoded = decoded
        self.cleaned: dict | None = None


class _Memo:
    def __init__(self) -> None:
        self.entries: dict[tuple[int, str], _Entry] = {}
        # the copy last handed out, with its entry: get_vars cleans the facts it just got, so
        # one slot serves it; a copy cleaned later (or changed since) is cleaned as it is
        self.last: tuple[dict, _Entry] | None = None

    def hand_out(self, entry: _Entry) -> dict:
        facts = dict(entry.decoded)  # callers may update the top level (set_host_facts does)
        self.last = (facts, entry)
        return facts

    def entry_for(self, facts: object) -> _Entry | None:
        """The entry the last handed-out copy came from, if `facts` is that copy and its top
        level is unchanged."""
        if self.last is None or self.last[0] is not facts:
            return None
        entry = self.last[1]
        decoded = entry.decoded
        if len(facts) != len(decoded) or any(facts.get(k) is not v for k, v in decoded.items()):
            return None
        return entry


def _internals():
    """ansible-core's cache interposer class, the variable manager module and
    module_response_deepcopy; None where any of them is not there."""
    try:
        from ansible._internal._plugins import _cache  # noqa: PLC0415
        from ansible.vars import clean, manager  # noqa: PLC0415
    except ImportError:
        return None
    interposer = getattr(_cache, "PluginInterposer", None)
    found = (
        interposer,
        getattr(interposer, "_PAYLOAD_KEY", None),
        getattr(interposer, "_decode", None),
        getattr(manager, "clean_facts", None),
        getattr(clean, "module_response_deepcopy", None),
    )
    return None if None in found else (manager, *found)


def install() -> bool:
    """Patch this process (and the workers it forks). Returns False, changing nothing, where
    the internals it relies on are not there."""
    if _INSTALLED:
        return True
    internals = _internals()
    if internals is None:
        return False
    manager, interposer, payload_key, _decode, plain_clean, deepcopy = internals
    memo = _Memo()

    def get(self, key: str) -> dict[str, object]:
        raw = self.__wrapped__.get(self._get_key(key))
        payload = raw.get(payload_key) if isinstance(raw, dict) else None
        if not isinstance(payload, str):
            return self._decode(raw)
        where = (id(self.__wrapped__), key)
        entry = memo.entries.get(where)
        if entry is None or entry.payload is not payload:
            entry = _Entry(payload, self._decode(raw))
            memo.entries[where] = entry
        return memo.hand_out(entry)

    def clean_facts(facts):
        entry = memo.entry_for(facts)
        if entry is None:
            return plain_clean(facts)
        if entry.cleaned is None:
            entry.cleaned = plain_clean(facts)
        return deepcopy(entry.cleaned)

    interposer.get = get
    manager.clean_facts = clean_facts
    _INSTALLED["on"] = True
    return True


class CallbackModule(callback_switch.SwitchedCallback):
    CALLBACK_NAME = "dscluster.cluster.facts_memo"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Callbacks load in the controller's main process before any worker forks.
        if _INSTALLED or not self.opted_in("DSCLUSTER_FACTS_MEMO"):
            return
        if not install():
            self._display.vvv("facts_memo: fact cache internals not found; off")
            return
        self._display.vvv("facts_memo: decoded and cleaned facts kept per payload")

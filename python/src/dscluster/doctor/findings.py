"""Reading one node's findings (what playbooks/doctor.yml hands over per host) and blaming a
failed pair on the right node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def load_json(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def stdout_json(finding: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """The JSON a probe step printed (a registered command result), or None."""
    result = finding.get(key) or {}
    if not isinstance(result, Mapping) or result.get("skipped"):
        return None
    return load_json(str(result.get("stdout", "")))


def step_error(finding: Mapping[str, Any], key: str) -> str:
    result = finding.get(key) or {}
    if not isinstance(result, Mapping):
        return "no result"
    lines = [ln.strip() for ln in str(result.get("stderr", "")).splitlines() if ln.strip()]
    err = lines[-1][-300:] if lines else ""
    return f"probe step '{key}' failed (rc={result.get('rc')}): {err or result.get('msg', '')}"


def attribute(
    pairs: Mapping[tuple[str, str], str], sources: Sequence[str], targets: Sequence[str]
) -> tuple[dict[str, str], dict[str, str], dict[tuple[str, str], str]]:
    """Split failed (src, dst) pairs into targets no source reaches, sources that reach no
    target, and the remaining pairs (blamed on the source)."""
    bad_targets: dict[str, str] = {}
    for dst in targets:
        srcs = [s for s in sources if s != dst]
        if srcs and all((s, dst) in pairs for s in srcs):
            bad_targets[dst] = pairs[(srcs[0], dst)]
    bad_sources: dict[str, str] = {}
    for src in sources:
        dsts = [d for d in targets if d != src and d not in bad_targets]
        if len(dsts) > 1 and all((src, d) in pairs for d in dsts):
            bad_sources[src] = pairs[(src, dsts[0])]
    rest = {
        (s, d): why
        for (s, d), why in pairs.items()
        if d not in bad_targets and s not in bad_sources
    }
    return bad_targets, bad_sources, rest

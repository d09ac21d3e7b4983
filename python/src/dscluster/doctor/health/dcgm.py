"""NVIDIA DCGM's diagnostic, `dcgmi diag -r N -j` ("dcgmi-diag.json").

The JSON (nvvs/include/NvvsCommon.h in NVIDIA/DCGM describes it) is
`{"DCGM GPU Diagnostic": {"test_categories": [{"category": ..., "tests": [{"name": ...,
"results": [{"gpu_id"|"gpu_ids": ..., "status": "Pass"|"Fail"|"Warn"|"Skip", "warnings":
[{"warning": ..., "error_id": ...}], "info": [...]}]}]}], "version": ...}}`. DCGM 3.1 wrote
the status upper-case and left `null` between tests; DCGM 4 renamed the top object to
"DCGM Diagnostic" and adds a per-test "test_summary" (its release notes' breaking changes).
Text that dcgmi prints before the object ("Successfully ran diagnostic for group.") is
skipped.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from . import ACTIONS, Expect, Finding, NodeOutputs, Unreadable

FILE = "dcgmi-diag.json"
ROOTS = ("DCGM GPU Diagnostic", "DCGM Diagnostic")
STATUSES = ("pass", "fail", "warn", "skip")
# What a failing test says about the hardware, by words in its name: memory faults do not
# heal (take the node out); PCIe/NVLink faults may clear with a GPU reset; the deployment
# checks (libraries, persistence mode, permissions) are the node's setup and keep it out of
# jobs until fixed.
OTHER_FIX = (
    "reset the GPU (or reboot the node) and run the diagnostic again; take the node out if it "
    "fails again"
)
DEPLOYMENT_FIX = "fix the node's setup that DCGM's deployment check names, then run it again"
KINDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("memory", "memtest", "row remap", "page retirement", "inforom"),
        "isolate",
        "take the node out and have the GPU checked: its memory failed DCGM's test",
    ),
    (("pcie", "nvlink", "nvbandwidth", "bandwidth"), "reset", OTHER_FIX),
)
LEVELS = (
    (4, ("eud", "memtest", "pulse")),
    (3, ("targeted stress", "targeted power", "diagnostic", "memory bandwidth")),
    (2, ("pcie", "gpu memory")),
)
RANK = {action: i for i, action in enumerate(ACTIONS)}


@dataclasses.dataclass(frozen=True)
class Result:
    category: str
    test: str
    gpus: str  # "0" or "0,1,2,3" as DCGM printed it; "" when not given
    status: str  # pass | fail | warn | skip (lower case)
    message: str  # the first warning or info line, "" when none


def parse(text: str) -> tuple[str, list[Result]]:
    """(DCGM version, every test result) from `dcgmi diag -j` output."""
    start = text.find("{")
    if start < 0:
        raise Unreadable(f"{FILE}: no JSON object in the output")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise Unreadable(
            f"{FILE}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise Unreadable(f"{FILE}: JSON nested too deeply to be DCGM's") from None
    root = next((doc[k] for k in ROOTS if isinstance(doc, dict) and k in doc), None)
    if not isinstance(root, dict):
        raise Unreadable(f"{FILE}: no {ROOTS[0]!r} object")
    categories = root.get("test_categories")
    if not isinstance(categories, list):
        raise Unreadable(f"{FILE}: test_categories is not a list")
    results: list[Result] = []
    for category in categories:
        if category is None:
            continue
        name = _field(category, "category", "a test category")
        tests = category.get("tests")
        if not isinstance(tests, list):
            raise Unreadable(f"{FILE}: category {name!r} has no list of tests")
        for test in tests:
            if test is not None:  # DCGM 3.1 wrote null between tests
                results += _results(name, test)
    return str(root.get("version", "")), results


def judge_dcgm(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """A fail finding per failed test and GPU, a warn per warning; otherwise one pass naming
    the run level that the tests present imply."""
    text = outputs.text(FILE)
    if text is None:
        return [outputs.skip(FILE)]
    version, results = parse(text)
    findings = [_finding(r) for r in results if r.status in ("fail", "warn")]
    if findings:
        return sorted(findings, key=lambda f: (f.status != "fail", RANK[f.action], f.detail))
    passed = [r for r in results if r.status == "pass"]
    skipped = len(results) - len(passed)
    dcgm = f"DCGM {version}" if version else "DCGM"
    if not passed:
        detail = f"{dcgm} diagnostic: every one of {len(results)} test results was skipped"
        fix = "run `dcgmi diag -r 2` as root on an idle node and look at why the tests skip"
        evidence = ", ".join(sorted({r.test for r in results}))[:200]
        return [Finding("warn", detail, "monitor", fix, evidence)]
    tests = sorted({r.test for r in passed})
    level = _level(results)
    skip = f", {skipped} skipped" if skipped else ""
    return [
        Finding(
            "pass",
            f"{dcgm} diagnostic, level {level} (from the tests run): "
            f"{len(tests)} test(s) passed{skip}",
        )
    ]


def _results(category: str, test: Any) -> list[Result]:
    name = _field(test, "name", f"a test of {category!r}")
    entries = test.get("results")
    summary = test.get("test_summary")
    if entries is None and isinstance(summary, dict):
        entries = [summary]
    if not isinstance(entries, list):
        raise Unreadable(f"{FILE}: test {name!r} has no list of results")
    out = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise Unreadable(f"{FILE}: a result of {name!r} is not an object")
        status = str(entry.get("status", "")).strip().lower()
        if status not in STATUSES:
            raise Unreadable(f"{FILE}: test {name!r} has status {entry.get('status')!r}")
        gpus = entry.get("gpu_ids", entry.get("gpu_id", entry.get("entity_id", "")))
        out.append(Result(category, name, str(gpus), status, _message(entry)))
    return out


def _field(obj: Any, key: str, what: str) -> str:
    if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
        raise Unreadable(f"{FILE}: {what} has no {key!r}")
    return str(obj[key])


def _message(entry: dict) -> str:
    for key in ("warnings", "info"):
        items = entry.get(key)
        if isinstance(items, list) and items:
            first = items[0]
            if isinstance(first, dict):
                first = first.get("warning", first.get("message", ""))
            return str(first)
    return ""


def _finding(result: Result) -> Finding:
    if not result.gpus:
        where = "the node's GPUs"
    else:
        where = f"GPUs {result.gpus}" if "," in result.gpus else f"GPU {result.gpus}"
    evidence = f"{result.category} / {result.test}: {result.status}"
    if result.message:
        evidence += f": {result.message}"
    evidence = evidence[:240]
    if result.status == "warn":
        detail = f"{where}: DCGM test {result.test!r} warned"
        fix = "keep an eye on it; run the diagnostic again at a higher level if it repeats"
        return Finding("warn", detail, "monitor", fix, evidence)
    detail = f"{where}: DCGM test {result.test!r} ({result.category}) failed"
    action, fix = _action(result)
    return Finding("fail", detail, action, fix, evidence)


def _action(result: Result) -> tuple[str, str]:
    name = result.test.lower()
    for words, action, fix in KINDS:
        if any(word in name for word in words):
            return action, fix
    if result.category.lower() in ("deployment", "software") or name == "software":
        return "isolate", DEPLOYMENT_FIX
    return "reset", OTHER_FIX


def _level(results: list[Result]) -> int:
    names = " ".join(r.test.lower() for r in results)
    return next((level for level, words in LEVELS if any(w in names for w in words)), 1)

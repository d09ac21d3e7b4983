"""Xid and SXid events in the kernel log since boot ("kernel.log").

The NVIDIA driver reports a GPU fault as one kernel line,
`NVRM: Xid (PCI:0000:1b:00): 79, pid=..., name=..., GPU has fallen off the bus.`, and the
NVSwitch driver as `nvidia-nvswitch0: SXid (PCI:0000:02:00.0): 22013, Non-fatal, ...`. The
lines are found wherever they sit in the line: plain `dmesg`, `dmesg -T`/`--ctime`,
`dmesg -t`, `dmesg --decode --time-format iso` and `journalctl -k` all carry them unchanged.
"""

from __future__ import annotations

import dataclasses
import re

from . import ACTIONS, Expect, Finding, NodeOutputs, Unreadable

FILE = "kernel.log"

# What each Xid means and what an admin does first, from NVIDIA's Xid catalogue
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution Bucket
# (Immediate Action)": RESTART_APP -> monitor, RESET_GPU -> reset, RESTART_BM -> reboot),
# cross-checked with awsome-distributed-training's gpu-cluster-healthcheck grading, which
# takes a node out for a GPU gone from the bus and for an exhausted row remapper (Xid 64,
# awslabs/awsome-distributed-ai pull request 1190).
# "app": the application caused it (a bad kernel, a killed process); not the node's fault.
XIDS: dict[int, tuple[str, str, bool]] = {
    8: ("GPU stopped processing (channel idle timeout)", "monitor", True),
    13: ("graphics engine exception", "monitor", True),
    31: ("GPU memory page fault", "monitor", True),
    32: ("invalid or corrupted push buffer stream", "monitor", True),
    38: ("driver firmware error", "reset", False),
    43: ("GPU stopped processing (the application hit an error)", "monitor", True),
    45: ("preemptive cleanup after an earlier error or a killed process", "monitor", True),
    46: ("GPU stopped processing", "reset", False),
    48: ("double-bit ECC error", "reset", False),
    56: ("display engine error", "reset", False),
    61: ("internal micro-controller breakpoint", "reset", False),
    62: ("internal micro-controller halt", "reset", False),
    63: ("row remapping recorded; a GPU reset applies it", "reset", False),
    64: ("row remapping failed: the spare rows are used up", "isolate", False),
    68: ("video decoder exception", "monitor", True),
    69: ("graphics engine class error", "monitor", True),
    74: ("NVLink error", "reset", False),
    79: ("GPU has fallen off the bus", "isolate", False),
    92: ("high single-bit ECC error rate", "monitor", False),
    94: ("contained ECC error; the affected application was killed", "reset", False),
    95: ("uncontained ECC error", "reset", False),
    109: ("context switch timeout", "monitor", True),
    119: ("GSP RPC timeout", "reset", False),
    120: ("GSP error", "reset", False),
    121: ("C2C link error", "reset", False),
    140: ("unrecovered ECC error", "reset", False),
    154: ("GPU recovery action changed", "monitor", False),
}
# Xid 154 names the recovery the driver now asks for; its code is NVML's
# nvmlDeviceGpuRecoveryAction_t (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P,
# 4 drain P2P and reset).
RECOVERY = {0: "monitor", 1: "reset", 2: "reboot", 3: "reset", 4: "reset"}
FIXES = {
    "isolate": "take the node out of the job and reboot it; if the fault comes back, have the "
    "GPU's hardware checked (seating, power, cooling) or replaced",
    "reboot": "drain the node and reboot it",
    "reset": "drain the GPU and reset it (nvidia-smi -r -i {dev}) or reboot the node; if it "
    "repeats after the reset, take the node out",
    "monitor": "keep an eye on it; act if it repeats",
}
RANK = {action: i for i, action in enumerate(ACTIONS)}

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+)\b", re.ASCII)
_SXID = re.compile(
    r"(nvidia-nvswitch\d*): SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)\b(?:, ?(.*))?", re.ASCII
)
_FALLEN_START = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f:.]+)\s*$")
_RECOVERY = re.compile(r"recovery action changed from .*? to (0x[0-9A-Fa-f]+|\d+)", re.ASCII)
_AFTER = re.compile(r"caused by previous Xid (\d+)", re.ASCII)
_DENIED = re.compile(r"read kernel buffer failed|Operation not permitted|Permission denied")
_EVIDENCE = 240


@dataclasses.dataclass
class Event:
    """All the lines of one Xid (or SXid) on one device."""

    kind: str  # "Xid" | "SXid"
    device: str  # the PCI address as the driver printed it
    number: int
    first: str  # the first line, for evidence
    count: int = 0
    fatal: bool = False  # SXid: a line of the group says "Fatal"
    recovery: int | None = None  # Xid 154: the recovery code of the last line
    after: set[int] = dataclasses.field(default_factory=set)  # "caused by previous Xid N"


_PROBE_HEAD = re.compile(r"# dscluster doctor: \d+ of (\d+) lines of ")


def parse(text: str) -> list[Event]:
    """Every Xid and SXid in a kernel log, grouped by device and number, in order of first
    appearance. Raises Unreadable for binary data or a truncated Xid line."""
    if "\x00" in text or _controls(text) > max(8, len(text) // 100):
        raise Unreadable(f"{FILE}: binary data, not a kernel log")
    events: dict[tuple[str, str, int], Event] = {}
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if (match := _XID.search(line)) is not None:
            device, number = match.group(1), int(match.group(2))
            event = _event(events, "Xid", device, number, line)
            event.after.update(int(n) for n in _AFTER.findall(line))
            if number == 154 and (code := _RECOVERY.search(line)) is not None:
                value = code.group(1)
                event.recovery = int(value, 16) if value.startswith("0x") else int(value)
        elif "NVRM: Xid (" in line:
            raise Unreadable(f"{FILE}: truncated Xid line {index + 1}: {line.strip()[:80]!r}")
        elif (match := _SXID.search(line)) is not None:
            event = _event(events, "SXid", match.group(2), int(match.group(3)), line)
            rest = (match.group(4) or "").lower()
            event.fatal = event.fatal or rest.startswith("fatal")
        elif (match := _FALLEN_START.search(line)) is not None:
            # Newer drivers say it over three lines without an Xid; it is Xid 79 all the same.
            tail = " ".join(lines[index + 1 : index + 3])
            if "fallen off the bus" in tail:
                _event(events, "Xid", match.group(1), 79, line)
    return list(events.values())


def judge_xid(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """One finding per (device, Xid) seen since boot, most drastic action first; one pass
    finding when the log has none."""
    text = outputs.text(FILE)
    if text is None:
        return [outputs.skip(FILE)]
    if not text.strip():
        return [
            Finding(
                "skip",
                f"{FILE} is empty: the kernel log could not be read "
                "(containers often cannot read dmesg)",
            )
        ]
    events = parse(text)
    if not events and _DENIED.search(text) and len(text.splitlines()) <= 3:
        return [Finding("skip", f"the kernel log could not be read: {text.strip()[:_EVIDENCE]}")]
    if not events:
        # The probe keeps only the lines a judge reads and says how many it read on its first line.
        head = _PROBE_HEAD.match(text)
        lines = int(head.group(1)) if head else len(text.splitlines())
        return [Finding("pass", f"no Xid or SXid in the kernel log ({lines} lines since boot)")]
    findings = [_finding(event) for event in events]
    return sorted(findings, key=lambda f: (RANK.get(f.action, len(RANK)), f.detail))


def _event(events: dict, kind: str, device: str, number: int, line: str) -> Event:
    key = (kind, _normal(device), number)
    event = events.get(key)
    if event is None:
        event = events[key] = Event(kind, device, number, line.strip()[:_EVIDENCE])
    event.count += 1
    return event


def _finding(event: Event) -> Finding:
    times = "once" if event.count == 1 else f"{event.count} times"
    if event.kind == "SXid":
        where = f"NVSwitch {event.device}"
        if event.fatal:
            detail = f"{where}: fatal SXid {event.number}, seen {times} since boot"
            fix = (
                "drain the node and reboot it: a fatal NVSwitch error needs the GPUs and "
                "NVSwitches reset together"
            )
            return Finding("fail", detail, "reboot", fix, event.first)
        detail = f"{where}: SXid {event.number} (non-fatal or unclassified), seen {times}"
        fix = "keep an eye on it; look the SXid up in NVIDIA's Xid catalogue if it repeats"
        return Finding("warn", detail, "monitor", fix, event.first)
    where = f"GPU {event.device}"
    known = XIDS.get(event.number)
    if known is None:
        detail = f"{where}: Xid {event.number} (not in dscluster's table), seen {times}"
        fix = f"look Xid {event.number} up in NVIDIA's Xid catalogue; keep an eye on the GPU"
        return Finding("warn", detail, "monitor", fix, event.first)
    what, action, app = known
    if event.number == 154 and event.recovery is not None:
        action = RECOVERY.get(event.recovery, "reset")
    cause = ", caused by the application, not the node" if app else ""
    if event.after:
        earlier = ", ".join(f"Xid {n}" for n in sorted(event.after))
        cause = f", which the driver blames on an earlier {earlier}"
    detail = f"{where}: Xid {event.number} ({what}{cause}), seen {times} since boot"
    status = "warn" if action == "monitor" else "fail"
    fix = FIXES[action].format(dev=event.device)
    if event.after:
        fix = f"look for the earlier {earlier} on this GPU and act on that one"
    elif app:
        fix = (
            "nothing to do on the node; check the application's own error, and act if it "
            "repeats across jobs"
        )
    return Finding(status, detail, action, fix, event.first)


def _normal(device: str) -> str:
    """`0000:B3:00.0` and `0000:b3:00` are the same GPU (the Xid line drops the function)."""
    device = device.lower()
    return device[:-2] if re.search(r"\.\d$", device) else device


def _controls(text: str) -> int:
    # ESC is allowed: `dmesg --color=always` colours the lines.
    return sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f\v\x1b")

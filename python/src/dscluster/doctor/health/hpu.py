"""Intel Gaudi HPUs from `hl-smi -q` ("hl-smi-q.txt").

hl-smi prints a header (`Attached AIPs : 8`) and one block per device,
`[0] AIP (accel0) 0000:43:00.0`, of indented `Key : value` lines under section names
(PCI, Clocks Throttle Reasons, Temperature, Replaced Rows, ...); a key too long for its
column carries its value on the next line, `: Not Active`. The Habana documentation
(https://docs.habana.ai, "System Management Interface Tool (hl-smi)") lists the sections.
The output carries no temperature limit and no port state (only the ports' MAC addresses),
so heat is judged by the device's own thermal-slowdown flag and ports are not judged here.
"""

from __future__ import annotations

import dataclasses
import re

from . import Expect, Finding, NodeOutputs, Unreadable

FILE = "hl-smi-q.txt"
_BLOCK = re.compile(r"^\[(\d+)\] AIP \(([^)]*)\) (\S+)\s*$", re.ASCII)
_LINE = re.compile(r"^(\s*)([^:]*?)\s*:\s?(.*?)\s*$")
_INDEX = re.compile(r"^\[\s*\d+\]\s*")
_TEMP = re.compile(r"^(-?\d+)\s*C$", re.ASCII)


@dataclasses.dataclass
class Device:
    index: int
    name: str  # accel0
    bus_id: str
    header: str  # the block's first line, for evidence
    fields: dict[str, str] = dataclasses.field(default_factory=dict)  # "Section/Key" -> value

    def get(self, key: str) -> str:
        return self.fields.get(key, "")

    def under(self, section: str) -> dict[str, str]:
        prefix = section + "/"
        return {k[len(prefix) :]: v for k, v in self.fields.items() if k.startswith(prefix)}


def parse(text: str) -> tuple[int | None, list[Device]]:
    """(the header's `Attached AIPs`, one Device per block)."""
    if "HL-SMI LOG" not in text:
        raise Unreadable(f"{FILE}: no 'HL-SMI LOG' header: not hl-smi -q output")
    attached: int | None = None
    devices: list[Device] = []
    block: _Block | None = None
    for line in text.splitlines():
        if not line.strip() or "HL-SMI LOG" in line:
            continue
        if (start := _BLOCK.match(line)) is not None:
            index, name, bus = start.groups()
            block = _Block(Device(int(index), name, bus, line.strip()))
            devices.append(block.device)
        elif block is not None:
            block.feed(line)
        elif (match := _LINE.match(line)) is not None and match.group(2) == "Attached AIPs":
            value = match.group(3).strip()
            attached = int(value) if value.isdecimal() else None
    last = text.rstrip().splitlines()[-1].strip() if text.strip() else ""
    if devices and ":" not in last:
        raise Unreadable(f"{FILE}: ends after {last[:60]!r} with no value (truncated?)")
    if not devices and attached != 0:
        raise Unreadable(f"{FILE}: no AIP blocks")
    for device in devices:
        if not device.get("Product Name"):
            raise Unreadable(f"{FILE}: {device.name} has no Product Name (truncated?)")
    return attached, devices


class _Block:
    """Reads one device's indented lines into Device.fields ("Section/Key" -> value)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.stack: list[tuple[int, str]] = []  # open sections: (indent, name)
        self.bare = ""  # the last key printed without a value; it may follow on the next line

    def feed(self, line: str) -> None:
        indent = len(line) - len(line.lstrip())
        match = _LINE.match(line)
        if match is None:  # a section name, or a key whose value is on the next line
            self._close(indent)
            self.stack.append((indent, _INDEX.sub("", line.strip())))
            self.bare = "/".join(name for _, name in self.stack)
            return
        key, value = _INDEX.sub("", match.group(2)), match.group(3).strip()
        if not key:  # ": Not Active" under a bare key
            if self.bare:
                self.device.fields[self.bare] = value
        else:
            self._close(indent)
            self.device.fields["/".join([*(name for _, name in self.stack), key])] = value
        self.bare = ""

    def _close(self, indent: int) -> None:
        while self.stack and self.stack[-1][0] >= indent:
            self.stack.pop()


def judge_hpu_count(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """The HPUs hl-smi describes against the inventory's count; nothing on a non-Gaudi node."""
    if expect.accelerator != "gaudi":
        return []
    text = outputs.text(FILE)
    if text is None:
        return [outputs.skip(FILE)]
    attached, devices = parse(text)
    seen = len(devices)
    driver = f" (the driver reports {attached} attached)" if attached is not None else ""
    evidence = "; ".join(d.header for d in devices)[:240] or f"Attached AIPs : {attached}"
    if expect.devices is not None and seen < expect.devices:
        detail = f"Gaudi: hl-smi describes {seen} of {expect.devices} expected HPUs{driver}"
        fix = (
            "take the node out: an HPU is missing; check `hl-smi -L` and the habanalabs "
            "driver's kernel messages, reboot, and replace the node if it stays missing"
        )
        return [Finding("fail", detail, "isolate", fix, evidence)]
    want = f" (expected {expect.devices})" if expect.devices is not None else ""
    return [Finding("pass", f"Gaudi: {seen} HPU(s) described by hl-smi{want}{driver}")]


def judge_hpu(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """Per HPU: module status, active throttling, pending row replacements and double-bit
    ECC rows. One pass finding (with the hottest sensor) when none is wrong."""
    text = outputs.text(FILE)
    if text is None:
        return [outputs.skip(FILE)]
    _, devices = parse(text)
    findings: list[Finding] = []
    for device in devices:
        findings += _judge_device(device)
    if findings:
        return findings
    hottest = max((t for d in devices for t in _temperatures(d)), default=None)
    heat = f"; hottest sensor {hottest[0]} C ({hottest[1]}, {hottest[2]})" if hottest else ""
    return [
        Finding(
            "pass",
            f"{len(devices)} HPU(s): operational, not throttled, no pending row replacement{heat}",
        )
    ]


def _judge_device(device: Device) -> list[Finding]:
    where = f"HPU {device.index} ({device.name}, {device.bus_id})"
    findings = []
    status = device.get("Module status")
    if status and status.lower() != "operational":
        findings.append(
            Finding(
                "fail",
                f"{where}: module status {status!r}",
                "isolate",
                "take the node out and check the HPU with hl-smi and the habanalabs driver's log",
                f"Module status : {status}",
            )
        )
    rows = device.under("Replaced Rows")
    double = rows.get("Double Bit ECC", "0")
    if rows.get("Pending", "").lower() == "yes":
        findings.append(
            Finding(
                "fail",
                f"{where}: a row replacement is pending ({double} double-bit ECC row(s))",
                "reset",
                f"drain the HPU and reset it (hl-smi -r -i {device.bus_id}) or reboot the "
                "node, so the replacement takes effect",
                f"Replaced Rows: Pending : Yes, Double Bit ECC : {double}",
            )
        )
    elif double.isdecimal() and int(double) > 0:
        findings.append(
            Finding(
                "warn",
                f"{where}: {double} row(s) replaced after double-bit ECC errors",
                "monitor",
                "keep an eye on it; replace the HPU if the count keeps growing",
                f"Replaced Rows: Double Bit ECC : {double}",
            )
        )
    for reason, value in device.under("Clocks Throttle Reasons").items():
        if value.strip().lower() == "active":
            what = reason.rsplit("/", 1)[-1]
            fix = (
                "check the node's cooling (fans, inlet temperature, airflow)"
                if "Thermal" in what
                else "check the node's power supply and the HPU's power limit"
            )
            findings.append(
                Finding(
                    "warn",
                    f"{where}: clocks throttled ({what})",
                    "monitor",
                    fix,
                    f"Clocks Throttle Reasons: {what} : {value}",
                )
            )
    return findings


def _temperatures(device: Device) -> list[tuple[int, str, str]]:
    out = []
    for sensor, value in device.under("Temperature").items():
        if (match := _TEMP.match(value)) is not None:
            out.append((int(match.group(1)), sensor, device.name))
    return out

"""The node's RDMA fabric: EFA devices from `fi_info -p efa` ("fi_info-efa.txt") and the
InfiniBand / RoCE ports from `ibv_devinfo` ("ibv_devinfo.txt").

`fi_info -p efa` prints one entry per (fabric, domain, endpoint type): each EFA device shows
up as `<dev>-rdm` and `<dev>-dgrm`, and on libfabric >= 2.0 once more under the `efa-direct`
fabric, so devices are counted as distinct domain names with that suffix removed (the rule
of roles/efa/files/efa_fi_info.py, which counts them on the node at install time). A host
without EFA prints `fi_getinfo: -61 (No data available)`: zero devices, not an error.
"""

from __future__ import annotations

import dataclasses
import re

from . import Expect, Finding, NodeOutputs, Unreadable

FI_INFO = "fi_info-efa.txt"
IBV = "ibv_devinfo.txt"

_FIELD = re.compile(r"^\s*(provider|fabric|domain|type|protocol|version)\s*:\s*(\S.*?)\s*$")
_SUFFIX = re.compile(r"-(rdm|dgrm)$")
_NO_EFA = re.compile(r"fi_getinfo:\s*-61\b")
_IBV_FIELD = re.compile(r"^\s*([a-z_]+):\s*(.*?)\s*$")
_NO_IB = re.compile(r"No IB devices found", re.IGNORECASE)
RDMA_LAYERS = ("InfiniBand", "Ethernet")


def parse_fi_info(text: str) -> list[str]:
    """The distinct EFA device names in `fi_info -p efa` output (sorted)."""
    if _NO_EFA.search(text):
        return []
    domains: set[str] = set()
    entries = 0
    provider: str | None = None
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue  # fi_info never prints "#"; recorded files may carry a note
        match = _FIELD.match(line)
        if match is None:
            raise Unreadable(f"{FI_INFO}: not fi_info output: {line.strip()[:80]!r}")
        key, value = match.groups()
        if key == "provider":
            if provider is not None:
                raise Unreadable(f"{FI_INFO}: entry {entries} has no domain (truncated?)")
            provider, entries = value, entries + 1
        elif key == "domain" and provider is not None:
            if provider.split(";", 1)[0] == "efa":  # older releases: "efa;ofi_rxd"
                domains.add(value)
            provider = None
    if provider is not None:
        raise Unreadable(f"{FI_INFO}: entry {entries} has no domain (truncated?)")
    if not entries:
        raise Unreadable(f"{FI_INFO}: no provider entries and no fi_getinfo error")
    return sorted({_SUFFIX.sub("", d) for d in domains})


@dataclasses.dataclass(frozen=True)
class Port:
    device: str  # hca_id
    port: int
    state: str  # PORT_ACTIVE, PORT_DOWN, PORT_INIT, ...
    link_layer: str  # InfiniBand | Ethernet | Unspecified (EFA)
    active_mtu: str = ""
    evidence: str = ""


def parse_ibv_devinfo(text: str) -> list[Port]:
    """Every port of every device in `ibv_devinfo` output, in order."""
    if _NO_IB.search(text):
        return []
    blocks: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.splitlines():
        match = _IBV_FIELD.match(line)
        if match is None:
            continue  # blank, or the values of a multi-line field (device_cap_flags with -v)
        key, value = match.groups()
        if key == "hca_id":
            blocks.append((value, []))
        elif not blocks:
            raise Unreadable(f"{IBV}: not ibv_devinfo output (no hca_id before {key!r})")
        else:
            blocks[-1][1].append((key, value))
    if not blocks:
        raise Unreadable(f"{IBV}: no hca_id and no 'No IB devices found'")
    return [port for device, fields in blocks for port in _ports(device, fields)]


def _ports(device: str, fields: list[tuple[str, str]]) -> list[Port]:
    expected = 0
    raw: list[dict[str, str]] = []
    for key, value in fields:
        if key == "phys_port_cnt":
            expected = int(value) if value.isdecimal() else 0
        elif key == "port":
            raw.append({"port": value})
        elif raw and key in ("state", "link_layer", "active_mtu"):
            raw[-1][key] = value
    if len(raw) < expected:
        raise Unreadable(
            f"{IBV}: {device} has {expected} port(s) but {len(raw)} were printed (truncated?)"
        )
    return [_port(device, port) for port in raw]


def _port(device: str, port: dict[str, str]) -> Port:
    missing = [k for k in ("state", "link_layer") if k not in port]
    if missing:
        raise Unreadable(f"{IBV}: {device} port {port['port']} has no {missing[0]} (truncated?)")
    number = int(port["port"]) if port["port"].isdecimal() else 0
    state = (port["state"].split() or ["?"])[0]
    evidence = (
        f"hca_id: {device} port: {port['port']} state: {port['state']} "
        f"link_layer: {port['link_layer']}"
    )
    return Port(device, number, state, port["link_layer"], port.get("active_mtu", ""), evidence)


def judge_fabric(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """EFA devices against the instance type's count; IB/RoCE ports that are not active."""
    fi_text, ibv_text = outputs.text(FI_INFO), outputs.text(IBV)
    if fi_text is None and expect.efa:
        # EFA interfaces are attached, but libfabric lists none (or is not installed).
        of = f" ({expect.instance_type})" if expect.instance_type else ""
        detail = f"EFA: 0 of {expect.efa} expected devices{of}: {outputs.why_missing(FI_INFO)}"
        fix = (
            "run 'dscluster provision' (the efa role installs libfabric); if fi_info -p efa "
            "still lists no device, take the node out and replace the instance"
        )
        return [Finding("fail", detail, "isolate", fix)]
    if fi_text is None and ibv_text is None:
        reason = f"{outputs.why_missing(FI_INFO)}; {outputs.why_missing(IBV)}"
        return [Finding("skip", f"no fabric tools' output: {reason}")]
    findings: list[Finding] = []
    summary: list[str] = []
    if fi_text is not None:
        findings += _judge_efa(parse_fi_info(fi_text), expect, summary)
    if ibv_text is not None:
        findings += _judge_ports(parse_ibv_devinfo(ibv_text), summary)
    if any(f.status in ("warn", "fail") for f in findings):
        return findings
    return [*findings, Finding("pass", "; ".join(summary))]


def _judge_efa(names: list[str], expect: Expect, summary: list[str]) -> list[Finding]:
    shown = ", ".join(names) if names else "none"
    if expect.efa is not None and len(names) < expect.efa:
        of = f" ({expect.instance_type})" if expect.instance_type else ""
        detail = f"EFA: {len(names)} of {expect.efa} expected devices{of} seen by libfabric"
        fix = (
            "take the node out: an EFA device is missing; check `fi_info -p efa` and the "
            "instance's network interfaces, and replace the instance if it stays missing"
        )
        return [Finding("fail", detail, "isolate", fix, f"fi_info -p efa devices: {shown}")]
    want = f" (expected {expect.efa})" if expect.efa is not None else ""
    summary.append(f"EFA: {len(names)} device(s){want}: {shown}")
    return []


def _judge_ports(ports: list[Port], summary: list[str]) -> list[Finding]:
    rdma = [p for p in ports if p.link_layer in RDMA_LAYERS]
    active = [p for p in rdma if p.state == "PORT_ACTIVE"]
    idle = [p for p in rdma if p.state != "PORT_ACTIVE"]
    if not rdma:
        summary.append(f"ibv_devinfo: {len(ports)} port(s), none InfiniBand or RoCE")
        return []
    if not idle:
        layers = sorted({p.link_layer for p in active})
        summary.append(f"{len(active)} RDMA port(s) active ({', '.join(layers)})")
        return []
    findings = []
    for p in idle:
        what = "InfiniBand" if p.link_layer == "InfiniBand" else "RoCE (Ethernet)"
        name = f"{p.device} port {p.port}"
        if p.state == "PORT_INIT" and p.link_layer == "InfiniBand":
            cause = "no subnet manager has brought it up (check opensm / UFM on the fabric)"
        else:
            cause = "check the cable, the switch port and `ip link` of its interface"
        if not active:
            detail = f"{what} {name} is {p.state} and no RDMA port on the node is active"
            fix = f"take the node out: it is off the RDMA fabric; {cause}"
            findings.append(Finding("fail", detail, "isolate", fix, p.evidence))
            continue
        detail = f"{what} {name} is {p.state} while {len(active)} other port(s) are active"
        # An InfiniBand port is there for the fabric: a rail is missing. An Ethernet RDMA port
        # may be a NIC the jobs never use.
        action = "isolate" if p.link_layer == "InfiniBand" else "monitor"
        fix = (
            f"take the node out until the rail is back: {cause}"
            if action == "isolate"
            else f"if the jobs use {p.device}, {cause}"
        )
        findings.append(Finding("fail" if action == "isolate" else "warn", detail, action, fix,
                                p.evidence))  # fmt: skip
    return findings

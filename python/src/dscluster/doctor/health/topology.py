"""`nvidia-smi topo -m` (which NIC is near which GPU, and each GPU's NUMA node) and
`lspci -vvv` (PCIe switch ports whose Access Control Services redirect peer-to-peer traffic).

topo -m prints a tab-separated matrix: a header row of device columns (GPU0.., NIC0.. or
mlx5_0..) then "CPU Affinity", "NUMA Affinity" (and "GPU NUMA ID"); one row per device
whose cells are X, NV#, PIX, PXB, PHB, NODE or SYS; a legend; with NIC columns a
"NIC Legend" naming each NICn. lspci -vvv prints one block per function, the header
unindented ("3b:00.0 PCI bridge: ..."), its details indented, bridges with a
"Bus: primary=.., secondary=.., subordinate=.." line and, under "Access Control Services",
"ACSCtl:" with each control bit followed by + or -.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from . import Expect, Finding, NodeOutputs, Unreadable

TOPO = "nvidia-smi-topo.txt"
LSPCI = "lspci-vvv.txt"

# Nearest first; NV# (NVLink) never appears between a GPU and a NIC.
_LEVELS = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")
_CELL = re.compile(r"^(X|PIX|PXB|PHB|NODE|SYS|NV\d+|N/A)$")
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")


@dataclasses.dataclass(frozen=True)
class Topology:
    devices: tuple[str, ...]  # column names in order: GPU0.., NIC0.. or mlx5_0..
    cells: dict[tuple[str, str], str]  # (row, column) -> PIX ...
    numa: dict[str, str]  # GPU -> its "NUMA Affinity" ("0", "0-1", "N/A")
    nic_names: dict[str, str]  # NIC0 -> mlx5_1 (from the NIC Legend)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if re.fullmatch(r"GPU\d+", d)]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if not re.fullmatch(r"GPU\d+", d)]

    def nic(self, column: str) -> str:
        return self.nic_names.get(column, column)


def parse_topo(text: str, name: str = TOPO) -> Topology:
    lines = text.splitlines()
    start = next(
        (i for i, ln in enumerate(lines) if "\t" in ln and ln.split("\t")[0].strip() == ""
         and "GPU0" in ln.split("\t")),
        None,
    )  # fmt: skip
    if start is None:
        raise Unreadable(f"{name}: no matrix header (a tab-separated line starting GPU0)")
    header = [c.strip() for c in lines[start].split("\t")[1:]]
    devices = tuple(c for c in header if c and c not in _TRAILING)
    labels = set(devices)
    cells: dict[tuple[str, str], str] = {}
    numa: dict[str, str] = {}
    rows: set[str] = set()
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if not line.strip() or line.strip().startswith("Legend"):
            break
        fields = line.split("\t")
        row = fields[0].strip()
        if row not in labels or len(fields) < len(devices) + 1:
            raise Unreadable(f"{name}: line {number} is not a matrix row: {line.strip()[:60]!r}")
        for column, value in zip(devices, fields[1 : len(devices) + 1], strict=True):
            if not _CELL.match(value.strip()):
                raise Unreadable(f"{name}: line {number}: {row}/{column} is {value.strip()[:20]!r}")
            cells[(row, column)] = value.strip()
        rest = [f.strip() for f in fields[len(devices) + 1 :]]
        if row.startswith("GPU") and len(rest) >= 2:
            numa[row] = rest[1]
        rows.add(row)
    if len(rows) < len(labels):
        raise Unreadable(f"{name}: {len(rows)} matrix rows for {len(labels)} devices (truncated)")
    nic_names = {m.group(1): m.group(2) for ln in lines if (m := _NIC_LEGEND.match(ln))}
    return Topology(devices, cells, numa, nic_names)


@dataclasses.dataclass(frozen=True)
class PciFunction:
    address: str  # "3b:00.0" or "0000:3b:00.0" as lspci printed it
    kind: str  # "PCI bridge", "3D controller", "Infiniband controller" ...
    description: str
    bus: int
    port: str = ""  # "Root Port", "Downstream Port", "Upstream Port" for Express bridges
    secondary: int | None = None
    subordinate: int | None = None
    acs: tuple[tuple[str, bool], ...] = ()  # ACSCtl bits
    denied: bool = False  # "Capabilities: <access denied>": lspci ran without root

    @property
    def redirects(self) -> list[str]:
        return [bit for bit, on in self.acs if on and bit in _REDIRECT]


# The ACS controls that send peer-to-peer requests and completions up to the root complex
# (or block them) instead of across the switch: PCIe base specification, "ACS P2P Request
# Redirect", "ACS P2P Completion Redirect", "ACS P2P Egress Control". Source validation
# alone checks requester IDs and does not reroute.
_REDIRECT = ("ReqRedir", "CmpltRedir", "EgressCtrl")
_HEADER = re.compile(r"^(?:[0-9a-fA-F]{4}:)?([0-9a-fA-F]{2}):[0-9a-fA-F]{2}\.[0-7] ([^:]+): (.*)$")
_BUS = re.compile(
    r"Bus: primary=([0-9a-fA-F]+), secondary=([0-9a-fA-F]+), subordinate=([0-9a-fA-F]+)"
)
_PORT = re.compile(r"Express \(v\d\) (Root Port|Downstream Port|Upstream Port)")
_BIT = re.compile(r"(\w+)([+-])")
_TARGETS = ("3D controller", "VGA compatible controller", "Infiniband controller",
            "Ethernet controller", "Network controller")  # fmt: skip


def parse_lspci(text: str, name: str = LSPCI) -> list[PciFunction]:
    functions: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not line[0].isspace():
            m = _HEADER.match(line)
            if not m:
                raise Unreadable(f"{name}: line {number} is not a device line: {line[:60]!r}")
            functions.append(
                {"address": line.split(" ", 1)[0],
                 "kind": re.sub(r" \[[0-9a-fA-F]{4}\]$", "", m.group(2)),
                 "description": m.group(3),
                 "bus": int(m.group(1), 16)}
            )  # fmt: skip
            continue
        if not functions:
            raise Unreadable(f"{name}: line {number} comes before any device line")
        current = functions[-1]
        stripped = line.strip()
        if bus := _BUS.search(stripped):
            current["secondary"] = int(bus.group(2), 16)
            current["subordinate"] = int(bus.group(3), 16)
        elif stripped.startswith("ACSCtl:"):
            current["acs"] = tuple((b, s == "+") for b, s in _BIT.findall(stripped[7:]))
        elif stripped == "Capabilities: <access denied>":
            current["denied"] = True
        elif port := _PORT.search(stripped):
            current["port"] = port.group(1)
    if not functions:
        raise Unreadable(f"{name}: no PCI device listed")
    return [PciFunction(**f) for f in functions]


def _acs_findings(functions: list[PciFunction]) -> list[Finding]:
    targets = [f for f in functions if f.kind in _TARGETS]
    findings = []
    for bridge in functions:
        # Root ports are left out: traffic between two root ports crosses the root complex
        # whatever ACS says; the hangs and slow P2P NCCL documents come from switch ports.
        if not bridge.redirects or bridge.port == "Root Port" or bridge.secondary is None:
            continue
        below = [
            t for t in targets
            if bridge.secondary <= t.bus <= (bridge.subordinate or bridge.secondary)
        ]  # fmt: skip
        if below:
            findings.append(
                Finding(
                    "fail",
                    f"PCIe switch port {bridge.address} redirects peer-to-peer traffic (ACS "
                    f"{', '.join(bridge.redirects)}) above "
                    + ", ".join(f"{t.address} ({t.kind})" for t in below),
                    "reboot",
                    "Disable ACS in the BIOS (or with setpci at boot) and reboot: NCCL docs, "
                    "Troubleshooting, 'PCI Access Control Services (ACS)'",
                    "ACSCtl: " + " ".join(f"{b}{'+' if on else '-'}" for b, on in bridge.acs),
                )
            )
    return findings


def _numa_findings(topo: Topology) -> list[Finding]:
    if not topo.nics:
        return []

    def nearest(gpu: str) -> tuple[int, str]:
        return min(
            (_LEVELS.index(topo.cells[(gpu, n)]) if topo.cells[(gpu, n)] in _LEVELS else 99, n)
            for n in topo.nics
        )

    near = {g: nearest(g) for g in topo.gpus}
    local = [g for g, (level, _) in near.items() if level < _LEVELS.index("SYS")]
    if not local:
        return []
    findings = []
    for gpu, (level, nic) in near.items():
        if level >= _LEVELS.index("SYS"):
            findings.append(
                Finding(
                    "warn",
                    f"{gpu} (NUMA {topo.numa.get(gpu, '?')}): no NIC on its NUMA node; the "
                    f"nearest, {topo.nic(nic)}, is across the CPU interconnect (SYS), while "
                    f"{', '.join(local)} have one on theirs",
                    "monitor",
                    "Check that every NIC is present and up (ibv_devinfo); GPUDirect RDMA for "
                    f"{gpu} crosses sockets until it is",
                    f"{gpu}: "
                    + " ".join(f"{topo.nic(n)}={topo.cells[(gpu, n)]}" for n in topo.nics),
                )
            )
    return findings


def judge_topology(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """GPU-NIC NUMA placement (nvidia-smi topo -m) and ACS redirect above GPUs/NICs (lspci)."""
    findings: list[Finding] = []
    summary: list[str] = []
    topo_text = outputs.text(TOPO)
    if topo_text is None:
        findings.append(outputs.skip(TOPO))
    else:
        topo = parse_topo(topo_text)
        numa = _numa_findings(topo)
        findings += numa
        if not numa:
            summary.append(
                f"{len(topo.gpus)} GPUs each with a NIC on their NUMA node"
                if topo.nics
                else f"{len(topo.gpus)} GPUs, no NIC in the matrix"
            )
    lspci_text = outputs.text(LSPCI)
    if lspci_text is None:
        findings.append(outputs.skip(LSPCI))
    else:
        functions = parse_lspci(lspci_text)
        if any(f.denied for f in functions) and not any(f.acs for f in functions):
            findings.append(
                Finding("skip", "lspci ran without root: capabilities (ACS) not readable")
            )
        else:
            acs = _acs_findings(functions)
            findings += acs
            if not acs:
                summary.append("no PCIe switch port redirects P2P above a GPU or NIC")
    if summary:
        findings.insert(0, Finding("pass", "; ".join(summary)))
    return findings

"""`nvidia-smi nvlink -s` (link state and speed) and `nvidia-smi nvlink -e` (error counters).

Both list GPU blocks, a header `GPU 0: <product> (UUID: GPU-...)` and one indented line per
link: `Link 0: 25.781 GB/s` or `Link 2: <inactive>` for -s; `Link 0: Replay Errors: 0`
(also Recovery, CRC) for -e. A GPU with NVLink hardware but no link trained prints
`NVML: Unable to retrieve NVLink information as all links are inActive` instead of links;
a GPU without NVLink prints its header alone, and a node without any prints nothing.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from . import Expect, Finding, NodeOutputs, Unreadable
from .nvidia import sxm_board

STATUS = "nvidia-smi-nvlink-s.txt"
ERRORS = "nvidia-smi-nvlink-e.txt"

_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: (\S+)\))?\s*$")
_SPEED = re.compile(r"^\s+Link (\d+): (?:(\d+(?:\.\d+)?) GB/s|<inactive>)\s*$")
_COUNTER = re.compile(r"^\s+Link (\d+): ([A-Za-z][A-Za-z ]*?): (\d+|N/A)\s*$")
_ALL_INACTIVE = "all links are inactive"


@dataclasses.dataclass(frozen=True)
class NvlinkGpu:
    index: int
    product: str
    uuid: str
    links: tuple[tuple[int, float | None], ...] = ()  # (link, GB/s); None when inactive
    all_inactive: bool = False  # NVML's "all links are inActive" message
    counters: tuple[tuple[int, str, int], ...] = ()  # (link, "CRC Errors", count)

    @property
    def name(self) -> str:
        return f"GPU {self.index}"

    @property
    def up(self) -> list[int]:
        return [n for n, speed in self.links if speed is not None]

    @property
    def down(self) -> list[int]:
        return [n for n, speed in self.links if speed is None]


def _blocks(text: str, name: str) -> list[tuple[re.Match[str], list[tuple[int, str]]]]:
    """GPU header matches, each with its following (line number, line) pairs."""
    blocks: list[tuple[re.Match[str], list[tuple[int, str]]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        header = _GPU.match(line)
        if header:
            blocks.append((header, []))
        elif not blocks:
            raise Unreadable(f"{name}: line {number} comes before any 'GPU N:' line")
        else:
            blocks[-1][1].append((number, line))
    return blocks


def _gpu(header: re.Match[str], **fields: Any) -> NvlinkGpu:
    return NvlinkGpu(int(header.group(1)), header.group(2), header.group(3) or "", **fields)


def _bad(name: str, number: int, line: str) -> Unreadable:
    return Unreadable(f"{name}: line {number} is not a link line: {line.strip()[:60]!r}")


def parse_status(text: str, name: str = STATUS) -> list[NvlinkGpu]:
    gpus = []
    for header, lines in _blocks(text, name):
        links: list[tuple[int, float | None]] = []
        all_inactive = False
        for number, line in lines:
            m = _SPEED.match(line)
            if m:
                links.append((int(m.group(1)), float(m.group(2)) if m.group(2) else None))
            elif _ALL_INACTIVE in line.lower():
                all_inactive = True
            else:
                raise _bad(name, number, line)
        gpus.append(_gpu(header, links=tuple(links), all_inactive=all_inactive))
    return gpus


def parse_errors(text: str, name: str = ERRORS) -> list[NvlinkGpu]:
    gpus = []
    for header, lines in _blocks(text, name):
        counters: list[tuple[int, str, int]] = []
        for number, line in lines:
            m = _COUNTER.match(line)
            if m:
                if m.group(3) != "N/A":
                    counters.append((int(m.group(1)), m.group(2), int(m.group(3))))
            elif _ALL_INACTIVE not in line.lower():
                raise _bad(name, number, line)
        gpus.append(_gpu(header, counters=tuple(counters)))
    return gpus


def _links(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers))


def _status_findings(gpus: list[NvlinkGpu]) -> list[Finding]:
    linked = [g for g in gpus if g.up]
    findings: list[Finding] = []
    for g in gpus:
        if g.up and g.down:
            findings.append(
                Finding(
                    "fail",
                    f"{g.name}: NVLink {_links(g.down)} inactive, {len(g.up)} of {len(g.links)} up",
                    "reset",
                    f"Reset the GPU (nvidia-smi -r -i {g.index}); if the links stay down, "
                    "drain the node and check the NVLink bridge or baseboard",
                    f"GPU {g.index}: "
                    + "; ".join(
                        f"Link {n}: {'<inactive>' if s is None else f'{s:g} GB/s'}"
                        for n, s in g.links
                    ),
                )
            )
        elif not g.up and (g.down or g.all_inactive) and linked:
            peers = ", ".join(p.name for p in linked)
            if sxm_board(g.product):
                findings.append(
                    Finding(
                        "fail",
                        f"{g.name} ({g.product}): every NVLink inactive while {peers} have "
                        "links up",
                        "reset",
                        f"Reset the GPU (nvidia-smi -r -i {g.index}) and re-check; if the links "
                        "stay down, drain the node and check the baseboard and fabric manager",
                        f"GPU {g.index}: all links inactive",
                    )
                )
            else:
                # a PCIe card: an NVLink bridge is optional, and a card without one stays so
                findings.append(
                    Finding(
                        "warn",
                        f"{g.name} ({g.product}): every NVLink inactive while {peers} have "
                        "links up",
                        "monitor",
                        "A PCIe card without an NVLink bridge by design stays like this; if it "
                        f"has one, reseat it, then reset the GPU (nvidia-smi -r -i {g.index})",
                        f"GPU {g.index}: all links inactive",
                    )
                )
    return findings


def judge_nvlink(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """NVLink state per GPU (nvidia-smi nvlink -s) and link error counters (-e)."""
    text = outputs.text(STATUS)
    if text is None:
        return [outputs.skip(STATUS)]
    gpus = parse_status(text)
    if not any(g.links or g.all_inactive for g in gpus):
        return [Finding("skip", "no NVLink on this node (nvidia-smi nvlink -s lists no links)")]
    findings = _status_findings(gpus)
    if not any(g.up for g in gpus) and len(gpus) == 1:
        return [Finding("skip", "one GPU with every NVLink inactive: no peer to link to")]
    if not any(g.up for g in gpus):
        findings.append(
            Finding(
                "warn",
                f"NVLink present but no link active on any of {len(gpus)} GPUs",
                "monitor",
                "Normal for PCIe cards without a bridge; on an SXM node check "
                "nvidia-fabricmanager and reset the GPUs",
                "all links inactive",
            )
        )
    errors_text = outputs.text(ERRORS)
    if errors_text is None:
        findings.append(outputs.skip(ERRORS))
    else:
        for g in parse_errors(errors_text):
            counted = [(n, what, c) for n, what, c in g.counters if c]
            if counted:
                findings.append(
                    Finding(
                        "warn",
                        f"{g.name}: NVLink errors on link "
                        + _links(sorted({n for n, _, _ in counted})),
                        "monitor",
                        "Watch whether the counters grow (nvidia-smi nvlink -e); rising CRC or "
                        "recovery errors mean a failing link: drain and reseat",
                        "; ".join(f"Link {n}: {what}: {c}" for n, what, c in counted),
                    )
                )
    if findings and any(f.status != "skip" for f in findings):
        return findings
    links = {len(g.links) for g in gpus if g.links}
    per_gpu = f"{links.pop()} NVLinks each" if len(links) == 1 else "all NVLinks"
    clean = "" if errors_text is None else ", no link errors"
    count = "1 GPU" if len(gpus) == 1 else f"{len(gpus)} GPUs"
    return [Finding("pass", f"{count}, {per_gpu} active{clean}"), *findings]

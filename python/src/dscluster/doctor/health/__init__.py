"""Node health checks: each family parses a vendor tool's own machine-readable output, recorded
on the node by the doctor probe (or by hand, for `doctor --replay`), and judges it.

A judge is a pure function `judge(outputs: NodeOutputs, expect: Expect) -> list[Finding]`.
It never contacts anything: the same judge runs on a live cluster's outputs and on a
directory someone sent us. A file it needs that was not recorded gives one `skip` finding
with the reason the probe gave ("nvidia-smi: not found"); a file that cannot be parsed
raises `Unreadable`, which the caller turns into one line naming the node and the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# What an admin does about a finding, most drastic first (awsome-distributed-training's
# grading): take the node out of the job, reboot it, reset one GPU, or keep an eye on it.
ACTIONS = ("isolate", "reboot", "reset", "monitor")
# The actions that take the node out of use until done: a finding with one fails, so doctor
# exits non-zero and --exclude-unhealthy leaves the node out. A warning is for monitor only.
DRASTIC = ACTIONS[:3]
# A cell's status, least to most severe: the worst of its findings wins (report.Cell).
STATUS_ORDER = {"pass": 0, "skip": 1, "warn": 2, "fail": 3}

# The files the probe records, one per command, in DIR/<host>/ for --record and --replay.
FILES: dict[str, str] = {
    "nvidia-smi-q.xml": "nvidia-smi -q -x",
    "nvidia-smi-topo.txt": "nvidia-smi topo -m",
    "nvidia-smi-nvlink-s.txt": "nvidia-smi nvlink -s",
    "nvidia-smi-nvlink-e.txt": "nvidia-smi nvlink -e",
    "lspci-vvv.txt": "lspci -vvv",
    "kernel.log": "the kernel log since boot (dmesg), the lines a judge reads",
    "fi_info-efa.txt": "fi_info -p efa",
    "ibv_devinfo.txt": "ibv_devinfo",
    "dcgmi-diag.json": "dcgmi diag -r N -j",
    "hl-smi-q.txt": "hl-smi -q",
}
# Beside the files: probe.json, {file: {"argv": [...], "rc": int, "seconds": float,
# "missing": "why it was not recorded"}}; a missing file's reason is read from there.
PROBE_INDEX = "probe.json"


class Unreadable(ValueError):
    """A recorded file that is garbage or truncated; str() names the file and what is wrong
    in one line ("nvidia-smi-q.xml: not XML (line 3, column 0: mismatched tag)")."""


@dataclasses.dataclass(frozen=True)
class Finding:
    status: str  # pass | skip | warn | fail
    detail: str  # what was seen, naming the device: "GPU 0 (00000000:1B:00.0) ..."
    action: str = ""  # one of ACTIONS for warn/fail; "" for pass/skip
    fix: str = ""  # one line the admin acts on
    evidence: str = ""  # the recorded line(s) this came from, short

    def __post_init__(self) -> None:
        if self.status not in STATUS_ORDER:
            raise ValueError(f"status {self.status!r}")
        if self.action and self.action not in ACTIONS:
            raise ValueError(f"action {self.action!r}")
        if self.status == "warn" and self.action in DRASTIC:
            raise ValueError(f"a warning's action is monitor, not {self.action}: fail instead")


@dataclasses.dataclass(frozen=True)
class NodeOutputs:
    """One node's recorded outputs: file name -> text, and why each missing one is missing."""

    host: str
    files: Mapping[str, str]
    missing: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def text(self, name: str) -> str | None:
        return self.files.get(name)

    def why_missing(self, name: str) -> str:
        return self.missing.get(name) or f"{name} was not recorded ({FILES.get(name, name)})"

    def skip(self, name: str) -> Finding:
        """The one finding of a judge whose file is absent."""
        return Finding("skip", self.why_missing(name))


@dataclasses.dataclass(frozen=True)
class Expect:
    """What the node should have, from the inventory and its recorded facts."""

    accelerator: str = "cpu"  # nvidia | gaudi | cpu (the accelerators fact's kind)
    devices: int | None = None  # GPUs/HPUs expected (dscluster_expected_slots, instance type)
    efa: int | None = None  # EFA devices expected (instance type profile)
    instance_type: str = ""

"""`nvidia-smi -q -x` (nvidia-smi-q.xml): the GPUs one node sees, and four judges over them:
how many, ECC and memory repair state, PCIe link, clock slowdowns.

The XML differs between schema versions (nvsmi_device_v10 ... v13): ECC counters moved from
`double_bit/total` to `sram_uncorrectable`/`dram_uncorrectable` and then split SRAM into
parity/SECDED; `clocks_throttle_reasons` became `clocks_event_reasons`. The parser reads
every spelling it knows and keeps what the file offers; a value nvidia-smi could not read
("N/A", "[Not Supported]") is None, never 0.

The file comes from a node, which may not be trusted: a DOCTYPE that declares anything
(an internal subset, entities) is refused before any element is built; nvidia-smi itself
writes only `<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vN.dtd">`, which expat never fetches.
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import NoReturn
from xml.parsers import expat

from . import Expect, Finding, NodeOutputs, Unreadable

FILE = "nvidia-smi-q.xml"


class _Refused(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One `<gpu>` element. `index` is its position, which is nvidia-smi's GPU index."""

    index: int
    bus_id: str
    product: str = ""
    minor: int | None = None
    serial: str = ""
    uuid: str = ""
    ecc_mode: str = ""  # Enabled | Disabled | N/A
    volatile_unc: tuple[tuple[str, int], ...] = ()  # (counter, count) where readable
    aggregate_unc: tuple[tuple[str, int], ...] = ()
    retired_pending: bool | None = None  # pre-Ampere dynamic page retirement
    remap_pending: bool | None = None  # Ampere and later row remapping
    remap_failure: bool | None = None
    recovery_action: str = ""  # v13 <gpu_recovery_action>: None | Reset | Reboot | Drain ...
    gen_current: int | None = None
    gen_max: int | None = None
    width_current: int | None = None
    width_max: int | None = None
    clock_reasons: tuple[tuple[str, bool], ...] = ()  # ("hw_slowdown", active)
    performance_state: str = ""
    gpu_util: int | None = None
    power_limit: float | None = None
    default_power_limit: float | None = None

    @property
    def name(self) -> str:
        return f"GPU {self.index} ({self.bus_id})"

    def reason(self, key: str) -> bool | None:
        return dict(self.clock_reasons).get(key)

    @property
    def busy(self) -> bool:
        """Working right now: the idle clock reason is off and the utilisation is not 0."""
        idle = self.reason("gpu_idle")
        if idle:
            return False
        if self.gpu_util is not None:
            return self.gpu_util > 0
        return idle is False


@dataclasses.dataclass(frozen=True)
class SmiLog:
    attached: int | None  # <attached_gpus>, absent in schema v10
    driver: str
    gpus: tuple[Gpu, ...]


def parse_xml(text: str, name: str, root: str) -> ET.Element:
    """The element tree of `text`, refusing DTD declarations; Unreadable names `name`."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()

    def doctype(_name: str, _sys: str | None, _pub: str | None, internal: bool) -> None:
        if internal:
            raise _Refused("a DOCTYPE with declarations (refused: entities could expand)")

    def declared(*_args: object) -> NoReturn:
        raise _Refused("an entity declaration or reference (refused)")

    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = declared
    parser.UnparsedEntityDeclHandler = declared
    parser.ExternalEntityRefHandler = declared
    parser.SkippedEntityHandler = declared  # a reference to an entity declared nowhere here
    parser.StartElementHandler = builder.start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.buffer_text = True
    try:
        parser.Parse(text.encode("utf-8"), True)
        tree = builder.close()
    except UnicodeError:
        raise Unreadable(f"{name}: not UTF-8 text") from None
    except expat.ExpatError as exc:
        what = expat.ErrorString(exc.code)
        raise Unreadable(
            f"{name}: not XML (line {exc.lineno}, column {exc.offset}: {what})"
        ) from None
    except _Refused as exc:
        raise Unreadable(f"{name}: {exc}") from None
    except AssertionError:  # TreeBuilder.close() with no element at all
        raise Unreadable(f"{name}: no XML element") from None
    if tree.tag != root:
        raise Unreadable(f"{name}: root element <{tree.tag}>, not <{root}>")
    return tree


def _text(el: ET.Element | None, path: str) -> str:
    found = el.find(path) if el is not None else None
    return (found.text or "").strip() if found is not None else ""


_NUMBER = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:x|%|W|us)?$")


def _int(value: str) -> int | None:
    m = _NUMBER.match(value)
    return int(float(m.group(1))) if m else None


def _float(value: str) -> float | None:
    m = _NUMBER.match(value)
    return float(m.group(1)) if m else None


def _yes(value: str) -> bool | None:
    return {"yes": True, "no": False}.get(value.lower())


def _uncorrectable(block: ET.Element | None) -> tuple[tuple[str, int], ...]:
    """Uncorrectable counters of a <volatile> or <aggregate> block, whatever the schema:
    `double_bit/total` (v10/v11 on older GPUs), `*uncorrectable*` (v11 and later)."""
    if block is None:
        return ()
    counts: list[tuple[str, int]] = []
    for child in block:
        if child.tag == "double_bit":
            total = _int(_text(child, "total"))
            if total is None:
                parts = [_int((c.text or "").strip()) for c in child if c.tag != "total"]
                known = [p for p in parts if p is not None]
                total = sum(known) if known else None
            if total is not None:
                counts.append(("double_bit", total))
        elif "uncorrectable" in child.tag:
            value = _int((child.text or "").strip())
            if value is not None:
                counts.append((child.tag, value))
    return tuple(counts)


def _clock_reasons(gpu: ET.Element) -> tuple[tuple[str, bool], ...]:
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = gpu.find(block)
        if el is not None:
            return tuple(
                (c.tag.removeprefix(prefix), (c.text or "").strip() == "Active")
                for c in el
                if (c.text or "").strip() in ("Active", "Not Active")
            )
    return ()


def _gpu(index: int, el: ET.Element, name: str) -> Gpu:
    bus_id = el.get("id") or _text(el, "pci/pci_bus_id")
    if not bus_id:
        raise Unreadable(f"{name}: <gpu> number {index} has no PCI bus id")
    link = el.find("pci/pci_gpu_link_info")
    power = el.find("gpu_power_readings")
    if power is None:
        power = el.find("power_readings")
    limit = _text(power, "current_power_limit") or _text(power, "power_limit")
    retired = _text(el, "retired_pages/pending_retirement")
    if not retired or retired == "N/A":
        retired = _text(el, "retired_pages/pending_blacklist")
    return Gpu(
        index=index,
        bus_id=bus_id,
        product=_text(el, "product_name"),
        minor=_int(_text(el, "minor_number")),
        serial=_text(el, "serial"),
        uuid=_text(el, "uuid"),
        ecc_mode=_text(el, "ecc_mode/current_ecc"),
        volatile_unc=_uncorrectable(el.find("ecc_errors/volatile")),
        aggregate_unc=_uncorrectable(el.find("ecc_errors/aggregate")),
        retired_pending=_yes(retired),
        remap_pending=_yes(_text(el, "remapped_rows/remapped_row_pending")),
        remap_failure=_yes(_text(el, "remapped_rows/remapped_row_failure")),
        recovery_action=_text(el, "gpu_recovery_action"),
        gen_current=_int(_text(link, "pcie_gen/current_link_gen")),
        gen_max=_int(_text(link, "pcie_gen/max_link_gen")),
        width_current=_int(_text(link, "link_widths/current_link_width")),
        width_max=_int(_text(link, "link_widths/max_link_width")),
        clock_reasons=_clock_reasons(el),
        performance_state=_text(el, "performance_state"),
        gpu_util=_int(_text(el, "utilization/gpu_util")),
        power_limit=_float(limit),
        default_power_limit=_float(_text(power, "default_power_limit")),
    )


def parse(text: str, name: str = FILE) -> SmiLog:
    """The GPUs of one `nvidia-smi -q -x` run; Unreadable when it is not that output."""
    root = parse_xml(text, name, "nvidia_smi_log")
    attached_text = _text(root, "attached_gpus")
    attached = _int(attached_text) if attached_text else None
    if attached_text and attached is None:
        raise Unreadable(f"{name}: <attached_gpus> is {attached_text[:40]!r}, not a number")
    gpus = tuple(_gpu(i, el, name) for i, el in enumerate(root.findall("gpu")))
    return SmiLog(attached=attached, driver=_text(root, "driver_version"), gpus=gpus)


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _bus_ids(log: SmiLog) -> str:
    return ", ".join(g.bus_id for g in log.gpus) or "none"


def judge_gpu_count(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """GPUs nvidia-smi reports against the GPUs the node should have (expect.devices)."""
    if expect.accelerator != "nvidia":
        return [Finding("skip", f"not an NVIDIA node (accelerator {expect.accelerator!r})")]
    text = outputs.text(FILE)
    if text is None:
        return [outputs.skip(FILE)]
    return [_count_finding(parse(text), expect.devices)]


_LOST_FIX = (
    "Drain the node, look for Xid 79 ('fallen off the bus') in the kernel log and the "
    "missing device in lspci, then reboot; if it stays missing, reseat or replace it"
)


def _count_finding(log: SmiLog, expected: int | None) -> Finding:
    seen = len(log.gpus)
    evidence = f"<attached_gpus>{log.attached}</attached_gpus>, {seen} <gpu>: {_bus_ids(log)}"
    if log.attached is not None and log.attached > seen:
        return Finding(
            "fail",
            f"nvidia-smi counts {log.attached} attached GPUs but reports only {seen}: "
            f"{log.attached - seen} cannot be read",
            "isolate",
            _LOST_FIX,
            evidence,
        )
    if expected is None:
        return Finding("pass", f"{_gpus(seen)} (no expected count to compare with)")
    if seen < expected:
        return Finding(
            "fail",
            f"{seen} of {expected} expected GPUs seen: {expected - seen} missing",
            "isolate",
            _LOST_FIX,
            evidence,
        )
    if seen > expected:
        return Finding(
            "warn",
            f"{_gpus(seen)} seen, {expected} expected",
            "monitor",
            "Correct the expected count (dscluster_expected_slots or the instance type)",
            evidence,
        )
    return Finding("pass", f"{_gpus(seen)}, as expected")


def _counts(counts: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts if v)


# What to do about memory errors follows NVIDIA's GPU memory error management guide
# (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/, "Error Recovery and Response Flags" and
# "RMA Policy Thresholds"): a row-remapping failure is an RMA condition (isolate); a pending
# remap takes effect at the next GPU reset (reset); <gpu_recovery_action> names the action
# itself. Before Ampere, dynamic page retirement (docs.nvidia.com/deploy/dynamic-page-retirement/)
# retires a page with a double-bit error when the driver reloads: pending pages → reboot.
# An uncorrectable error since the driver loaded (volatile) left the GPU's contexts unusable
# until a reset; errors only in the aggregate (lifetime) counters are history to watch.
_RECOVERY = {"reset": "reset", "reboot": "reboot", "drain p2p": "reset", "drain and reset": "reset"}


def _repair_finding(gpu: Gpu, evidence: str) -> Finding | None:
    """Row remapping (Ampere and later) or page retirement (before) waiting for an action."""
    if gpu.remap_failure:
        return Finding(
            "fail",
            f"{gpu.name}: row remapping failed (no spare rows left)",
            "isolate",
            f"Drain the node and RMA {gpu.product or 'the GPU'} serial {gpu.serial}",
            evidence,
        )
    if gpu.remap_pending:
        return Finding(
            "fail",
            f"{gpu.name}: uncorrectable memory error, row remap pending",
            "reset",
            f"Stop jobs on the GPU and reset it (nvidia-smi -r -i {gpu.index}) to remap the row",
            evidence,
        )
    if gpu.retired_pending:
        return Finding(
            "fail",
            f"{gpu.name}: pages pending retirement after ECC errors",
            "reboot",
            "Reboot the node (or reload the driver) so the pages are retired",
            evidence,
        )
    return None


def _ecc_finding(gpu: Gpu) -> Finding | None:
    evidence = (
        f"volatile: {_counts(gpu.volatile_unc) or 0}; aggregate: "
        f"{_counts(gpu.aggregate_unc) or 0}; remap pending {gpu.remap_pending}, failure "
        f"{gpu.remap_failure}; retirement pending {gpu.retired_pending}"
    )
    repair = _repair_finding(gpu, evidence)
    if repair:
        return repair
    action = _RECOVERY.get(gpu.recovery_action.lower())
    if action:
        return Finding(
            "fail",
            f"{gpu.name}: nvidia-smi asks for recovery action {gpu.recovery_action!r}",
            action,
            "Stop jobs on the GPU and reboot the node"
            if action == "reboot"
            else f"Stop jobs on the GPU and reset it (nvidia-smi -r -i {gpu.index})",
            f"<gpu_recovery_action>{gpu.recovery_action}</gpu_recovery_action>",
        )
    if any(v for _, v in gpu.volatile_unc):
        return Finding(
            "fail",
            f"{gpu.name}: uncorrectable ECC errors since the driver loaded "
            f"({_counts(gpu.volatile_unc)})",
            "reset",
            f"Stop jobs on the GPU and reset it (nvidia-smi -r -i {gpu.index}); if errors "
            "return, drain the node",
            evidence,
        )
    if any(v for _, v in gpu.aggregate_unc):
        return Finding(
            "warn",
            f"{gpu.name}: uncorrectable ECC errors in its lifetime ({_counts(gpu.aggregate_unc)})"
            ", none since the driver loaded",
            "monitor",
            "Watch the counters; a rising aggregate count means the GPU is wearing out",
            evidence,
        )
    return None


def _per_gpu(
    outputs: NodeOutputs,
    check: Callable[[Gpu], Finding | None],
    healthy: Callable[[SmiLog], str],
) -> list[Finding]:
    """`check`'s findings for each GPU, or one pass saying `healthy(log)`."""
    text = outputs.text(FILE)
    if text is None:
        return [outputs.skip(FILE)]
    log = parse(text)
    findings = [f for f in map(check, log.gpus) if f is not None]
    return findings or [Finding("pass", healthy(log))]


def _ecc_healthy(log: SmiLog) -> str:
    off = [str(g.index) for g in log.gpus if g.ecc_mode == "Disabled"]
    note = f" (ECC disabled on GPU {', '.join(off)})" if off else ""
    return f"{_gpus(len(log.gpus))}, no uncorrectable ECC errors{note}"


def judge_ecc(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """Uncorrectable ECC errors, pending page retirement and row remapping per GPU."""
    return _per_gpu(outputs, _ecc_finding, _ecc_healthy)


# GPUs on an SXM (or SXM-class) baseboard, by the product name nvidia-smi prints: their NVLinks
# are the board's, never an optional bridge, and their PCIe link is x16 by design (nvlink.py,
# judge_pcie). "SXM" is in the A100/V100/P100 names; H100 SXM prints "H100 80GB HBM3" (its PCIe and
# NVL cards say so), and H200/B200/B100/GB200 come as SXM-class modules only.
_SXM = re.compile(
    r"SXM|\bH100 \d+GB HBM3\b|\b(?:H200|B200|B100|GB200|GB300|B300)\b(?!.*\b(?:NVL|PCIe)\b)"
)


def sxm_board(product: str) -> bool:
    """Whether nvidia-smi's product name is an SXM module's (_SXM), not a PCIe card's."""
    return bool(_SXM.search(product)) and "PCIe" not in product


# PCIe link. NVML's max link width/generation is what "this device and system" can reach
# (nvmlDeviceGetMaxPcieLinkWidth: a x16 GPU in a x8 slot reports x8), so current below max is
# a link that trained short. But nvidia-smi's documentation says of both current values "These
# may be reduced when the GPU is not in use", and GPUs drop the generation when idle (a
# recorded RTX 4000 Ada at rest shows gen 1 of 4). So: the generation only counts while the
# GPU is busy (warn, monitor); a narrow width counts always, and it fails (isolate: a reseat
# or a riser, not software) when a GPU of the same model on the node runs at full width,
# which proves the platform can, or when the GPU is an SXM module (x16 by design); otherwise
# it warns.
def judge_pcie(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """PCIe link width and generation of each GPU against its maximum."""
    text = outputs.text(FILE)
    if text is None:
        return [outputs.skip(FILE)]
    log = parse(text)
    full = {
        g.product for g in log.gpus if g.width_max is not None and g.width_current == g.width_max
    }
    findings: list[Finding] = []
    idle_low = 0
    for g in log.gpus:
        evidence = f"gen {g.gen_current}/{g.gen_max}, width x{g.width_current}/x{g.width_max}"
        if g.width_current is not None and g.width_max and g.width_current < g.width_max:
            proven = g.product in full or sxm_board(g.product)
            findings.append(
                Finding(
                    "fail" if proven else "warn",
                    f"{g.name}: PCIe link x{g.width_current}, not x{g.width_max}"
                    + (
                        " (other GPUs of this model run at full width)"
                        if g.product in full
                        else " (an SXM module's link is x16 by design)"
                        if proven
                        else ""
                    ),
                    "isolate" if proven else "monitor",
                    "Drain the node and reseat the GPU or its riser; a reboot retrains the link"
                    if proven
                    else "Check the slot's wiring; reseat the GPU if it should be full width",
                    evidence,
                )
            )
        elif g.gen_current is not None and g.gen_max and g.gen_current < g.gen_max:
            if g.busy:
                findings.append(
                    Finding(
                        "warn",
                        f"{g.name}: PCIe gen {g.gen_current} of {g.gen_max} while busy",
                        "monitor",
                        "Check the BIOS PCIe speed setting and the riser; re-check under load",
                        evidence + f", utilisation {g.gpu_util}%",
                    )
                )
            else:
                idle_low += 1
    if findings:
        return findings
    note = f"; {idle_low} idle below max generation (normal power saving)" if idle_low else ""
    return [Finding("pass", f"{_gpus(len(log.gpus))} at full PCIe link width{note}")]


# Clock event reasons (nvidia-smi -q, "Clocks Event Reasons"; NVML nvmlClocksEventReasons).
# Idle, application/display clock settings and sync boost are choices, not faults. SW power
# cap is a GPU at its power limit, normal under load unless someone lowered the limit below
# the default. SW thermal slowdown means the GPU runs above its target temperature (warn).
# HW slowdown, HW thermal slowdown and HW power brake halve the clocks or more and come from
# the board (overheating, a power supply asserting the brake): one such GPU slows every
# collective of the job, and no reset cures airflow or power, so they fail with isolate.
_BENIGN = {
    "gpu_idle",
    "applications_clocks_setting",
    "display_clocks_setting",
    "sync_boost",
    "none",
}
_HARDWARE = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}


def _throttle_finding(g: Gpu) -> Finding | None:
    active = [k for k, on in g.clock_reasons if on and k not in _BENIGN]
    capped = (
        g.power_limit is not None
        and g.default_power_limit is not None
        and g.power_limit < g.default_power_limit
    )
    evidence = "active: " + ", ".join(k for k, on in g.clock_reasons if on)
    hardware = [k for k in active if k in _HARDWARE]
    if hardware:
        return Finding(
            "fail",
            f"{g.name}: hardware clock slowdown ({', '.join(hardware)})",
            "isolate",
            "Drain the node; check its cooling, fans and power supplies (nvidia-smi -q -d "
            "TEMPERATURE,POWER)",
            evidence,
        )
    worrying = [k for k in active if k != "sw_power_cap" or capped]
    if not worrying:
        return None
    limit = f" (power limit {g.power_limit} W, default {g.default_power_limit} W)" if capped else ""
    return Finding(
        "warn",
        f"{g.name}: clocks slowed by {', '.join(worrying)}{limit}",
        "monitor",
        f"Restore the default power limit (nvidia-smi -i {g.index} -pl {g.default_power_limit})"
        if capped and worrying == ["sw_power_cap"]
        else "Check the GPU's temperature and airflow under load",
        evidence,
    )


def _throttle_healthy(log: SmiLog) -> str:
    at_cap = sum(1 for g in log.gpus if g.reason("sw_power_cap"))
    note = f"; {at_cap} at their power limit (normal under load)" if at_cap else ""
    return f"{_gpus(len(log.gpus))}, no clock slowdown{note}"


def judge_throttle(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
    """Active clock event (throttle) reasons per GPU."""
    return _per_gpu(outputs, _throttle_finding, _throttle_healthy)


JUDGES = (judge_gpu_count, judge_ecc, judge_pcie, judge_throttle)

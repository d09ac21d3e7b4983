"""Recorded tool outputs for the node health judges (fixtures/health/*/SOURCES.md), and the
faults made from them.

A fault is an edit of a recorded file that the tool's own format allows: a counter changed,
a `<gpu>` element removed with `<attached_gpus>` decremented, a link line turned inactive.
Each edit is an exact text replacement inside one scope (a `<gpu id=...>` element, a
`GPU N:` block, or the whole file) that must match exactly as often as it says, so a
fixture that changes under an edit fails loudly instead of silently testing nothing. The
FAULTS table here is the one SOURCES.md describes.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

from dscluster.doctor.health import NodeOutputs

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "health"


def fixture(name: str) -> str:
    """fixtures/health/<family>/<file>, e.g. fixture("nvidia/nvidia-smi-q_...xml")."""
    return (FIXTURES / name).read_text()


@dataclasses.dataclass(frozen=True)
class Edit:
    scope: str  # "" (the whole file), a <gpu> element's id, or "GPU N:" for nvlink text
    old: str  # "*" drops the whole scope
    new: str = ""
    count: int = 1


def _scope(text: str, scope: str) -> tuple[int, int]:
    if not scope:
        return 0, len(text)
    if scope.startswith("GPU "):
        start = text.index(scope)
        nxt = re.compile(r"^GPU \d+:", re.M).search(text, start + len(scope))
        return start, nxt.start() if nxt else len(text)
    start = text.index(f'<gpu id="{scope}">')
    start = text.rindex("\n", 0, start) + 1  # from the start of its line
    end = text.index("</gpu>", start) + len("</gpu>\n")
    return start, end


def edited(text: str, *edits: Edit) -> str:
    for edit in edits:
        start, end = _scope(text, edit.scope)
        part = text[start:end]
        if edit.old == "*":
            part = edit.new
        else:
            found = part.count(edit.old)
            assert found == edit.count, f"{edit}: found {found} times"
            part = part.replace(edit.old, edit.new)
        text = text[:start] + part + text[end:]
    return text


V100S = "nvidia/nvidia-smi-q_8x_v100s-pcie_v11.xml"
A100 = "nvidia/nvidia-smi-q_a100-sxm4_v12.xml"
ADA = "nvidia/nvidia-smi-q_rtx4000-sff-ada_v13.xml"
T4 = "nvidia/nvidia-smi-q_tesla-t4_v11.xml"

_DBE = "<double_bit>\n                    <device_memory>0</device_memory>"
_DBE_TOTAL = "<cbu>0</cbu>\n                    <total>0</total>\n                </double_bit>"

FAULTS: dict[str, tuple[str, tuple[Edit, ...]]] = {
    # GPU 7 (00000000:00:14.0) no longer listed: a GPU that fell off the bus.
    "v100s_lost_gpu7": (
        V100S,
        (
            Edit("", "<attached_gpus>8</attached_gpus>", "<attached_gpus>7</attached_gpus>"),
            Edit("00000000:00:14.0", "*"),
        ),
    ),
    # GPU 2: one double-bit error in device memory (volatile and aggregate), its page pending
    # retirement.
    "v100s_dbe_gpu2": (
        V100S,
        (
            Edit("00000000:00:0F.0", _DBE, _DBE.replace(">0<", ">1<"), 2),
            Edit("00000000:00:0F.0", _DBE_TOTAL, _DBE_TOTAL.replace("<total>0", "<total>1"), 2),
            Edit(
                "00000000:00:0F.0",
                "<pending_retirement>No</pending_retirement>",
                "<pending_retirement>Yes</pending_retirement>",
            ),
        ),
    ),
    # GPU 5: link trained at x4 of x16.
    "v100s_x4_gpu5": (
        V100S,
        (
            Edit(
                "00000000:00:12.0",
                "<current_link_width>16x</current_link_width>",
                "<current_link_width>4x</current_link_width>",
            ),
        ),
    ),
    # GPU 3 (23 % busy): link at gen 2 of 3.
    "v100s_gen2_gpu3": (
        V100S,
        (
            Edit(
                "00000000:00:10.0",
                "<current_link_gen>3</current_link_gen>",
                "<current_link_gen>2</current_link_gen>",
            ),
        ),
    ),
    # GPU 1: HW slowdown and HW thermal slowdown active.
    "v100s_hw_thermal_gpu1": (
        V100S,
        tuple(
            Edit(
                "00000000:00:0E.0",
                f"<clocks_throttle_reason_{r}>Not Active</clocks_throttle_reason_{r}>",
                f"<clocks_throttle_reason_{r}>Active</clocks_throttle_reason_{r}>",
            )
            for r in ("hw_slowdown", "hw_thermal_slowdown")
        ),
    ),
    # The SXM module's link trained at x4 of x16 (the node's only GPU: no sibling to compare).
    "a100_x4": (
        A100,
        (
            Edit(
                "",
                "<current_link_width>16x</current_link_width>",
                "<current_link_width>4x</current_link_width>",
            ),
        ),
    ),
    # Two uncorrectable DRAM errors since the driver loaded (volatile and aggregate).
    "a100_dram_unc": (
        A100,
        (
            Edit(
                "",
                "<dram_uncorrectable>0</dram_uncorrectable>",
                "<dram_uncorrectable>2</dram_uncorrectable>",
                2,
            ),
        ),
    ),
    # One uncorrectable SRAM error in the lifetime counters only.
    "a100_sram_aggregate": (
        A100,
        (
            Edit(
                "",
                "<sram_uncorrectable>0</sram_uncorrectable>\n"
                "                <dram_correctable>0</dram_correctable>\n"
                "                <dram_uncorrectable>0</dram_uncorrectable>\n"
                "            </aggregate>",
                "<sram_uncorrectable>1</sram_uncorrectable>\n"
                "                <dram_correctable>0</dram_correctable>\n"
                "                <dram_uncorrectable>0</dram_uncorrectable>\n"
                "            </aggregate>",
            ),
        ),
    ),
    # A row remapped for an uncorrectable error, pending until the next reset.
    "ada_remap_pending": (
        ADA,
        (
            Edit(
                "",
                "<remapped_row_unc>0</remapped_row_unc>",
                "<remapped_row_unc>1</remapped_row_unc>",
            ),
            Edit(
                "",
                "<remapped_row_pending>No</remapped_row_pending>",
                "<remapped_row_pending>Yes</remapped_row_pending>",
            ),
        ),
    ),
    # A row remapping that failed.
    "ada_remap_failure": (
        ADA,
        (
            Edit(
                "",
                "<remapped_row_failure>No</remapped_row_failure>",
                "<remapped_row_failure>Yes</remapped_row_failure>",
            ),
        ),
    ),
    # nvidia-smi asks for a GPU reset (schema v13 <gpu_recovery_action>).
    "ada_recovery_reset": (
        ADA,
        (
            Edit(
                "",
                "<gpu_recovery_action>None</gpu_recovery_action>",
                "<gpu_recovery_action>Reset</gpu_recovery_action>",
            ),
        ),
    ),
}


NVLINK_V100 = "nvlink/nvidia-smi-nvlink-s_4x_v100-sxm2.txt"
NVLINK_A6000 = "nvlink/nvidia-smi-nvlink-s_3x_rtx-a6000.txt"
NVLINK_A100_S = "nvlink/nvidia-smi-nvlink-s-i0_a100-sxm4.txt"
NVLINK_A100_E = "nvlink/nvidia-smi-nvlink-e_8x_a100-sxm4.txt"

FAULTS.update(
    {
        # GPU 1: links 2 and 3 inactive, its other four up.
        "v100_nvlink_gpu1_down": (
            NVLINK_V100,
            tuple(
                Edit("GPU 1:", f"\t Link {n}: 25.781 GB/s", f"\t Link {n}: <inactive>")
                for n in (2, 3)
            ),
        ),
        # GPU 1: all six links inactive, the other three GPUs' up.
        "v100_nvlink_gpu1_all_down": (
            NVLINK_V100,
            tuple(
                Edit("GPU 1:", f"\t Link {n}: 25.781 GB/s", f"\t Link {n}: <inactive>")
                for n in range(6)
            ),
        ),
        # GPU 3 link 7: 3 replays and 12 CRC errors.
        "a100_nvlink_gpu3_crc": (
            NVLINK_A100_E,
            (
                Edit("GPU 3:", "\t Link 7: Replay Errors: 0\n", "\t Link 7: Replay Errors: 3\n"),
                Edit("GPU 3:", "\t Link 7: CRC Errors: 0\n", "\t Link 7: CRC Errors: 12\n"),
            ),
        ),
    }
)


def fault(name: str) -> str:
    base, edits = FAULTS[name]
    return edited(fixture(base), *edits)


def node(missing: dict[str, str] | None = None, **files: str) -> NodeOutputs:
    """NodeOutputs of host "node"; file names as keywords with - and . spelled _ ."""
    names = {
        "nvidia_smi_q_xml": "nvidia-smi-q.xml",
        "nvidia_smi_topo_txt": "nvidia-smi-topo.txt",
        "nvidia_smi_nvlink_s_txt": "nvidia-smi-nvlink-s.txt",
        "nvidia_smi_nvlink_e_txt": "nvidia-smi-nvlink-e.txt",
        "lspci_vvv_txt": "lspci-vvv.txt",
    }
    return NodeOutputs("node", {names[k]: v for k, v in files.items()}, missing or {})


TOPO_H20 = "topology/nvidia-smi-topo_8x_h20_8nic.txt"
TOPO_A6000 = "topology/nvidia-smi-topo_3x_rtx-a6000.txt"
LSPCI_ROOT_PORT = "topology/lspci-vvv-s01.1_haiguang_root_port.txt"
LSPCI_PLX = "topology/lspci-vvv_plx-pex8747_titan-x.txt"

FAULTS.update(
    {
        # The PLX downstream port above the TITAN X with ACS source validation and P2P
        # request/completion redirect and upstream forwarding on, as lspci prints it on
        # hosts where the BIOS leaves ACS enabled (NVIDIA/nccl issue 629).
        "plx_acs_on": (
            LSPCI_PLX,
            (
                Edit(
                    "",
                    "ACSCtl: SrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl-",
                    "ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl-",
                ),
            ),
        ),
    }
)


def without_devices(text: str, *names: str) -> str:
    """A topo -m matrix as nvidia-smi prints it when `names` (e.g. NIC4) are not present:
    their columns, their rows and their NIC Legend lines removed."""
    lines = text.split("\n")
    header = next(i for i, ln in enumerate(lines) if ln.startswith("\tGPU0"))
    columns = lines[header].split("\t")
    drop = [i for i, c in enumerate(columns) if c.strip() in names]
    assert len(drop) == len(names), names
    out = []
    for number, line in enumerate(lines):
        fields = line.split("\t")
        if fields[0].strip() in names or line.strip().split(":")[0] in names:
            continue  # the device's row, or its NIC Legend line
        if number == header or (number > header and fields[0].strip() in columns):
            out.append("\t".join(f for i, f in enumerate(fields) if i not in drop))
        else:
            out.append(line)
    return "\n".join(out)

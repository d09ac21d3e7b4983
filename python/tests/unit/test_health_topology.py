"""`nvidia-smi topo -m` / `lspci -vvv` parsers and judge_topology against recorded real outputs
(fixtures/health/topology/SOURCES.md) and a fault made from them."""

from __future__ import annotations

import pytest

from dscluster.doctor.health import Expect, Unreadable, topology

from .health_fixtures import (
    LSPCI_PLX,
    LSPCI_ROOT_PORT,
    TOPO_A6000,
    TOPO_H20,
    fault,
    fixture,
    node,
    without_devices,
)

NVIDIA = Expect(accelerator="nvidia", devices=8)


def judge(topo: str | None = None, lspci: str | None = None, **missing: str):
    files = {}
    if topo is not None:
        files["nvidia_smi_topo_txt"] = topo
    if lspci is not None:
        files["lspci_vvv_txt"] = lspci
    return topology.judge_topology(node(missing=missing or None, **files), NVIDIA)


def test_parse_topo_gpus_nics_numa_and_nic_legend():
    topo = topology.parse_topo(fixture(TOPO_H20))
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.nics == [f"NIC{i}" for i in range(8)]
    assert topo.numa["GPU0"] == "0" and topo.numa["GPU7"] == "1"
    assert topo.cells[("GPU4", "NIC4")] == "PIX" and topo.cells[("GPU4", "NIC0")] == "SYS"
    assert topo.nic("NIC0") == "mlx5_1"


def test_parse_topo_without_nics():
    topo = topology.parse_topo(fixture(TOPO_A6000))
    assert (topo.gpus, topo.nics) == (["GPU0", "GPU1", "GPU2"], [])
    assert topo.cells[("GPU0", "GPU1")] == "NV4"


def test_parse_lspci_bridge_range_port_and_acs_bits():
    (bridge,) = topology.parse_lspci(fixture(LSPCI_ROOT_PORT))
    assert (bridge.address, bridge.kind, bridge.port) == ("00:01.1", "PCI bridge", "Root Port")
    assert (bridge.secondary, bridge.subordinate) == (0x01, 0x44)
    assert bridge.redirects == ["ReqRedir", "CmpltRedir"]


def test_healthy_topology_passes_and_root_port_acs_is_not_flagged():
    (finding,) = judge(fixture(TOPO_H20), fixture(LSPCI_ROOT_PORT))
    assert finding.status == "pass"
    assert finding.detail == (
        "8 GPUs each with a NIC on their NUMA node; "
        "no PCIe switch port redirects P2P above a GPU or NIC"
    )


def test_parse_lspci_switch_port_above_a_gpu():
    port, gpu = topology.parse_lspci(fixture(LSPCI_PLX))
    assert (port.port, port.secondary, port.subordinate, port.redirects) == (
        "Downstream Port", 4, 4, [],
    )  # fmt: skip
    assert (gpu.address, gpu.kind, gpu.bus) == ("04:00.0", "VGA compatible controller", 4)


def test_switch_port_with_acs_off_above_a_gpu_passes():
    (finding,) = judge(fixture(TOPO_H20), fixture(LSPCI_PLX))
    assert finding.status == "pass"


def test_switch_port_with_acs_redirect_above_a_gpu_fails_with_reboot():
    passed, finding = judge(fixture(TOPO_H20), fault("plx_acs_on"))
    assert passed.status == "pass"
    assert (finding.status, finding.action) == ("fail", "reboot")
    assert finding.detail == (
        "PCIe switch port 03:08.0 redirects peer-to-peer traffic (ACS ReqRedir, CmpltRedir) "
        "above 04:00.0 (VGA compatible controller)"
    )
    assert "PCI Access Control Services" in finding.fix
    assert finding.evidence.startswith("ACSCtl: SrcValid+ TransBlk- ReqRedir+ CmpltRedir+")


def test_gpus_without_a_nic_on_their_numa_node_warn():
    text = without_devices(fixture(TOPO_H20), "NIC4", "NIC5", "NIC6", "NIC7")
    passed, *findings = judge(text, fixture(LSPCI_ROOT_PORT))
    assert passed.detail == "no PCIe switch port redirects P2P above a GPU or NIC"
    assert [(f.status, f.action) for f in findings] == [("warn", "monitor")] * 4
    assert findings[0].detail.startswith("GPU4 (NUMA 1): no NIC on its NUMA node")
    assert "mlx5_1=SYS" in findings[0].evidence


def test_no_nics_at_all_is_not_a_numa_finding():
    (finding, skipped) = judge(fixture(TOPO_A6000))
    assert (finding.status, finding.detail) == ("pass", "3 GPUs, no NIC in the matrix")
    assert skipped.status == "skip" and skipped.detail.startswith("lspci-vvv.txt was not recorded")


def test_missing_files_skip_with_the_probes_reason():
    findings = judge(
        **{"nvidia-smi-topo.txt": "nvidia-smi: not found", "lspci-vvv.txt": "lspci: not found"}
    )
    assert [(f.status, f.detail) for f in findings] == [
        ("skip", "nvidia-smi: not found"),
        ("skip", "lspci: not found"),
    ]


@pytest.mark.parametrize(
    ("topo", "lspci", "words"),
    [
        ("", None, "nvidia-smi-topo.txt: no matrix header"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", None,
         "no matrix header"),
        (fixture(TOPO_H20)[:520], None, "nvidia-smi-topo.txt: line 6 is not a matrix row"),
        (fixture(TOPO_H20)[:400], None, "3 matrix rows for 16 devices (truncated)"),
        (fixture(TOPO_H20).split("\nNIC4\t")[0] + "\n", None, "12 matrix rows for 16 devices"),
        (fixture(TOPO_H20).replace("PIX", "PH0-115", 1), None, "GPU0/NIC0 is 'PH0-115'"),
        (None, "", "lspci-vvv.txt: no PCI device listed"),
        (None, "\tLatency: 0\n", "lspci-vvv.txt: line 1 comes before any device line"),
        (None, "pcilib: Cannot open /proc/bus/pci\n", "lspci-vvv.txt: line 1 is not a device"),
    ],
)  # fmt: skip
def test_garbage_and_truncated_are_unreadable_in_one_line(topo, lspci, words):
    with pytest.raises(Unreadable) as info:
        judge(topo, lspci)
    assert words in str(info.value) and "\n" not in str(info.value)

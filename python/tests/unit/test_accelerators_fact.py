"""The accelerators fact against recorded real tool outputs (fixtures/accelerators/SOURCES.md).

Every test goes through build_fact(), the function main() feeds with collect().
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from .accel_fixtures import ACCELERATORS_FACT, accelerators, fixture, make_root, outputs


def build(tmp_path: pathlib.Path, root: pathlib.Path | None = None, **recorded) -> dict:
    return accelerators.build_fact(outputs(**recorded), root or tmp_path)


def test_four_gpus_from_nvidia_smi_mig_lines_are_not_gpus(tmp_path):
    fact = build(tmp_path, nvidia_smi=fixture("nvidia-smi-L_4x_a100_mig.txt"))
    assert (fact["kind"], fact["count"], fact["source"]) == ("cuda", 4, "nvidia-smi")
    assert fact["nvidia"] == {
        "count": 4,
        "source": "nvidia-smi",
        "models": ["NVIDIA A100-SXM4-80GB"],
        "nvswitch": 0,
    }
    assert fact["habana"] == {"count": 0, "source": "none", "models": []}


def test_two_gpus_from_nvidia_smi(tmp_path):
    fact = build(tmp_path, nvidia_smi=fixture("nvidia-smi-L_2x_quadro_rtx4000.txt"))
    assert (fact["kind"], fact["count"]) == ("cuda", 2)
    assert fact["nvidia"]["models"] == ["Quadro RTX 4000"]


def test_eight_gpu_nvswitch_node_smi_counts_and_lspci_finds_switches(tmp_path):
    fact = build(
        tmp_path,
        nvidia_smi=fixture("nvidia-smi-L_8x_h100.txt"),
        lspci=fixture("lspci-Dnn_8x_h100_4x_nvswitch.txt"),
    )
    assert (fact["kind"], fact["count"], fact["source"]) == ("cuda", 8, "nvidia-smi")
    assert fact["nvidia"]["nvswitch"] == 4
    assert fact["nvidia"]["models"] == ["NVIDIA H100 80GB HBM3"]


def test_lspci_fallback_counts_3d_controllers_not_the_aspeed_vga(tmp_path):
    fact = build(tmp_path, lspci=fixture("lspci-Dnn_8x_h100_4x_nvswitch.txt"))
    assert (fact["kind"], fact["count"], fact["source"]) == ("cuda", 8, "lspci")
    assert fact["nvidia"]["models"] == ["GH100 [H100 SXM5 80GB]"]
    assert fact["nvidia"]["nvswitch"] == 4


def test_lspci_fallback_four_gpu_vm_without_switches(tmp_path):
    fact = build(tmp_path, lspci=fixture("lspci-Dnn_4x_h100_vm.txt"))
    assert (fact["kind"], fact["count"], fact["source"]) == ("cuda", 4, "lspci")
    assert fact["nvidia"]["nvswitch"] == 0
    assert fact["habana"] == {"count": 0, "source": "lspci", "models": []}


def test_nforce_chipset_bridge_is_not_an_nvswitch(tmp_path):
    # An nVidia "Bridge [0680]" here is the MCP51's Ethernet, and the only NVIDIA display
    # function is the chipset's integrated VGA: lspci sees one GPU and no switch.
    fact = build(tmp_path, lspci=fixture("lspci-nn_nforce_mcp51_laptop.txt"))
    assert fact["nvidia"]["count"] == 1
    assert fact["nvidia"]["nvswitch"] == 0


def test_gaudi_from_hl_smi_uses_attached_count(tmp_path):
    fact = build(
        tmp_path,
        hl_smi=fixture("hl-smi-L-i_gaudi2_hl225.txt"),
        lspci=fixture("lspci-nn_8x_gaudi2.txt"),
    )
    assert (fact["kind"], fact["count"], fact["source"]) == ("hpu", 8, "hl-smi")
    assert fact["habana"]["models"] == ["HL-225"]
    assert fact["nvidia"]["count"] == 0


def test_gaudi_from_lspci_vendor_1da3(tmp_path):
    fact = build(tmp_path, lspci=fixture("lspci-nn_8x_gaudi2.txt"))
    assert (fact["kind"], fact["count"], fact["source"]) == ("hpu", 8, "lspci")


def test_hl_smi_without_header_counts_aip_blocks():
    text = fixture("hl-smi-L-i_gaudi2_hl225.txt")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("Attached AIPs"))
    assert accelerators.parse_hl_smi(body)["count"] == 1


def test_zero_device_node(tmp_path):
    fact = build(tmp_path, lspci=fixture("lspci-nn_buildhost_virtio_none.txt"))
    assert (fact["kind"], fact["count"], fact["source"]) == ("cpu", 0, "none")
    assert fact["nvidia"]["source"] == "lspci"
    assert fact["efa"] == [] and fact["ib"] == [] and fact["fi_info_efa"] is None


def test_no_tools_no_sysfs_is_a_cpu_node(tmp_path):
    fact = build(tmp_path)
    assert (fact["kind"], fact["count"], fact["source"]) == ("cpu", 0, "none")
    assert fact["nvidia"]["source"] == "none"


def test_sysfs_fallback_reads_vendor_and_class(tmp_path):
    # The records /sys/bus/pci holds for the first two GPUs and a switch of the 8-GPU node
    # in lspci-Dnn_8x_h100_4x_nvswitch.txt (vendor/device/class as the kernel writes them).
    devices = tmp_path / "sys" / "bus" / "pci" / "devices"
    for slot, vendor, device, cls in (
        ("0000:07:00.0", "0x10de", "0x22a3", "0x068000"),
        ("0000:1b:00.0", "0x10de", "0x2330", "0x030200"),
        ("0000:43:00.0", "0x10de", "0x2330", "0x030200"),
        ("0000:04:00.0", "0x1a03", "0x2000", "0x030000"),
    ):
        (devices / slot).mkdir(parents=True)
        (devices / slot / "vendor").write_text(vendor + "\n")
        (devices / slot / "device").write_text(device + "\n")
        (devices / slot / "class").write_text(cls + "\n")
    fact = build(tmp_path)
    assert (fact["kind"], fact["count"], fact["source"]) == ("cuda", 2, "sysfs")
    assert fact["nvidia"]["nvswitch"] == 1


@pytest.mark.parametrize(
    ("name", "devices"),
    [
        ("fi_info-p_efa_efa0_2020.txt", 1),
        ("fi_info-p_efa-t_rdm_p4d_4x.txt", 4),
        ("fi_info-p_efa_efa-direct_1x.txt", 1),
        ("fi_info_hpc6a_efa_entries.txt", 1),
    ],
)
def test_fi_info_counts_distinct_devices(name, devices):
    assert accelerators.parse_fi_info(fixture(name)) == devices


def test_fi_info_that_ran_and_found_nothing_is_zero_not_null(tmp_path):
    assert build(tmp_path, fi_info_efa="")["fi_info_efa"] == 0


def test_mixed_node_gpus_and_efa(tmp_path):
    root = make_root(tmp_path, efa=("rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"))
    fact = build(
        tmp_path,
        root,
        nvidia_smi=fixture("nvidia-smi-L_8x_h100.txt"),
        fi_info_efa=fixture("fi_info-p_efa-t_rdm_p4d_4x.txt"),
    )
    assert (fact["kind"], fact["count"]) == ("cuda", 8)
    assert fact["efa"] == ["rdmap144s27", "rdmap160s27", "rdmap16s27", "rdmap32s27"]
    assert fact["fi_info_efa"] == 4
    assert fact["ib"] == []


def test_infiniband_and_roce_hcas_with_link_layer(tmp_path):
    root = make_root(
        tmp_path, efa=("efa_0",), ib=(("mlx5_0", "InfiniBand"), ("mlx5_1", "Ethernet"))
    )
    fact = build(tmp_path, root)
    assert fact["efa"] == ["efa_0"]
    assert fact["ib"] == [
        {"name": "mlx5_0", "link_layer": "InfiniBand"},
        {"name": "mlx5_1", "link_layer": "Ethernet"},
    ]


def test_nics_and_default_route_from_recorded_ip_output(tmp_path):
    fact = build(tmp_path)
    names = [n["name"] for n in fact["nics"]]
    assert "lo" not in names
    assert fact["default_interface"] == "eth0"
    assert fact["default_interface"] in names
    assert all(n["ipv4"] for n in fact["nics"])


def test_container_markers(tmp_path):
    assert build(tmp_path)["container"] is False
    (tmp_path / ".dockerenv").write_text("")
    assert build(tmp_path)["container"] is True


def test_boot_id_is_the_kernels(tmp_path):
    assert build(tmp_path)["boot_id"] == ""  # no /proc under this root
    proc = tmp_path / "proc" / "sys" / "kernel" / "random"
    proc.mkdir(parents=True)
    (proc / "boot_id").write_text("5f0c2a8e-3d1b-4c7e-9a61-0b2f4e8d7c13\n")
    assert build(tmp_path)["boot_id"] == "5f0c2a8e-3d1b-4c7e-9a61-0b2f4e8d7c13"
    for junk in ("", "not-a-uuid\n", "5F0C2A8E-3D1B-4C7E-9A61-0B2F4E8D7C13", "\xff\xfe"):
        (proc / "boot_id").write_bytes(junk.encode("latin-1"))
        assert build(tmp_path)["boot_id"] == ""


def test_main_runs_on_this_machine_and_prints_the_schema():
    # The real collectors on the test machine (no accelerators here): the same script the
    # role installs, run the way Ansible runs a local fact.
    proc = subprocess.run(
        [sys.executable, str(ACCELERATORS_FACT)], capture_output=True, text=True, check=True
    )
    fact = json.loads(proc.stdout)
    assert set(fact) == {
        "kind",
        "count",
        "source",
        "nvidia",
        "habana",
        "efa",
        "fi_info_efa",
        "ib",
        "nics",
        "default_interface",
        "hostname",
        "cpus",
        "container",
        "boot_id",
    }
    assert fact["kind"] in ("cpu", "cuda", "hpu")
    assert (fact["kind"] == "cpu") == (fact["count"] == 0)
    assert fact["cpus"] >= 1
    # this machine's kernel, as every container on it reads it
    boot_id = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert fact["boot_id"] == boot_id

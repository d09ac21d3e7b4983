"""`nvidia-smi nvlink -s` / `-e` parsers and judge_nvlink against recorded real outputs
(fixtures/health/nvlink/SOURCES.md) and faults made from them (health_fixtures.FAULTS)."""

from __future__ import annotations

import pytest

from dscluster.doctor.health import Expect, Finding, Unreadable, nvidia, nvlink

from .health_fixtures import (
    NVLINK_A100_E,
    NVLINK_A100_S,
    NVLINK_A6000,
    NVLINK_V100,
    fault,
    fixture,
    node,
)

NVIDIA = Expect(accelerator="nvidia", devices=8)


def judge(status: str | None = None, errors: str | None = None, **missing: str):
    files = {}
    if status is not None:
        files["nvidia_smi_nvlink_s_txt"] = status
    if errors is not None:
        files["nvidia_smi_nvlink_e_txt"] = errors
    return nvlink.judge_nvlink(node(missing=missing or None, **files), NVIDIA)


def test_parse_status_four_v100_six_links_each():
    gpus = nvlink.parse_status(fixture(NVLINK_V100))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].product == "Tesla V100-SXM2-16GB"
    assert gpus[3].uuid == "GPU-5686108a-c647-af17-0a65-3d1b5fbb69c6"
    assert gpus[1].links == tuple((n, 25.781) for n in range(6))


def test_parse_status_whole_number_speed_and_all_inactive_message():
    assert nvlink.parse_status(fixture(NVLINK_A100_S))[0].links[11] == (11, 25.0)
    gpu2 = nvlink.parse_status(fixture(NVLINK_A6000))[2]
    assert (gpu2.links, gpu2.all_inactive) == ((), True)


def test_parse_errors_counts_per_link():
    gpus = nvlink.parse_errors(fixture(NVLINK_A100_E))
    assert len(gpus) == 8 and len(gpus[7].counters) == 36
    assert gpus[0].counters[:3] == (
        (0, "Replay Errors", 0), (0, "Recovery Errors", 0), (0, "CRC Errors", 0),
    )  # fmt: skip


def test_healthy_links_and_clean_counters_pass():
    assert judge(fixture(NVLINK_A100_S), fixture(NVLINK_A100_E)) == [
        Finding("pass", "1 GPU, 12 NVLinks each active, no link errors")
    ]


def test_inactive_links_beside_active_ones_fail_with_reset():
    findings = judge(fault("v100_nvlink_gpu1_down"), fixture(NVLINK_A100_E))
    assert len(findings) == 1
    finding = findings[0]
    assert (finding.status, finding.action) == ("fail", "reset")
    assert finding.detail == "GPU 1: NVLink 2, 3 inactive, 4 of 6 up"
    assert "Link 2: <inactive>" in finding.evidence


def test_a_pcie_card_with_every_link_inactive_beside_linked_peers_warns():
    # Real: the third A6000 of this workstation has no bridge, as PCIe cards may not.
    finding = judge(fixture(NVLINK_A6000), fixture(NVLINK_A100_E))[0]
    assert (finding.status, finding.action) == ("warn", "monitor")
    assert finding.detail.startswith(
        "GPU 2 (NVIDIA RTX A6000): every NVLink inactive while GPU 0, GPU 1"
    )


def test_an_sxm_gpu_with_every_link_inactive_beside_linked_peers_fails_with_reset():
    findings = judge(fault("v100_nvlink_gpu1_all_down"), fixture(NVLINK_A100_E))
    assert [(f.status, f.action) for f in findings] == [("fail", "reset")]
    assert findings[0].detail == (
        "GPU 1 (Tesla V100-SXM2-16GB): every NVLink inactive while GPU 0, GPU 2, GPU 3 have "
        "links up"
    )


@pytest.mark.parametrize(
    ("product", "sxm"),
    [
        ("Tesla V100-SXM2-16GB", True),
        ("NVIDIA A100-SXM4-80GB", True),
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H200", True),
        ("NVIDIA B200", True),
        ("NVIDIA H100 PCIe", False),
        ("NVIDIA H100 NVL", False),
        ("NVIDIA H200 NVL", False),
        ("NVIDIA A100-PCIE-40GB", False),
        ("NVIDIA A100 80GB PCIe", False),
        ("NVIDIA RTX A6000", False),
        ("NVIDIA L40S", False),
    ],
)
def test_sxm_boards_by_product_name(product, sxm):
    assert nvidia.sxm_board(product) is sxm


def test_error_counters_warn_with_monitor():
    findings = judge(fixture(NVLINK_V100), fault("a100_nvlink_gpu3_crc"))
    assert [(f.status, f.action) for f in findings] == [("warn", "monitor")]
    assert findings[0].evidence == "Link 7: Replay Errors: 3; Link 7: CRC Errors: 12"


def test_no_nvlink_skips_with_reason():
    finding = judge("")[0]
    assert finding.status == "skip" and "no NVLink" in finding.detail
    lone = fixture(NVLINK_A6000)[fixture(NVLINK_A6000).index("GPU 2:") :]
    assert judge(lone)[0].status == "skip"


def test_missing_files_skip_with_the_probes_reason():
    (finding,) = judge(**{"nvidia-smi-nvlink-s.txt": "nvidia-smi: command not found"})
    assert (finding.status, finding.detail) == ("skip", "nvidia-smi: command not found")
    findings = judge(fixture(NVLINK_V100))
    assert [f.status for f in findings] == ["pass", "skip"]
    assert findings[1].detail.startswith("nvidia-smi-nvlink-e.txt was not recorded")


@pytest.mark.parametrize(
    ("status", "errors", "words"),
    [
        ("\t Link 0: 25 GB/s\n", None, "nvidia-smi-nvlink-s.txt: line 1 comes before"),
        ("Failed to initialize NVML: Driver/library version mismatch\n", None, "line 1"),
        (fixture(NVLINK_V100)[:95], None, "nvidia-smi-nvlink-s.txt: line 2 is not a link line"),
        (
            fixture(NVLINK_V100),
            "GPU 0: X\n\t Link 0: Replay Errors: many\n",
            "nvidia-smi-nvlink-e.txt",
        ),
    ],
)
def test_garbage_and_truncated_are_unreadable_in_one_line(status, errors, words):
    with pytest.raises(Unreadable) as info:
        judge(status, errors)
    assert words in str(info.value) and "\n" not in str(info.value)

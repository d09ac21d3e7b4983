"""`nvidia-smi -q -x` parser and judges against recorded real outputs
(fixtures/health/nvidia/SOURCES.md) and faults made from them (health_fixtures.FAULTS)."""

from __future__ import annotations

import pytest

from dscluster.doctor.health import ACTIONS, Expect, Unreadable, nvidia

from .health_fixtures import A100, ADA, FAULTS, T4, V100S, fault, fixture, node

NVIDIA8 = Expect(accelerator="nvidia", devices=8)
NVIDIA1 = Expect(accelerator="nvidia", devices=1)
FILE = "nvidia-smi-q.xml"


def judged(judge, text: str, expect: Expect = NVIDIA8):
    return judge(node(nvidia_smi_q_xml=text), expect)


def only(findings):
    assert len(findings) == 1, findings
    return findings[0]


def test_parse_eight_v100s_schema_v11():
    log = nvidia.parse(fixture(V100S))
    assert log.attached == 8
    assert [g.bus_id for g in log.gpus][:2] == ["00000000:00:0D.0", "00000000:00:0E.0"]
    first = log.gpus[0]
    assert (first.index, first.minor, first.product) == (0, 0, "Tesla V100S-PCIE-32GB")
    assert first.uuid == "GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e"
    assert first.volatile_unc == (("double_bit", 0),)
    assert first.retired_pending is False and first.remap_pending is None
    assert (first.gen_current, first.gen_max, first.width_current, first.width_max) == (
        3, 3, 16, 16,
    )  # fmt: skip
    assert first.reason("hw_slowdown") is False
    assert log.gpus[3].reason("sw_power_cap") is True


def test_parse_schema_v12_sram_dram_counters():
    gpu = nvidia.parse(fixture(A100)).gpus[0]
    assert gpu.volatile_unc == (("sram_uncorrectable", 0), ("dram_uncorrectable", 0))
    assert gpu.product == "NVIDIA A100-SXM4-80GB"
    assert gpu.reason("gpu_idle") is False  # clocks_event_reasons spelling


def test_parse_schema_v13_event_reasons_and_row_remapper():
    gpu = nvidia.parse(fixture(ADA)).gpus[0]
    assert gpu.ecc_mode == "Disabled"
    assert gpu.volatile_unc == ()  # N/A counters are unknown, not 0
    assert (gpu.remap_pending, gpu.remap_failure, gpu.recovery_action) == (False, False, "None")
    assert gpu.reason("gpu_idle") is True
    assert not gpu.busy


def test_every_judge_passes_the_healthy_eight_gpu_node():
    for judge in nvidia.JUDGES:
        finding = only(judged(judge, fixture(V100S)))
        assert finding.status == "pass", finding
    assert only(judged(nvidia.judge_ecc, fixture(V100S))).detail == (
        "8 GPUs, no uncorrectable ECC errors"
    )


def test_gpu_count_lost_gpu_fails_with_isolate():
    finding = only(judged(nvidia.judge_gpu_count, fault("v100s_lost_gpu7")))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail == "7 of 8 expected GPUs seen: 1 missing"
    assert "00000000:00:13.0" in finding.evidence and "00000000:00:14.0" not in finding.evidence


def test_gpu_count_attached_more_than_listed_fails():
    # The A100 recording lists one <gpu> of 4 attached (recorded with -i, see SOURCES.md).
    finding = only(judged(nvidia.judge_gpu_count, fixture(A100), Expect("nvidia", 4)))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert "counts 4 attached GPUs but reports only 1" in finding.detail


def test_gpu_count_more_than_expected_warns_and_none_expected_passes():
    assert only(judged(nvidia.judge_gpu_count, fixture(V100S), Expect("nvidia", 4))).status == (
        "warn"
    )
    finding = only(judged(nvidia.judge_gpu_count, fixture(T4), Expect("nvidia")))
    assert (finding.status, finding.detail) == ("pass", "1 GPU (no expected count to compare with)")


def test_gpu_count_on_a_non_nvidia_node_skips_with_reason():
    finding = only(judged(nvidia.judge_gpu_count, fixture(V100S), Expect("gaudi", 8)))
    assert finding.status == "skip" and "gaudi" in finding.detail


@pytest.mark.parametrize(
    ("name", "status", "action", "words"),
    [
        ("v100s_dbe_gpu2", "fail", "reboot", "GPU 2 (00000000:00:0F.0): pages pending retirement"),
        ("a100_dram_unc", "fail", "reset", "since the driver loaded (dram_uncorrectable 2)"),
        ("a100_sram_aggregate", "warn", "monitor", "in its lifetime (sram_uncorrectable 1)"),
        ("ada_remap_pending", "fail", "reset", "row remap pending"),
        ("ada_remap_failure", "fail", "isolate", "row remapping failed"),
        ("ada_recovery_reset", "fail", "reset", "recovery action 'Reset'"),
    ],
)
def test_ecc_faults(name, status, action, words):
    finding = only(judged(nvidia.judge_ecc, fault(name)))
    assert (finding.status, finding.action) == (status, action)
    assert words in finding.detail
    assert finding.fix and finding.evidence


def test_ecc_pass_notes_disabled_ecc():
    finding = only(judged(nvidia.judge_ecc, fixture(ADA), NVIDIA1))
    assert finding.detail == "1 GPU, no uncorrectable ECC errors (ECC disabled on GPU 0)"


def test_pcie_width_degraded_against_siblings_fails():
    finding = only(judged(nvidia.judge_pcie, fault("v100s_x4_gpu5")))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail.startswith("GPU 5 (00000000:00:12.0): PCIe link x4, not x16")


def test_pcie_narrow_sxm_module_fails_alone():
    # An SXM module's link is x16 by design: no sibling is needed to prove it (issue 77).
    finding = only(judged(nvidia.judge_pcie, fault("a100_x4"), NVIDIA1))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail.endswith("PCIe link x4, not x16 (an SXM module's link is x16 by design)")


def test_pcie_narrow_single_gpu_only_warns():
    # A real recording: an AWS T4 at x8 of x16, no sibling to prove the slot is x16.
    finding = only(judged(nvidia.judge_pcie, fixture(T4), NVIDIA1))
    assert (finding.status, finding.action) == ("warn", "monitor")


def test_pcie_low_generation_while_idle_is_normal():
    # A real recording: an idle RTX 4000 Ada at gen 1 of 4.
    finding = only(judged(nvidia.judge_pcie, fixture(ADA), NVIDIA1))
    assert finding.status == "pass"
    assert "idle below max generation" in finding.detail


def test_pcie_low_generation_while_busy_warns():
    finding = only(judged(nvidia.judge_pcie, fault("v100s_gen2_gpu3")))
    assert (finding.status, finding.action) == ("warn", "monitor")
    assert finding.detail == "GPU 3 (00000000:00:10.0): PCIe gen 2 of 3 while busy"


def test_throttle_hw_slowdown_fails_and_power_cap_at_default_passes():
    finding = only(judged(nvidia.judge_throttle, fault("v100s_hw_thermal_gpu1")))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert "hw_thermal_slowdown" in finding.detail and "GPU 1 (00000000:00:0E.0)" in finding.detail
    healthy = only(judged(nvidia.judge_throttle, fixture(V100S)))
    assert healthy.detail == "8 GPUs, no clock slowdown; 2 at their power limit (normal under load)"


def test_throttle_lowered_power_limit_warns():
    text = fixture(V100S).replace(
        "<power_limit>250.00 W</power_limit>", "<power_limit>200.00 W</power_limit>"
    )
    findings = judged(nvidia.judge_throttle, text)
    assert [(f.status, f.action) for f in findings] == [("warn", "monitor")] * 2
    assert "-pl 250.0" in findings[0].fix


def test_every_finding_names_an_action_from_actions():
    for name in (n for n, (base, _) in FAULTS.items() if base.startswith("nvidia/")):
        for judge in nvidia.JUDGES:
            for finding in judged(judge, fault(name)):
                if finding.status in ("warn", "fail"):
                    assert finding.action in ACTIONS and finding.fix, (name, finding)


@pytest.mark.parametrize("judge", nvidia.JUDGES)
def test_missing_file_skips_with_the_probes_reason(judge):
    outputs = node(missing={FILE: "nvidia-smi: command not found"})
    finding = only(judge(outputs, NVIDIA8))
    assert (finding.status, finding.detail) == ("skip", "nvidia-smi: command not found")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "not XML"),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", "not XML"),
        (fixture(V100S)[:5000], "not XML (line"),
        ("<nvidia_smi_log><gpu><pci/></gpu></nvidia_smi_log>", "has no PCI bus id"),
        ("<gpus/>", "root element <gpus>, not <nvidia_smi_log>"),
        ("<nvidia_smi_log><attached_gpus>many</attached_gpus></nvidia_smi_log>", "not a number"),
        ('<!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>', "refused"),
        (
            '<!DOCTYPE nvidia_smi_log SYSTEM "http://example.invalid/x.dtd">'
            "<nvidia_smi_log>&e;</nvidia_smi_log>",
            "entity declaration or reference (refused)",
        ),
    ],
)
def test_garbage_and_truncated_are_unreadable_in_one_line(text, words):
    with pytest.raises(Unreadable) as info:
        judged(nvidia.judge_ecc, text)
    message = str(info.value)
    assert message.startswith(f"{FILE}: ") and words in message and "\n" not in message

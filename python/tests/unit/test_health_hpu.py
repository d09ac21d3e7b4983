"""doctor/health/hpu.py on a recorded Gaudi2 `hl-smi` query (fixtures/health/hpu/SOURCES.md)
and its edited fault copies."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dscluster.doctor.health import Expect, NodeOutputs, Unreadable, hpu

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "health" / "hpu"
FULL = "hl-smi-L-i_gaudi2_hl225_full.txt"
GAUDI = Expect(accelerator="gaudi", devices=1)


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def outputs(text: str | None, missing: str = "") -> NodeOutputs:
    files = {} if text is None else {hpu.FILE: text}
    return NodeOutputs("hpu1", files, {hpu.FILE: missing} if missing else {})


def test_the_recorded_block_parses_with_values_on_the_next_line():
    attached, (device,) = hpu.parse(recorded(FULL))
    assert attached == 8
    assert (device.index, device.name, device.bus_id) == (0, "accel0", "0000:43:00.0")
    assert device.get("Product Name") == "HL-225"
    assert device.get("PCI/Bus Id") == "0000:43:00.0"
    assert device.under("Clocks Throttle Reasons") == {
        "HW Slowdown": "Not Active",
        "Thermal Slowdown": "Not Active",
        "Power Slowdown": "Not Active",
    }
    assert device.get("Temperature/VRM2 Temp") == "39 C"
    assert device.under("Replaced Rows") == {
        "Single Bit ECC": "0",
        "Double Bit ECC": "0",
        "Pending": "No",
    }


def test_a_healthy_hpu_passes_with_its_hottest_sensor():
    (finding,) = hpu.judge_hpu(outputs(recorded(FULL)), GAUDI)
    assert finding.status == "pass"
    assert finding.detail == (
        "1 HPU(s): operational, not throttled, no pending row "
        "replacement; hottest sensor 39 C (VRM2 Temp, accel0)"
    )


def test_thermal_slowdown_warns_to_check_cooling():
    (finding,) = hpu.judge_hpu(
        outputs(recorded("hl-smi_gaudi2_thermal_slowdown_edited.txt")), GAUDI
    )
    assert (finding.status, finding.action) == ("warn", "monitor")
    assert finding.detail == "HPU 0 (accel0, 0000:43:00.0): clocks throttled (Thermal Slowdown)"
    assert "cooling" in finding.fix
    assert finding.evidence == "Clocks Throttle Reasons: Thermal Slowdown : Active"


def test_a_pending_row_replacement_asks_for_a_reset():
    (finding,) = hpu.judge_hpu(outputs(recorded("hl-smi_gaudi2_rows_pending_edited.txt")), GAUDI)
    assert (finding.status, finding.action) == ("fail", "reset")
    assert "row replacement is pending (2 double-bit ECC row(s))" in finding.detail
    assert "hl-smi -r -i 0000:43:00.0" in finding.fix


def test_count_against_the_inventory():
    (finding,) = hpu.judge_hpu_count(outputs(recorded(FULL)), GAUDI)
    assert finding.status == "pass"
    assert finding.detail == (
        "Gaudi: 1 HPU(s) described by hl-smi (expected 1) (the driver reports 8 attached)"
    )
    # The recording is of one device (`-i`): against the node's eight it is one short.
    (finding,) = hpu.judge_hpu_count(
        outputs(recorded(FULL)), Expect(accelerator="gaudi", devices=8)
    )
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail.startswith("Gaudi: hl-smi describes 1 of 8 expected HPUs")
    assert finding.evidence == "[0] AIP (accel0) 0000:43:00.0"


def test_count_says_nothing_on_other_accelerators():
    assert hpu.judge_hpu_count(outputs(None), Expect(accelerator="nvidia", devices=8)) == []


def test_missing_output_skips_with_the_probe_reason():
    (finding,) = hpu.judge_hpu(outputs(None, "hl-smi: not found"), GAUDI)
    assert (finding.status, finding.detail) == ("skip", "hl-smi: not found")
    (finding,) = hpu.judge_hpu_count(outputs(None, "hl-smi: not found"), GAUDI)
    assert finding.status == "skip"


def test_garbage_and_truncated_outputs_are_unreadable_in_one_line():
    with pytest.raises(Unreadable, match=r"^hl-smi-q.txt: no 'HL-SMI LOG' header"):
        hpu.judge_hpu(outputs("hl-smi: error while loading shared libraries\n"), GAUDI)
    text = recorded(FULL)
    cut = text[: text.index("        Temperature\n") + len("        Temperature\n")]
    with pytest.raises(Unreadable) as truncated:
        hpu.judge_hpu(outputs(cut), GAUDI)
    assert str(truncated.value) == (
        "hl-smi-q.txt: ends after 'Temperature' with no value (truncated?)"
    )
    head = text[: text.index("[0] AIP")]
    with pytest.raises(Unreadable, match=r"^hl-smi-q.txt: no AIP blocks$"):
        hpu.judge_hpu(outputs(head), GAUDI)
    cut = text[: text.index("        Product Name")]
    with pytest.raises(Unreadable, match=r"accel0 has no Product Name"):
        hpu.judge_hpu(outputs(cut + "        Model Number : F08GL0AIG032A\n"), GAUDI)


LINES = st.sampled_from(
    [
        "================ HL-SMI LOG ================",
        "Attached AIPs : 8",
        "[0] AIP (accel0) 0000:43:00.0",
        "        Product Name : HL-225",
        "        Temperature",
        "                [ 1] On Chip 0 :  29 C",
        "        Replaced Rows",
        "                Pending : Yes",
        "                        Thermal Slowdown",
        "                                        : Active",
        "",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.lists(LINES | st.text(max_size=20), max_size=14).map("\n".join))
def test_any_text_parses_or_is_unreadable(text):
    for judge in (hpu.judge_hpu, hpu.judge_hpu_count):
        try:
            judge(outputs(text), GAUDI)
        except Unreadable as exc:
            assert str(exc).startswith("hl-smi-q.txt: ") and "\n" not in str(exc)

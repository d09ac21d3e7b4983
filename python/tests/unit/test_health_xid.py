"""doctor/health/xid.py on recorded kernel logs (fixtures/health/xid/SOURCES.md): Xid and
SXid lines in every log format, each fault class, and unreadable logs."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dscluster.doctor.health import ACTIONS, Expect, NodeOutputs, Unreadable, xid

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "health" / "xid"
EXPECT = Expect(accelerator="nvidia", devices=8)


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def judge(text: str | None, missing: str = ""):
    files = {} if text is None else {xid.FILE: text}
    why = {xid.FILE: missing} if missing else {}
    return xid.judge_xid(NodeOutputs("gpu1", files, why), EXPECT)


def test_a_log_without_xid_passes_and_says_how_much_was_read():
    (finding,) = judge(recorded("journal-k_no-xid_gpud1209.txt"))
    assert finding.status == "pass"
    assert "no Xid or SXid" in finding.detail and "9 lines" in finding.detail


def test_the_probe_header_gives_the_count_of_lines_read_not_kept():
    # What doctor_probe.py records when the log held nothing a judge reads.
    head = "# dscluster doctor: 0 of 1234 lines of 'dmesg' kept, those the health judges read\n"
    (finding,) = judge(head)
    assert finding.status == "pass" and "1234 lines since boot" in finding.detail


def test_application_xids_warn_without_blaming_the_node():
    findings = judge(recorded("dmesg-ctime_xid13_xid109_gpud46.txt"))
    assert [(f.status, f.action) for f in findings] == [("warn", "monitor")] * 2
    x13 = next(f for f in findings if "Xid 13 " in f.detail)
    assert x13.detail.startswith("GPU 0000:cb:00: Xid 13 (graphics engine exception, caused by")
    assert "seen 3 times since boot" in x13.detail
    assert "not the node" in x13.detail and "nothing to do on the node" in x13.fix
    assert x13.evidence.startswith("[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13,")
    assert "Warp Exception" in x13.evidence  # the first of the three lines


def test_journal_lines_are_counted_per_gpu():
    findings = judge(recorded("journal-k_xid45_openrm1150.txt"))
    counts = {f.detail.split(": Xid")[0]: f.detail for f in findings}
    assert sorted(counts) == [
        "GPU 0000:97:00",
        "GPU 0000:ba:00",
        "GPU 0000:dc:00",
        "GPU 0000:ed:00",
    ]
    assert "seen 2 times" in counts["GPU 0000:dc:00"] and "seen once" in counts["GPU 0000:97:00"]
    assert {f.action for f in findings} == {"monitor"}
    assert "driver blames on an earlier Xid 149" in counts["GPU 0000:dc:00"]
    assert "earlier Xid 145" in counts["GPU 0000:ba:00"]


def test_fallen_off_the_bus_isolates_and_xid_154_asks_for_the_recovery_it_names():
    findings = judge(recorded("dmesg-t_xid79_xid154_openrm1151.txt"))
    assert [(f.status, f.action) for f in findings] == [("fail", "isolate"), ("fail", "reset")]
    x79, x154 = findings
    assert x79.detail == (
        "GPU 0000:01:00: Xid 79 (GPU has fallen off the bus), seen once since boot"
    )
    assert x79.evidence == "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
    assert "Xid 154" in x154.detail and "to 0x1 (PF FLR)" in x154.evidence
    assert "nvidia-smi -r -i 0000:01:00" in x154.fix


def test_fallen_off_the_bus_without_an_xid_counts_as_xid_79():
    (finding,) = judge(recorded("dmesg_fallen-off-no-xid_nvsentinel155.txt"))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail.startswith("GPU 0000:b3:00.0: Xid 79")
    assert finding.evidence == "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0"


@pytest.mark.parametrize(
    ("number", "status", "action", "words"),
    [
        (48, "fail", "reset", "double-bit ECC"),
        (63, "fail", "reset", "row remapping"),
        (64, "fail", "isolate", "spare rows are used up"),
        (74, "fail", "reset", "NVLink"),
        (92, "warn", "monitor", "single-bit ECC error rate"),
        (94, "fail", "reset", "contained ECC"),
        (95, "fail", "reset", "uncontained ECC"),
        (119, "fail", "reset", "GSP"),
        (999, "warn", "monitor", "not in dscluster's table"),
    ],
)
def test_each_fault_class_on_an_edited_real_line(number, status, action, words):
    findings = judge(recorded(f"dmesg-ctime_xid{number}_edited.txt"))
    edited = next(f for f in findings if f"Xid {number} " in f.detail)
    assert (edited.status, edited.action) == (status, action)
    assert words in edited.detail
    assert f"): {number}, pid=1797828" in edited.evidence
    # the three real Xid 13 lines of the same recording are still reported
    assert any("Xid 13 " in f.detail and "seen 3 times" in f.detail for f in findings)
    if status == "fail":
        assert findings[0] is edited


def test_findings_are_ordered_most_drastic_first():
    findings = judge(recorded("dmesg-ctime_xid64_edited.txt"))
    ranks = [ACTIONS.index(f.action) for f in findings]
    assert ranks == sorted(ranks)


def test_sxid_non_fatal_warns_per_switch_and_fatal_fails():
    (warn,) = judge(recorded("dmesg_sxid22013_nvtrust124.txt"))
    assert (warn.status, warn.action) == ("warn", "monitor")
    assert warn.detail.startswith("NVSwitch 0000:02:00.0: SXid 22013")
    assert "seen 4 times" in warn.detail
    assert warn.evidence.endswith("22013, Non-fatal, Link 00 Minion Link DLREQ interrupt")
    (fail,) = judge(recorded("dmesg_sxid22013_fatal_edited.txt"))
    assert (fail.status, fail.action) == ("fail", "reboot")
    assert "fatal SXid 22013" in fail.detail and "NVSwitches" in fail.fix


def test_sxid_in_dmesg_decode_iso_format():
    (finding,) = judge(recorded("dmesg-decode-iso_sxid12028_gpud338.txt"))
    assert finding.detail.startswith("NVSwitch 0000:84:00.0: SXid 12028")
    assert finding.evidence.startswith("kern  :err   : 2025-01-25T10:34:54")


def test_missing_log_skips_with_the_probe_reason():
    (finding,) = judge(None, missing="dmesg: read kernel buffer failed: Operation not permitted")
    assert finding.status == "skip"
    assert finding.detail == "dmesg: read kernel buffer failed: Operation not permitted"
    (finding,) = judge(None)
    assert finding.status == "skip" and "kernel.log was not recorded" in finding.detail


def test_a_refused_or_empty_log_is_a_skip_not_a_pass():
    (finding,) = judge("dmesg: read kernel buffer failed: Operation not permitted\n")
    assert finding.status == "skip" and "could not be read" in finding.detail
    (finding,) = judge("")
    assert finding.status == "skip" and "containers often cannot read dmesg" in finding.detail


def test_coloured_dmesg_is_still_a_log():
    text = recorded("dmesg_sxid22013_nvtrust124.txt")
    coloured = "".join(f"\x1b[32m{line[:15]}\x1b[0m{line[15:]}\n" for line in text.splitlines())
    (finding,) = judge(coloured)
    assert finding.detail.startswith("NVSwitch 0000:02:00.0: SXid 22013")


def test_garbage_and_truncated_logs_are_unreadable_in_one_line():
    with pytest.raises(Unreadable) as garbage:
        judge(bytes(range(256)).decode("latin-1") * 4)
    assert str(garbage.value) == "kernel.log: binary data, not a kernel log"
    text = recorded("dmesg-ctime_xid13_xid109_gpud46.txt")
    cut = text[: text.index("): 109,") - 4]
    with pytest.raises(Unreadable) as truncated:
        judge(cut)
    message = str(truncated.value)
    assert message.startswith("kernel.log: truncated Xid line 5: ") and "\n" not in message


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=400)
    | st.builds(
        lambda a, b: a + "NVRM: Xid (PCI:0000:1b:00): " + b,
        st.text(max_size=30),
        st.text(max_size=30),
    )
    | st.builds(lambda a: "nvidia-nvswitch0: SXid (PCI:0000:02:00.0): " + a, st.text(max_size=30))
)
def test_any_text_parses_or_is_unreadable(text):
    try:
        findings = judge(text)
    except Unreadable as exc:
        assert str(exc).startswith("kernel.log: ") and "\n" not in str(exc)
    else:
        assert findings and all(f.status in ("pass", "skip", "warn", "fail") for f in findings)

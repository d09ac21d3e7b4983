"""doctor/health/dcgm.py on a recorded `dcgmi diag -j` output (fixtures/health/dcgm/SOURCES.md)
and its edited fault copies."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dscluster.doctor.health import Expect, NodeOutputs, Unreadable, dcgm

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "health" / "dcgm"
PASS = "dcgmi-diag_8gpu_pass_dcgm310.json"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def judge(text: str | None, missing: str = ""):
    files = {} if text is None else {dcgm.FILE: text}
    why = {dcgm.FILE: missing} if missing else {}
    return dcgm.judge_dcgm(NodeOutputs("gpu1", files, why), Expect(accelerator="nvidia"))


def test_the_recorded_run_parses_past_its_warning_line_and_nulls():
    version, results = dcgm.parse(recorded(PASS))
    assert version == "3.1.0"
    assert len(results) == 9 + 8  # nine deployment checks for all GPUs, software per GPU
    assert {r.status for r in results} == {"pass"}
    assert results[0] == dcgm.Result("Deployment", "Denylist", "0,1,2,3,4,5,6,7", "pass", "")
    assert [r.gpus for r in results if r.test == "software"] == [str(i) for i in range(8)]


def test_all_pass_names_the_level():
    (finding,) = judge(recorded(PASS))
    assert finding.status == "pass"
    assert finding.detail == (
        "DCGM 3.1.0 diagnostic, level 1 (from the tests run): 10 test(s) passed"
    )


def test_dcgm_4_names_the_top_object_differently():
    text = recorded(PASS).replace('"DCGM GPU Diagnostic"', '"DCGM Diagnostic"')
    (finding,) = judge(text)
    assert finding.status == "pass" and finding.detail.startswith("DCGM 3.1.0 diagnostic")


def test_a_failed_memory_check_isolates_the_node():
    (finding,) = judge(recorded("dcgmi-diag_8gpu_rowremap_fail_edited.json"))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail == (
        "GPUs 0,1,2,3,4,5,6,7: DCGM test 'Page Retirement/Row Remap' (Deployment) failed"
    )
    assert finding.evidence == "Deployment / Page Retirement/Row Remap: fail"


def test_a_warning_on_one_gpu_is_watched():
    (finding,) = judge(recorded("dcgmi-diag_8gpu_software_gpu3_warn_edited.json"))
    assert (finding.status, finding.action) == ("warn", "monitor")
    assert finding.detail == "GPU 3: DCGM test 'software' warned"


@pytest.mark.parametrize(
    ("test", "category", "action"),
    [
        ("GPU Memory", "Hardware", "isolate"),
        ("Memtest", "Hardware", "isolate"),
        ("PCIe", "Integration", "reset"),
        ("Targeted Stress", "Stress", "reset"),
        ("Persistence Mode", "Deployment", "isolate"),
    ],
)
def test_the_action_follows_the_kind_of_test(test, category, action):
    assert dcgm._action(dcgm.Result(category, test, "0", "fail", ""))[0] == action


def test_every_test_skipped_is_a_warning_not_a_pass():
    doc = json.loads(recorded(PASS)[recorded(PASS).index("{") :])
    for category in doc["DCGM GPU Diagnostic"]["test_categories"]:
        for test in filter(None, category["tests"]):
            for result in test["results"]:
                result["status"] = "SKIP"
    (finding,) = judge(json.dumps(doc))
    assert (finding.status, finding.action) == ("warn", "monitor")
    assert "every one of 17 test results was skipped" in finding.detail


def test_missing_output_skips_with_the_probe_reason():
    (finding,) = judge(None, missing="dcgmi: not found")
    assert (finding.status, finding.detail) == ("skip", "dcgmi: not found")


def test_garbage_and_truncated_outputs_are_unreadable_in_one_line():
    with pytest.raises(Unreadable, match=r"^dcgmi-diag.json: no JSON object in the output$"):
        judge("Error: unable to connect to host engine\n")
    text = recorded(PASS)
    with pytest.raises(Unreadable) as truncated:
        judge(text[: len(text) // 2])
    assert str(truncated.value).startswith("dcgmi-diag.json: not JSON (line ")
    assert "\n" not in str(truncated.value)
    with pytest.raises(Unreadable, match=r"no 'DCGM GPU Diagnostic' object"):
        judge('{"error": "timeout"}')
    last = text.rindex('"PASS"')
    with pytest.raises(Unreadable, match=r"test 'software' has status 'MAYBE'"):
        judge(text[:last] + '"MAYBE"' + text[last + len('"PASS"') :])


JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.sampled_from(["Pass", "FAIL", "Warn", "skip", "DCGM GPU Diagnostic"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "DCGM GPU Diagnostic",
                    "DCGM Diagnostic",
                    "test_categories",
                    "category",
                    "tests",
                    "name",
                    "results",
                    "status",
                    "gpu_id",
                    "warnings",
                    "version",
                    "test_summary",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | JSONISH.map(json.dumps))
def test_any_text_parses_or_is_unreadable(text):
    try:
        judge(text)
    except Unreadable as exc:
        assert str(exc).startswith("dcgmi-diag.json: ") and "\n" not in str(exc)

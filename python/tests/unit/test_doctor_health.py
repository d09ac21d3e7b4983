"""The node health checks' plumbing: the registry's judges run over each live node's recorded
outputs and become cells (worst status wins, the action leads the detail, fixes collected);
`doctor --record DIR` writes what `doctor --replay DIR` judges again, contacting nothing;
a bad DIR or a garbled file is one line naming it. The judges' own tests are in their
families' test files."""

from __future__ import annotations

import json
import os
import stat

import pytest

from dscluster import doctor
from dscluster.cli import main
from dscluster.doctor import record
from dscluster.doctor.health import (
    FILES,
    Expect,
    Finding,
    NodeOutputs,
    Unreadable,
    hpu,
    nvidia,
    registry,
)
from dscluster.errors import DsclusterError

from .test_doctor import HOSTS, healthy, judge, node, set_node

LSPCI = "00:00.0 Host bridge: Intel Corporation 440FX - 82441FX PMC [Natoma] (rev 02)\n"
XID79 = "[ 50.1] NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, GPU has fallen off the bus.\n"


def with_health(findings, host, files, missing=None) -> None:
    data = node(findings, host)
    index = {n: {"argv": [n], "rc": 0, "seconds": 0.1} for n in files}
    for name, why in (missing or {}).items():
        index[name] = {"argv": [name], "rc": None, "seconds": 0.0, "missing": why}
    data["health"] = {"files": files, "index": index}
    set_node(findings, host, data)


def cpu_health() -> dict:
    """Every file as a CPU node's probe records it: a kernel log, lspci, no vendor tools."""
    missing = {n: f"{n.split('-')[0].split('.')[0]}: not found" for n in FILES}
    del missing["kernel.log"], missing["lspci-vvv.txt"]
    return missing


@pytest.fixture
def judges(monkeypatch):
    """Small judges in place of the families' (registry.JUDGES), one of them broken."""

    def xid(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
        text = outputs.text("kernel.log")
        if text is None:
            return [outputs.skip("kernel.log")]
        if "\x00" in text:
            raise Unreadable("kernel.log: not text (a NUL byte)")
        if "Xid" in text and ": 79," in text:
            return [
                Finding("pass", "GPU 0 (0000:1b:00.0): no Xid"),
                Finding(
                    "fail",
                    "GPU 3 (0000:5d:00.0) fell off the bus (Xid 79)",
                    "isolate",
                    "reseat or replace GPU 3; reboot to bring it back",
                    evidence=text.strip(),
                ),
            ]
        return [Finding("pass", "no Xid since boot")]

    def ecc(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
        return [Finding("warn", "GPU 1: 3 lifetime ECC errors", "monitor", "watch the count")]

    def broken(outputs: NodeOutputs, expect: Expect) -> list[Finding]:
        raise KeyError("oops")

    monkeypatch.setitem(registry.JUDGES, "xid", xid)
    monkeypatch.setitem(registry.JUDGES, "ecc", ecc)
    monkeypatch.setitem(registry.JUDGES, "topology", broken)
    return xid


# ---- registry and evaluate ------------------------------------------------------------------


def test_the_health_checks_are_in_the_report_with_a_line_each():
    for check in ("gpu_count", "xid", "ecc", "pcie", "throttle", "nvlink", "topology"):
        assert check in doctor.CHECKS
    for check in ("fabric", "dcgm", "hpu"):
        assert check in doctor.CHECKS
    assert all(doctor.CHECKS[c] and "\n" not in doctor.CHECKS[c] for c in registry.CHECKS)
    assert list(doctor.CHECKS)[-len(registry.CHECKS) :] == list(registry.CHECKS)


def test_gpu_count_skips_on_a_cpu_node_and_picks_the_family_judge(monkeypatch):
    outputs = NodeOutputs("n1", {})
    assert registry.judge_node(outputs, Expect())["gpu_count"] == [
        Finding("skip", "no accelerators expected (cpu node)")
    ]
    seen = []
    monkeypatch.setattr(nvidia, "judge_gpu_count", lambda o, e: seen.append("nv") or [])
    monkeypatch.setattr(hpu, "judge_hpu_count", lambda o, e: seen.append("hpu") or [])
    registry.judge_node(outputs, Expect(accelerator="nvidia", devices=8))
    registry.judge_node(outputs, Expect(accelerator="gaudi", devices=8))
    assert seen == ["nv", "hpu"]


def test_every_check_has_its_judge():
    assert set(registry.JUDGES) == set(registry.CHECKS)


def test_a_cpu_cluster_passes_with_the_health_checks_skipped_not_failed():
    f = healthy()
    for host in HOSTS:
        with_health(f, host, {"kernel.log": "", "lspci-vvv.txt": LSPCI}, cpu_health())
    report = judge(f)
    assert report.ok, doctor.problem_lines(report)
    assert report.cell("gpu_count", "n1").status == "skip"
    assert report.cell("gpu_count", "n1").details == ["no accelerators expected (cpu node)"]
    assert all(report.cell(c, h).status in ("pass", "skip") for c in registry.CHECKS for h in HOSTS)
    assert doctor.summary_line(report) == "doctor: every check passed on 3 nodes"
    # the table shows "skip"; one line per reason names the checks and where
    skips = doctor.skip_lines(report)
    assert "SKIP gpu_count on every node: no accelerators expected (cpu node)" in skips
    assert len(skips) == len(set(skips))


def test_skip_lines_group_by_reason_and_nodes():
    report = doctor.DoctorReport(hosts=["n1", "n2", "n3"], head="n1", cells={})
    for host in ("n1", "n2", "n3"):
        report.cell("ecc", host).add("skip", "nvidia-smi not found")
        report.cell("pcie", host).add("skip", "nvidia-smi not found")
    report.cell("fabric", "n2").add("skip", "no fi_info")
    report.cell("fabric", "n1").add("pass", "")
    assert doctor.skip_lines(report) == [
        "SKIP ecc, pcie on every node: nvidia-smi not found",
        "SKIP fabric on n2: no fi_info",
    ]


def test_findings_become_cells_worst_wins_action_leads_fixes_collected(judges):
    f = healthy()
    with_health(f, "n2", {"kernel.log": XID79}, cpu_health())
    report = judge(f)
    assert ("n2", "xid") in report.failed()
    cell = report.cell("xid", "n2")
    assert cell.details == ["isolate: GPU 3 (0000:5d:00.0) fell off the bus (Xid 79)"]
    assert cell.fixes == ["reseat or replace GPU 3; reboot to bring it back"]
    assert cell.evidence == [XID79.strip()]
    assert report.to_json()["checks"]["xid"]["n2"]["evidence"] == [XID79.strip()]
    assert report.cell("ecc", "n1").status == "warn"
    assert report.cell("ecc", "n1").details == ["monitor: GPU 1: 3 lifetime ECC errors"]
    lines = doctor.problem_lines(report)
    assert (
        "FAIL n2 xid: isolate: GPU 3 (0000:5d:00.0) fell off the bus (Xid 79) — fix: reseat "
        "or replace GPU 3; reboot to bring it back"
    ) in lines
    # a judge's own bug fails its check on each node, and nothing else
    assert report.cell("topology", "n1").status == "fail"
    assert "the topology judge failed (KeyError" in report.cell("topology", "n1").details[0]
    assert report.cell("pcie", "n1").status in ("pass", "skip")


def test_a_garbled_file_is_one_line_naming_the_node_and_the_file(judges):
    f = healthy()
    with_health(f, "n3", {"kernel.log": "NVRM\x00\x00"}, cpu_health())
    report = judge(f)
    assert report.cell("xid", "n3").details == [
        "n3: kernel.log cannot be read: not text (a NUL byte); record again with "
        "'dscluster doctor --record DIR'"
    ]


def test_a_node_whose_probe_recorded_nothing_skips_with_the_reason(judges):
    f = healthy()  # an older probe: no "health" in its node JSON
    report = judge(f)
    assert report.cell("xid", "n1").status == "skip"
    assert (
        "the doctor probe on n1 recorded no health outputs" in report.cell("xid", "n1").details[0]
    )


def test_an_unreachable_node_skips_the_health_checks():
    f = healthy()
    report = judge(f, unreachable={"n3": "ssh: connect timed out"})
    assert report.cell("xid", "n3").details == ["node not reachable"]


@pytest.mark.parametrize(
    ("facts", "live", "slots", "want"),
    [
        ({"accelerators": {"kind": "cuda", "count": 8}}, {"kind": "cpu"}, None, ("nvidia", 8)),
        ({"accelerators": {"kind": "cuda", "count": 8}}, None, 4, ("nvidia", 4)),
        ({"accelerators": {"kind": "hpu", "count": 8}}, None, None, ("gaudi", 8)),
        (None, {"kind": "cuda", "count": 2}, None, ("nvidia", 2)),
        ({"accelerators": {"kind": "cpu", "count": 0}}, None, None, ("cpu", None)),
        (None, None, None, ("cpu", None)),
    ],
)
def test_expect_comes_from_the_recorded_facts_then_the_node(facts, live, slots, want):
    expect = record.expect_for("n1", facts, live, slots, "p5.48xlarge")
    assert (expect.accelerator, expect.devices) == want
    assert expect.efa is None and expect.instance_type == "p5.48xlarge"


# ---- --record and --replay -------------------------------------------------------------------


def recorded_cluster() -> dict:
    f = healthy()
    with_health(f, "n1", {"kernel.log": "", "lspci-vvv.txt": LSPCI}, cpu_health())
    with_health(f, "n2", {"kernel.log": XID79, "lspci-vvv.txt": LSPCI}, cpu_health())
    with_health(f, "n3", {"kernel.log": ""}, cpu_health())
    return f


def test_record_then_replay_gives_the_same_verdicts(judges, tmp_path):
    f = recorded_cluster()
    recs = record.recordings(HOSTS, f, recorded={"n1": {"accelerators": {"kind": "cpu"}}})
    live = judge(f, health=recs)
    out = tmp_path / "rec"
    record.write_record(out, recs)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE((out / "n2").stat().st_mode) == 0o700
    assert (out / "n2" / "kernel.log").read_text() == XID79
    for path in out.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    index = json.loads((out / "n2" / "probe.json").read_text())
    assert index["nvidia-smi-q.xml"]["missing"] == "nvidia: not found"
    assert json.loads((out / "n2" / "expect.json").read_text())["accelerator"] == "cpu"

    again = record.read_record(out)
    assert list(again) == HOSTS
    assert again["n2"].outputs == recs["n2"].outputs
    assert again["n2"].expect == recs["n2"].expect
    replayed = record.replay(out)
    assert replayed.checks == list(registry.CHECKS)
    for check in registry.CHECKS:
        for host in HOSTS:
            assert replayed.cell(check, host) == live.cell(check, host), (check, host)
    assert replayed.failed() == {(h, c) for h, c in live.failed() if c in registry.CHECKS}


def test_replay_on_the_command_line_prints_the_table_and_exits_by_the_verdict(
    judges, tmp_path, capsys
):
    out = tmp_path / "rec"
    record.write_record(out, record.recordings(HOSTS, recorded_cluster(), recorded={}))
    assert main(["doctor", "--replay", str(out)]) == 1
    text = capsys.readouterr().out
    assert f"doctor --replay {out}: 3 nodes" in text
    assert "FAIL n2 xid: isolate: GPU 3 (0000:5d:00.0) fell off the bus (Xid 79)" in text
    assert "reseat or replace GPU 3" in text
    assert "│ ssh" not in text  # the health checks only
    assert main(["doctor", "--replay", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert set(report["checks"]) == set(registry.CHECKS)
    assert {(x["host"], x["check"]) for x in report["failures"]} >= {("n2", "xid")}


def test_a_healthy_replay_exits_0(tmp_path, capsys):
    out = tmp_path / "rec"
    f = healthy()
    for host in HOSTS:
        with_health(f, host, {"kernel.log": ""}, cpu_health())
    record.write_record(out, record.recordings(HOSTS, f))
    assert main(["doctor", "--replay", str(out)]) == 0
    assert "doctor: every check passed on 3 nodes" in capsys.readouterr().out


def test_a_directory_made_by_hand_replays(judges, tmp_path):
    (tmp_path / "gpu7").mkdir()
    (tmp_path / "gpu7" / "kernel.log").write_text(XID79)
    (tmp_path / "gpu7" / "nvidia-smi-q.xml").write_text("<?xml?><log/>")
    (tmp_path / "README").write_text("sent by the admin\n")
    recs = record.read_record(tmp_path)
    assert list(recs) == ["gpu7"]
    assert recs["gpu7"].expect == Expect(accelerator="nvidia")
    assert "not recorded" in recs["gpu7"].outputs.why_missing("hl-smi-q.txt")
    assert record.replay(tmp_path).failed() >= {("gpu7", "xid")}


def fresh(tmp_path, *hosts: str):
    d = tmp_path / "rec"
    d.mkdir()
    for host in hosts:
        (d / host).mkdir()
    return d


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "nope", "No such file or directory"),
        (lambda p: (p / "f").write_text("x") and p / "f", "is not a directory"),
        (lambda p: os.symlink(fresh(p, "n1"), p / "l") or p / "l", "is a symbolic link"),
        (fresh, "holds no host folders"),
        (lambda p: fresh(p, "n1", "bad name"), "'bad name' is not a host name"),
        (lambda p: fresh(p, "-rf"), "'-rf' is not a host name"),
    ],
)
def test_a_bad_replay_dir_is_one_line_naming_it(tmp_path, make, needle, capsys):
    path = make(tmp_path)
    with pytest.raises(DsclusterError, match=needle):
        record.read_record(path)
    assert main(["doctor", "--replay", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "Traceback" not in err[0], err


def test_a_linked_host_folder_or_file_is_refused(tmp_path):
    d = fresh(tmp_path, "n1")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", d / "n2")
    with pytest.raises(DsclusterError, match="n2 is a symbolic link"):
        record.read_record(d)
    os.unlink(d / "n2")
    os.symlink("/etc/passwd", d / "n1" / "kernel.log")
    with pytest.raises(DsclusterError, match=r"n1/kernel.log cannot be read \(a symbolic link\)"):
        record.read_record(d)


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("probe.json", "{not json", "n1/probe.json is not JSON"),
        ("probe.json", "[]", "n1/probe.json is not a JSON object"),
        ("expect.json", '{"accelerator": "tpu"}', "accelerator='tpu'; give nvidia, gaudi or cpu"),
        ("expect.json", '{"devices": "eight"}', "devices='eight'"),
        ("expect.json", '{"gpus": 8}', "gpus=8"),
    ],
)
def test_unreadable_json_in_a_host_folder_names_the_file(tmp_path, name, text, needle):
    d = fresh(tmp_path, "n1")
    (d / "n1" / name).write_text(text)
    with pytest.raises(DsclusterError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        record.read_record(d)


def test_record_refuses_a_dir_in_use_before_anything_runs(tmp_path, capsys):
    used = fresh(tmp_path, "n1")
    link = tmp_path / "link"
    os.symlink(tmp_path / "empty-target", link)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for path, needle in ((used, "is not empty"), (link, "symbolic link"), (afile, "is a file")):
        # no inventory exists: the refusal comes first, in one line
        assert main(["doctor", "-i", str(tmp_path / "noinv"), "--record", str(path)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and str(path) in err[0], err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert record.check_record_dir(empty) == empty


def test_replay_needs_no_inventory_and_doctor_without_either_says_so(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["doctor"])
    assert "--inventory (or --replay DIR)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["doctor", "--record", "a", "--replay", "b", "-i", "x"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0), ("90", 90), ("90s", 90), ("2m", 120), ("1h", 3600)]
)
def test_gpu_diag_budget_reads_durations(text, seconds):
    from dscluster.cli.doctor import budget_type  # noqa: PLC0415

    assert budget_type(text) == seconds


@pytest.mark.parametrize("text", ["two minutes", "-1", "25h", "1.5m"])
def test_gpu_diag_budget_refuses_what_is_not_a_duration(text, capsys):
    with pytest.raises(SystemExit):
        main(["doctor", "-i", "x", "--gpu-diag-budget", text])
    assert "--gpu-diag-budget" in capsys.readouterr().err


def test_run_doctor_passes_the_budget_and_records(monkeypatch, inventory_dir, tmp_path):
    """The play gets the budget (and the time for it); --record writes the live outputs."""
    from io import StringIO  # noqa: PLC0415

    from rich.console import Console  # noqa: PLC0415

    from dscluster import inventory, runner  # noqa: PLC0415

    hosts = ["node-a", "node-b", "node-c"]
    f = healthy()
    findings = {new: f[old] for new, old in zip(hosts, HOSTS, strict=True)}
    for host in hosts:
        with_health(findings, host, {"kernel.log": ""}, cpu_health())
    seen = {}

    def play(name, inv, *, extravars, timeout, **kw):
        seen.update(extravars, timeout=timeout)
        return runner.PlaybookResult(
            status="successful",
            rc=0,
            hosts={},
            failures=[],
            artifacts={"doctor_findings": findings},
        )

    monkeypatch.setattr(runner, "run_playbook", play)
    # as the AWS source writes them: the instance type and the EFA interfaces attached
    hosts_yml = inventory_dir / "hosts.yml"
    hosts_yml.write_text(
        hosts_yml.read_text().replace(
            "node-a: {}",
            "node-a: {dscluster_instance_type: p4d.24xlarge, dscluster_expected_efa: 1}",
        )
    )
    out = tmp_path / "rec"
    doctor.run_doctor(
        inventory.load(inventory_dir),
        console=Console(file=StringIO()),
        gpu_diag_budget=120,
        record=out,
    )
    assert seen["doctor_gpu_diag_budget"] == 120 and seen["timeout"] == 720
    assert sorted(p.name for p in out.iterdir()) == hosts
    assert (out / "node-b" / "kernel.log").read_text() == ""
    # what provision recorded (facts/<host>.json) says what each node should have
    expect = {h: json.loads((out / h / "expect.json").read_text()) for h in hosts}
    assert (expect["node-a"]["accelerator"], expect["node-a"]["devices"]) == ("nvidia", 4)
    assert (expect["node-c"]["accelerator"], expect["node-c"]["devices"]) == ("cpu", None)
    assert (expect["node-a"]["efa"], expect["node-a"]["instance_type"]) == (1, "p4d.24xlarge")
    assert expect["node-b"]["efa"] is None


def test_a_narrow_terminal_lists_each_node_on_one_line_with_the_gpu_skips_counted():
    from .test_doctor import render  # noqa: PLC0415

    hosts = [f"scale-n{i}" for i in range(1, 17)]
    report = doctor.DoctorReport(hosts=hosts, head=hosts[0], cells={})
    for host in hosts:
        for check in doctor.CHECKS:
            report.cell(check, host)
        for check in ("gpu_count", "ecc", "pcie", "throttle", "nvlink", "topology", "dcgm", "hpu"):
            report.cell(check, host).add("skip", "nvidia-smi: not found")
    report.cell("xid", "scale-n4").add("fail", "isolate: GPU 3 fell off the bus (Xid 79)")
    lines = render(doctor.table(report, 80), 80)
    assert all(len(line) <= 80 for line in lines), lines
    rows = [line for line in lines if line.startswith("│ scale-n")]
    assert len(rows) == len(hosts), lines  # one line each: no list of skips wrapping
    n4 = next(r for r in rows if r.split()[1] == "scale-n4")
    assert [c.strip() for c in n4.split("│")[2:-1]] == [
        str(len(doctor.CHECKS) - 9),
        "8",
        "0",
        "1",
        "xid fail",
    ]


def test_the_wide_table_sets_the_health_checks_apart():
    from .test_doctor import render  # noqa: PLC0415

    report = doctor.DoctorReport(hosts=HOSTS, head="n1", cells={})
    lines = render(doctor.table(report, 200), 200)
    ifname = next(i for i, line in enumerate(lines) if line.startswith("│ ifname "))
    assert lines[ifname + 1].startswith("├")  # a rule between the two groups
    assert lines[ifname + 2].startswith("│ gpu_count ")


def test_an_unreadable_file_is_one_line_per_node_and_file():
    """nvidia-smi-q.xml feeds four checks: the first fails with the line, the others skip
    pointing at it (issue 77: it was said four times)."""
    outputs = NodeOutputs("n2", {"nvidia-smi-q.xml": "<nvidia_smi_log><gpu>"})
    results = registry.judge_node(outputs, Expect(accelerator="nvidia", devices=2))
    readers = ("gpu_count", "ecc", "pcie", "throttle")
    failing = [c for c in readers if results[c][0].status == "fail"]
    assert failing == ["gpu_count"], results
    (line,) = [f.detail for c in readers for f in results[c] if "cannot be read:" in f.detail]
    assert line.startswith("n2: nvidia-smi-q.xml cannot be read: ")
    for check in readers[1:]:
        assert results[check] == [
            Finding("skip", "nvidia-smi-q.xml cannot be read (see gpu_count)")
        ], check

"""doctor's judging (dscluster.doctor.evaluate) on findings shaped as the doctor role writes
them; the end-to-end faults on real nodes are in test_e2e_doctor.py."""

from __future__ import annotations

import json
import pathlib

import pytest

from dscluster import doctor
from dscluster.cli import main

HOSTS = ["n1", "n2", "n3"]
ADDR = {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}
MANIFEST = {
    "python": "3.11.2",
    "torch": "2.13.0+cpu",
    "deepspeed": "0.19.8",
    "installed_ops": ["async_io", "cpu_adam"],
    "accelerator": "cpu",
    "cuda": "",
    "nccl": "",
    "nvidia_driver": "",
    "synapseai": "",
    "libfabric": "",
    "lock_sha256": "ab" * 32,
}


def cmd(obj) -> dict:
    return {"rc": 0, "stdout": json.dumps(obj), "stderr": ""}


def healthy() -> dict[str, dict]:
    findings = {}
    for host in HOSTS:
        node = {
            "hostname": host,
            "resolve": {h: {"expected": a, "addresses": [a], "rc": 0} for h, a in ADDR.items()},
            "shm": {"size_bytes": 1 << 30},
            "disk": {"/opt/dscluster/venv": {"free_bytes": 50 << 30}},
            "versions": dict(MANIFEST),
            "libaio": {"ldconfig": True, "async_io_op": "/x/async_io_op.so", "missing_libs": []},
            "ifname": {"GLOO_SOCKET_IFNAME": {"spec": "eth0", "matched": ["eth0"]}},
            "accelerators": {"kind": "cpu", "count": 0},
            "shared": {"path": "/shared/.t", "read": "tok"},
        }
        connect = [
            {"host": peer, "port": port, "kind": "ephemeral", "ok": True}
            for peer in HOSTS
            if peer != host
            for port in (32768, 46883, 60999)
        ]
        if host != "n1":
            connect.append({"host": "n1", "port": 29500, "kind": "rendezvous", "ok": True})
        findings[host] = {
            "node": cmd(node),
            "listen": {
                "rendezvous": 29500 if host == "n1" else None,
                "busy": [],
                "ephemeral": [32768, 46883, 60999],
                "range": [32768, 60999],
            },
            "connect": cmd({"results": connect}),
            "ssh": cmd(
                {"user": "ds", "results": {h: {"ok": True, "offset_s": 0.001} for h in HOSTS}}
            ),
            "pdsh": cmd({"installed": True, "memlock": dict.fromkeys(HOSTS, "8192"), "errors": {}})
            if host == "n1"
            else {"skipped": True},
        }
    return findings


def node(findings, host) -> dict:
    return json.loads(findings[host]["node"]["stdout"])


def set_node(findings, host, data) -> None:
    findings[host]["node"] = cmd(data)


def fail_connects(findings, src: str, error: str, **match) -> None:
    """src's port probes whose fields equal `match` (host=, kind=, port=) fail with `error`."""
    res = json.loads(findings[src]["connect"]["stdout"])
    for r in res["results"]:
        if all(r.get(k) == v for k, v in match.items()):
            r.update(ok=False, error=error)
    findings[src]["connect"] = cmd(res)


def fail_ssh(findings, src: str, dst: str, error: str) -> None:
    ssh = json.loads(findings[src]["ssh"]["stdout"])
    ssh["results"][dst] = {"ok": False, "error": error}
    findings[src]["ssh"] = cmd(ssh)


def judge(findings, **kw) -> doctor.DoctorReport:
    kw.setdefault("hostfile_slots", dict.fromkeys(HOSTS, 1))
    kw.setdefault("cpu_slots", dict.fromkeys(HOSTS, 1))
    kw.setdefault("shared_storage", True)
    kw.setdefault("token", "tok")
    return doctor.evaluate(HOSTS, "n1", findings, **kw)


def test_healthy_cluster_passes_every_check():
    report = judge(healthy())
    assert report.ok, doctor.problem_lines(report)
    assert not report.problems("warn")
    assert all(report.cell(c, h).status == "pass" for c in doctor.CLUSTER_CHECKS for h in HOSTS)
    # no health outputs recorded here (test_doctor_health.py): those checks skip
    assert all(report.cell(c, h).status == "skip" for c in doctor.HEALTH_CHECKS for h in HOSTS)
    assert doctor.summary_line(report) == "doctor: every check passed on 3 nodes"


def test_known_hosts_entry_missing_blames_the_source_and_says_the_fix():
    f = healthy()
    fail_ssh(f, "n2", "n3", "Host key verification failed.")
    report = judge(f)
    assert report.failed() == {("n2", "ssh")}
    cell = report.cell("ssh", "n2")
    assert cell.details == ["n2 → n3: Host key verification failed."]
    assert "ssh_known_hosts" in cell.fixes[0]
    assert "cluster_ssh" in cell.fixes[0]


def test_a_target_nobody_logs_in_to_is_blamed_not_its_sources():
    f = healthy()
    for src in HOSTS:
        fail_ssh(f, src, "n2", "Connection refused")
    report = judge(f)
    assert report.failed() == {("n2", "ssh")}
    assert "no node can log in to n2" in report.cell("ssh", "n2").details[0]


def test_unreachable_node_fails_reach_only_and_is_not_blamed_elsewhere():
    f = healthy()
    del f["n3"]
    for src in ("n1", "n2"):
        fail_ssh(f, src, "n3", "No route to host")
    pdsh = json.loads(f["n1"]["pdsh"]["stdout"])
    del pdsh["memlock"]["n3"]
    f["n1"]["pdsh"] = cmd(pdsh)
    report = judge(f, unreachable={"n3": "Failed to connect to the host via ssh"})
    assert report.failed() == {("n3", "reach")}
    assert report.cell("ssh", "n3").status == "skip"
    assert "allow-degraded" in report.cell("reach", "n3").fixes[0]


def test_version_skew_names_the_field_and_the_odd_node_out():
    f = healthy()
    data = node(f, "n3")
    data["versions"]["deepspeed"] = "0.19.7"
    set_node(f, "n3", data)
    report = judge(f)
    assert report.failed() == {("n3", "versions")}
    assert report.cell("versions", "n3").details == ["deepspeed 0.19.7 here, 0.19.8 on n1, n2"]


def test_version_tie_sides_with_the_head():
    hosts = ["n1", "n2"]
    f = {h: healthy()[h] for h in hosts}
    data = node(f, "n1")
    data["versions"]["installed_ops"] = ["cpu_adam"]
    set_node(f, "n1", data)
    report = doctor.evaluate(hosts, "n1", f)
    assert ("n2", "versions") in report.failed()
    assert ("n1", "versions") not in report.failed()


def recorded_manifest(name: str) -> dict:
    """A versions manifest recorded on a local node (fixtures/versions/README.md)."""
    path = pathlib.Path(__file__).parent / "fixtures" / "versions" / f"{name}.json"
    return json.loads(path.read_text())


def test_a_debian_13_node_among_debian_12_nodes_is_refused_for_its_stack():
    """A mixed cluster: two Debian 12 nodes and one Debian 13 node (real manifests). Debian
    13's Python 3.13 cannot run the 3.11 wheelhouse, so the stacks differ and the odd node is
    named with each field; with the same locked stack on every node (all three from the
    Debian 13 recording), the same cluster passes: doctor judges the stack, not the OS."""
    f = healthy()
    for host, name in (("n1", "debian12-cpu"), ("n2", "debian12-cpu"), ("n3", "debian13-pypi")):
        data = node(f, host)
        data["versions"] = recorded_manifest(name)
        set_node(f, host, data)
    report = judge(f)
    assert report.failed() == {("n3", "versions")}
    details = report.cell("versions", "n3").details
    assert "python 3.13.5 here, 3.11.2 on n1, n2" in details
    assert "torch 2.13.0+cu130 here, 2.13.0+cpu on n1, n2" in details
    assert any(d.startswith("lock_sha256 ea04c289") for d in details), details
    for host in HOSTS:
        data = node(f, host)
        data["versions"] = recorded_manifest("debian13-pypi")
        set_node(f, host, data)
    report = judge(f)
    assert report.ok and report.cell("versions", "n3").status == "pass"


def test_drift_from_what_provision_recorded_warns():
    f = healthy()
    for h in HOSTS:
        data = node(f, h)
        data["versions"]["deepspeed"] = "0.20.0"
        set_node(f, h, data)
    recorded = {h: {"versions": {"deepspeed": "0.19.8"}} for h in HOSTS}
    report = judge(f, recorded=recorded)
    assert report.ok
    assert report.cell("versions", "n2").status == "warn"
    assert "deepspeed 0.19.8 → 0.20.0" in report.cell("versions", "n2").details[0]


@pytest.mark.parametrize(
    ("size", "status"), [(64 << 20, "fail"), ((1 << 30) - 1, "fail"), (1 << 30, "pass")]
)
def test_shm_threshold(size, status):
    f = healthy()
    data = node(f, "n2")
    data["shm"] = {"size_bytes": size}
    set_node(f, "n2", data)
    report = judge(f)
    assert report.cell("shm", "n2").status == status
    assert report.cell("shm", "n1").status == "pass"


def test_rendezvous_port_blocked_on_the_head_blames_the_head():
    f = healthy()
    for src in ("n2", "n3"):
        fail_connects(f, src, "timed out", kind="rendezvous")
    report = judge(f)
    assert report.failed() == {("n1", "rendezvous")}
    assert "no node reaches n1:29500" in report.cell("rendezvous", "n1").details[0]


def test_ephemeral_ports_blocked_into_one_node_blames_that_node():
    f = healthy()
    for src in ("n1", "n2"):
        fail_connects(f, src, "timed out", host="n3", port=46883)
    report = judge(f)
    assert report.failed() == {("n3", "ports")}
    assert "32768-60999" in report.cell("ports", "n3").fixes[0]


def test_one_failed_link_is_blamed_on_its_source_naming_the_target():
    f = healthy()
    fail_connects(f, "n2", "Connection refused", host="n3")
    report = judge(f)
    assert report.failed() == {("n2", "ports")}
    assert report.cell("ports", "n2").details[0].startswith("n2 → n3: port 32768")


def test_rendezvous_port_in_use_warns():
    f = healthy()
    f["n1"]["listen"]["busy"] = [29500]
    f["n1"]["listen"]["rendezvous"] = None
    for src in ("n2", "n3"):
        res = json.loads(f[src]["connect"]["stdout"])
        res["results"] = [r for r in res["results"] if r["kind"] != "rendezvous"]
        f[src]["connect"] = cmd(res)
    report = judge(f)
    assert report.ok
    assert report.cell("rendezvous", "n1").status == "warn"


def test_resolution_to_a_stale_address_fails_on_the_node_that_resolves():
    f = healthy()
    data = node(f, "n2")
    data["resolve"]["n3"]["addresses"] = ["10.255.255.1", "10.0.0.3"]  # the stale one first
    data["resolve"]["n1"]["addresses"] = []
    set_node(f, "n2", data)
    report = judge(f)
    assert report.failed() == {("n2", "resolve")}
    details = report.cell("resolve", "n2").details
    assert "n2 cannot resolve n1" in details
    assert any("n3 to 10.255.255.1, 10.0.0.3, but n3 is at 10.0.0.3" in d for d in details)


@pytest.mark.parametrize(
    ("value", "kind", "status"),
    [
        ("8192", "cpu", "pass"),
        ("unlimited", "cuda", "pass"),
        ("8192", "cuda", "fail"),
        ("16", "cpu", "fail"),
        ("8192", "efa-cpu", "fail"),
    ],
)
def test_memlock_through_pdsh(value, kind, status):
    f = healthy()
    pdsh = json.loads(f["n1"]["pdsh"]["stdout"])
    pdsh["memlock"]["n2"] = value
    f["n1"]["pdsh"] = cmd(pdsh)
    facts = {"accelerators": {"kind": kind if kind != "efa-cpu" else "cpu"}}
    if kind == "efa-cpu":
        facts["nccl_env"] = {"profile": "efa"}
    report = judge(f, recorded={"n2": facts})
    assert report.cell("memlock", "n2").status == status


def test_pdsh_missing_on_the_head_fails_pdsh_and_skips_memlock():
    f = healthy()
    f["n1"]["pdsh"] = cmd({"installed": False, "error": "pdsh is not installed on the head"})
    report = judge(f)
    assert report.failed() == {("n1", "pdsh")}
    assert {report.cell("memlock", h).status for h in HOSTS} == {"skip"}


def test_pdsh_not_reaching_a_node_names_it():
    f = healthy()
    pdsh = json.loads(f["n1"]["pdsh"]["stdout"])
    del pdsh["memlock"]["n3"]
    pdsh["errors"]["n3"] = "ssh exited with exit code 255"
    f["n1"]["pdsh"] = cmd(pdsh)
    report = judge(f)
    assert report.failed() == {("n3", "pdsh")}


@pytest.mark.parametrize(
    ("offset", "status"), [(0.01, "pass"), (-0.9, "warn"), (3.0, "fail"), (-30.0, "fail")]
)
def test_clock_offset_from_the_head(offset, status):
    f = healthy()
    ssh = json.loads(f["n1"]["ssh"]["stdout"])
    ssh["results"]["n3"]["offset_s"] = offset
    f["n1"]["ssh"] = cmd(ssh)
    assert judge(f).cell("clock", "n3").status == status


def test_shared_token_not_visible_fails_that_node():
    f = healthy()
    data = node(f, "n2")
    data["shared"] = {"path": "/shared/.t", "read": "", "error": "No such file or directory"}
    set_node(f, "n2", data)
    report = judge(f)
    assert report.failed() == {("n2", "shared")}
    assert judge(f, shared_storage=False).cell("shared", "n2").status == "skip"


def test_libaio_missing_and_op_unloadable():
    f = healthy()
    data = node(f, "n3")
    data["libaio"] = {"ldconfig": False, "async_io_op": "/x.so", "missing_libs": ["libaio.so.1"]}
    set_node(f, "n3", data)
    report = judge(f)
    assert report.failed() == {("n3", "libaio")}
    assert "libaio.so.1 not found" in report.cell("libaio", "n3").details[0]


def test_hostfile_slots_vs_accelerators_detected_now():
    f = healthy()
    report = judge(f, hostfile_slots={"n1": 1, "n2": 4, "n3": 1})
    assert report.failed() == {("n2", "slots")}
    assert "slots=4" in report.cell("slots", "n2").details[0]
    data = node(f, "n3")
    data["accelerators"] = {"kind": "cuda", "count": 7}
    set_node(f, "n3", data)
    report = judge(f, hostfile_slots={"n1": 1, "n2": 1, "n3": 8}, expected_slots={"n3": 8})
    assert report.failed() == {("n3", "slots")}
    assert any("should have 8 accelerators" in d for d in report.cell("slots", "n3").details)


def test_wrong_interface_name_fails_that_node():
    f = healthy()
    data = node(f, "n2")
    data["ifname"]["NCCL_SOCKET_IFNAME"] = {
        "spec": "ib9",
        "matched": [],
        "error": "n2: NCCL_SOCKET_IFNAME=ib9 matches no interface with an IPv4 address",
    }
    set_node(f, "n2", data)
    report = judge(f)
    assert report.failed() == {("n2", "ifname")}


def test_probe_crash_is_a_failure_not_a_pass():
    f = healthy()
    f["n2"]["node"] = {"rc": 1, "stdout": "", "stderr": "Traceback ... boom"}
    report = judge(f)
    assert ("n2", "versions") in report.failed()
    assert "boom" in report.cell("versions", "n2").details[0]


def test_json_report_lists_failures_with_fixes():
    f = healthy()
    data = node(f, "n3")
    data["shm"] = {"size_bytes": 64 << 20}
    set_node(f, "n3", data)
    out = judge(f).to_json()
    assert out["ok"] is False
    assert [(x["host"], x["check"]) for x in out["failures"]] == [("n3", "shm")]
    assert "--shm-size" in out["failures"][0]["fix"][0]
    assert set(out["checks"]) == set(doctor.CHECKS)
    json.dumps(out)


def test_doctor_needs_an_inventory(capsys):
    with pytest.raises(SystemExit):
        main(["doctor"])
    assert "--inventory" in capsys.readouterr().err


# What doctor reads on the controller is read, and refused, before its playbook runs.


def _write_inv(tmp_path, hostfile: bytes | None = None, **hostvars):
    from dscluster.inventory import Inventory  # noqa: PLC0415

    source = tmp_path / "hosts.yml"
    source.write_text("all: {}\n")
    if hostfile is not None:
        (tmp_path / "hostfile").write_bytes(hostfile)
    return Inventory(
        source=source,
        groups={"all": ["n1", "n2"], "head": ["n1"], "workers": ["n2"]},
        hostvars={"n1": dict(hostvars), "n2": {}},
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (b"n1 slots=two\n", "'n1 slots=two'"),
        (b"n1 slots=0\n", "'n1 slots=0'"),
        (b"n1 slots=99999999999\n", "99999999999"),
        (b"n1 slots=\xd9\xa3\n", "line 1"),
        (b"n1 slots=2 extra\n", "'n1 slots=2 extra'"),
        (b"n1\n", "'n1'"),
        (b"\xff\n", "bad byte at line 1"),
    ],
)
def test_a_hand_edited_hostfile_is_refused_before_the_playbook(tmp_path, text, shown):
    from dscluster.doctor import run as doctor_run  # noqa: PLC0415
    from dscluster.errors import DsclusterError  # noqa: PLC0415

    with pytest.raises(DsclusterError) as exc:
        doctor_run._inputs(_write_inv(tmp_path, text))
    assert shown in str(exc.value)


def test_hostfile_comments_and_blank_lines_are_fine(tmp_path):
    from dscluster.doctor import run as doctor_run  # noqa: PLC0415

    inputs = doctor_run._inputs(_write_inv(tmp_path, b"# by hand\n\nn1 slots=2\nn2 slots=1\n"))
    assert inputs["hostfile_slots"] == {"n1": 2, "n2": 1}
    assert inputs["cpu_slots"] == {"n1": 1, "n2": 1}


@pytest.mark.parametrize("value", ["eight", "{{ slots }}", 2.7, True])
def test_slot_variables_doctor_compares_are_refused_not_crashed_on(tmp_path, value):
    from dscluster.doctor import run as doctor_run  # noqa: PLC0415
    from dscluster.errors import DsclusterError  # noqa: PLC0415

    with pytest.raises(DsclusterError, match="dscluster_cpu_slots"):
        doctor_run._inputs(_write_inv(tmp_path, dscluster_cpu_slots=value))


@pytest.mark.parametrize(
    ("status", "rc", "failures", "needle"),
    [
        ("failed", 4, [("-", "doctor.yml", "ERROR! couldn't resolve module")], "couldn't resolve"),
        ("successful", 0, [], "the play ended successful, rc 0"),
    ],
)
def test_no_findings_says_why_the_play_gave_none(
    monkeypatch, inventory_dir, status, rc, failures, needle
):
    """A play that stopped before any host reported (a parse error, a timeout) names that
    cause on every node's reach check, not only 'no findings came back'."""
    from io import StringIO  # noqa: PLC0415

    from rich.console import Console  # noqa: PLC0415

    from dscluster import inventory, runner  # noqa: PLC0415

    result = runner.PlaybookResult(status=status, rc=rc, hosts={}, failures=failures)
    monkeypatch.setattr(runner, "run_playbook", lambda *a, **kw: result)
    report = doctor.run_doctor(inventory.load(inventory_dir), console=Console(file=StringIO()))
    for host in ("node-a", "node-b", "node-c"):
        details = " ".join(report.cell("reach", host).details)
        assert "no findings came back" in details and needle in details, details


def render(tbl, width: int) -> list[str]:
    import io  # noqa: PLC0415

    from rich.console import Console  # noqa: PLC0415

    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(tbl)
    return console.file.getvalue().splitlines()


def test_the_table_turns_to_one_row_per_node_where_the_nodes_do_not_fit_across():
    hosts = [f"scale-n{i}" for i in range(1, 17)]
    report = doctor.DoctorReport(hosts=hosts, head=hosts[0], cells={})
    for check in doctor.CHECKS:
        for host in hosts:
            report.cell(check, host)
    report.cell("ssh", "scale-n2").add("fail", "scale-n2 → scale-n3: Permission denied")
    report.cell("shm", "scale-n3").add("warn", "/dev/shm is 64 MiB")
    report.cell("slots", "scale-n3").add("skip", "no accelerators")
    lines = render(doctor.table(report, 80), 80)
    assert all(len(line) <= 80 for line in lines), lines
    rows = {line.split()[1]: line for line in lines if line.startswith("│ scale-n")}
    assert sorted(rows) == sorted(hosts), lines  # every node named in full
    n = len(doctor.CHECKS)
    cells = {h: [c.strip() for c in line.split("│")[2:-1]] for h, line in rows.items()}
    assert cells["scale-n1"] == [str(n), "0", "0", "0", ""]
    assert cells["scale-n2"] == [str(n - 1), "0", "0", "1", "ssh fail"]
    # skips are counted, not named: a CPU node skips every GPU check
    assert cells["scale-n3"] == [str(n - 2), "1", "1", "0", "shm warn"]


def test_three_nodes_keep_the_checks_down_the_nodes_across():
    report = doctor.DoctorReport(hosts=HOSTS, head="n1", cells={})
    report.cell("ssh", "n2").add("fail", "n2 → n3: Permission denied")
    for tbl in (doctor.table(report, 80), doctor.table(report)):
        lines = render(tbl, 80)
        header = next(line for line in lines if "check" in line)
        assert header.split()[1:8:2] == ["check", "n1", "n2", "n3"], header
        ssh = next(line for line in lines if line.startswith("│ ssh "))
        assert [c.strip() for c in ssh.split("│")[1:-1]] == ["ssh", "pass", "fail", "pass"]

"""`smoke`/`launch --exclude-unhealthy`: which nodes doctor's report puts out of a run
(dscluster.doctor.exclude, on reports judged from findings as in test_doctor.py), every
launcher rendered without them, the refusals, and the run's own hostfile beside an
inventory's that stays as it was."""

from __future__ import annotations

import io
import json
import pathlib
import re
import tarfile

import pytest
from rich.console import Console

from dscluster import doctor
from dscluster.doctor import run as doctor_run
from dscluster.doctor.exclude import Excluded, check_left, unhealthy
from dscluster.doctor.health import Finding
from dscluster.doctor.health.registry import add_cells
from dscluster.errors import DsclusterError
from dscluster.hostfile import render_hostfile
from dscluster.inventory import load
from dscluster.launch import LAUNCHERS, JobSite, LaunchRequest, build_plan
from dscluster.launch import run as launch_run
from dscluster.launch.exclude import request_without, site_without
from dscluster.launch_files import render_launch_files
from dscluster.runner import PlaybookResult

from .clirun import run_cli, run_main
from .jobfake import stand_in
from .test_doctor import HOSTS, fail_connects, fail_ssh, healthy, judge, node, set_node

# ---------------------------------------------------------------- the decision, on reports


def small_shm(findings, host: str) -> None:
    data = node(findings, host)
    data["shm"] = {"size_bytes": 64 << 20}
    set_node(findings, host, data)


def left(report) -> list[tuple[str, tuple[str, ...]]]:
    return [(e.host, e.checks) for e in unhealthy(report)]


def test_a_healthy_report_leaves_no_node_out():
    assert unhealthy(judge(healthy())) == []


def test_a_node_failing_a_local_check_leaves_with_the_check_and_its_detail():
    f = healthy()
    small_shm(f, "n3")
    (e,) = unhealthy(judge(f))
    assert (e.host, e.checks) == ("n3", ("shm",))
    assert e.why.startswith("shm: /dev/shm is 64 MiB, below 1.0 GiB")
    assert e.as_dict() == {"host": "n3", "checks": ["shm"], "why": e.why}


def test_every_failed_check_of_a_node_is_named_in_the_reports_order():
    f = healthy()
    small_shm(f, "n2")
    data = node(f, "n2")
    data["versions"]["deepspeed"] = "0.19.7"
    data["libaio"] = {"ldconfig": False, "missing_libs": []}
    set_node(f, "n2", data)
    (e,) = unhealthy(judge(f))
    assert e.checks == ("shm", "versions", "libaio")
    assert "versions: deepspeed 0.19.7 here, 0.19.8 on n1, n3" in e.why
    assert "; libaio: libaio.so.1 is not in the loader cache" in e.why


def test_pairwise_checks_leave_the_node_doctor_blames_and_no_other():
    # one broken link: its source is blamed (naming the target), the target stays
    f = healthy()
    fail_connects(f, "n2", "Connection refused", host="n3")
    report = judge(f)
    assert left(report) == [("n2", ("ports",))]
    assert "n2 → n3: port 32768" in unhealthy(report)[0].why
    # a node no one logs in to: that node, not the sources that tried
    f = healthy()
    for src in HOSTS:
        fail_ssh(f, src, "n3", "Connection refused")
    assert left(judge(f)) == [("n3", ("ssh",))]


def test_an_unreachable_node_leaves_for_reach_alone():
    f = healthy()
    del f["n3"]  # no findings: what the others said of it is not judged (test_doctor.py)
    report = judge(f, unreachable={"n3": "Failed to connect to the host via ssh"})
    (e,) = unhealthy(report)
    assert e.checks == ("reach",)  # its skipped cells are no reason
    assert "not reachable from the controller" in e.why


def test_a_finding_to_isolate_fails_and_leaves_monitor_warnings_stay():
    """A finding that asks to isolate, reboot or reset fails; a warning is for monitor only
    and keeps its node (issue 77: one InfiniBand port down used to warn)."""
    with pytest.raises(ValueError, match="a warning's action is monitor, not isolate"):
        Finding("warn", "mlx5_0 port 1: state DOWN", "isolate", "reseat it")
    report = judge(healthy())
    add_cells(
        report,
        "n2",
        {"fabric": [Finding("fail", "mlx5_0 port 1: state DOWN", "isolate", "reseat it")]},
    )
    add_cells(report, "n3", {"xid": [Finding("warn", "GPU 0: Xid 154", "monitor", "watch")]})
    report.cell("disk", "n3").add("warn", "/opt/dscluster/venv: 5.0 GiB free")
    assert not report.ok  # doctor exits non-zero: its advice is to take n2 out
    (e,) = unhealthy(report)
    assert (e.host, e.checks) == ("n2", ("fabric",))
    # (the stand-in report's cell also holds its earlier skip: judge_node adds one cell once)
    assert e.why.startswith("fabric: ") and e.why.endswith("isolate: mlx5_0 port 1: state DOWN")


def test_after_leaving_the_blamed_nodes_out_no_failed_cell_is_left():
    f = healthy()
    small_shm(f, "n3")
    fail_ssh(f, "n2", "n3", "Host key verification failed.")
    report = judge(f)
    out = {e.host for e in unhealthy(report)}
    assert out == {"n2", "n3"}
    assert {h for h, _ in report.failed()} <= out
    check_left(report, unhealthy(report), "smoke")  # the head is left: the run can go on


def test_the_head_cannot_leave_and_a_run_needs_a_node():
    f = healthy()
    for src in ("n2", "n3"):
        fail_connects(f, src, "timed out", kind="rendezvous")
    report = judge(f)
    with pytest.raises(DsclusterError) as info:
        check_left(report, unhealthy(report), "smoke")
    line = str(info.value)
    assert line.startswith("--exclude-unhealthy cannot leave out the head n1 (rendezvous: ")
    assert line.endswith("smoke not started (fix it, see 'dscluster doctor')")
    assert "\n" not in line
    f = healthy()
    for host in HOSTS:
        small_shm(f, host)
    report = judge(f)
    with pytest.raises(DsclusterError, match=r"doctor fails every node \(n1 \(shm\); n2 \(shm\)"):
        check_left(report, unhealthy(report), "launch")


# ---------------------------------------------------------------- preflight


def fake_doctor(monkeypatch, report: doctor.DoctorReport) -> list[str]:
    calls: list[str] = []

    def run_doctor(inv, **kw):
        calls.append(inv.head)
        return report

    monkeypatch.setattr(doctor_run, "run_doctor", run_doctor)
    return calls


def shm_failing(hosts, head: str, *failing: str) -> doctor.DoctorReport:
    report = doctor.DoctorReport(hosts=list(hosts), head=head, cells={})
    for host in failing:
        report.cell("shm", host).add(
            "fail", "/dev/shm is 64 MiB, below 1.0 GiB", "docker run --shm-size=8g"
        )
    return report


def test_preflight_returns_the_nodes_to_leave_out_and_says_them(inventory_dir, monkeypatch):
    inv = load(inventory_dir)
    buf = io.StringIO()
    console = Console(file=buf, width=200)
    fake_doctor(monkeypatch, shm_failing(inv.hosts, inv.head, "node-c"))
    check = doctor.preflight(
        inv, master_port=29500, console=console, what="smoke", skip=False, exclude_unhealthy=True
    )
    assert check is not None
    assert [e.host for e in check()] == ["node-c"]
    assert (
        "smoke: leaving node-c out of this run (--exclude-unhealthy): shm: /dev/shm is 64 MiB, "
        "below 1.0 GiB\n"
    ) in buf.getvalue()
    # without the option a failure still stops the job, and says the option exists
    plain = doctor.preflight(inv, master_port=29500, console=console, what="smoke", skip=False)
    assert plain is not None
    with pytest.raises(DsclusterError, match=r"smoke not started .*--exclude-unhealthy"):
        plain()
    # a healthy cluster: nothing to leave out either way
    fake_doctor(monkeypatch, shm_failing(inv.hosts, inv.head))
    assert plain() == []
    with pytest.raises(DsclusterError, match="nothing to exclude by; drop one of them"):
        doctor.preflight(
            inv, master_port=1, console=console, what="smoke", skip=True, exclude_unhealthy=True
        )


# ---------------------------------------------------------------- every launcher without a node

POOL = {"h1": 2, "h2": 2, "h3": 2}
ENV = "PATH=/opt/v/bin:/usr/bin\nNCCL_SOCKET_IFNAME=eth0\n"
# What each launcher needs besides the program to render on POOL.
MODE = {
    "gaudi_spawn": {"gaudi_spawn": "/opt/oh/gaudi_spawn.py"},
}


def site(launcher: str) -> JobSite:
    kind = "hpu" if launcher == "gaudi_spawn" else "cuda"
    return JobSite(
        run_id="launch-1",
        job_dir="/shared/dscluster/jobs/launch-1",
        head="h1",
        venv="/opt/v",
        pool=POOL,
        accelerators=dict.fromkeys(POOL, kind),
        hostfile_text=render_hostfile(POOL.items()),
        env_text=ENV,
        interface="eth0",
    )


def plan_without(launcher: str, left_out: dict[str, str], **kw):
    request = LaunchRequest(launcher=launcher, program=["train.py"], **MODE.get(launcher, {}), **kw)
    where = site_without(site(launcher), left_out)
    return build_plan(request_without(request, where.pool, left_out), where)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_runs_without_the_left_out_node(launcher):
    """No launcher starts, counts or lists the node: its name is nowhere in the head's
    command or the job's files, and the job's own hostfile lacks it."""
    p = plan_without(launcher, {"h2": "shm"})
    assert list(p.resources) == ["h1", "h3"] and p.world_size == 4
    assert p.files["hostfile"][0] == "h1 slots=2\nh3 slots=2\n"
    word = re.compile(r"\bh2\b")
    assert not word.search(p.command), p.command
    for name, (text, _) in p.files.items():
        if name != "launch_watch.py":  # the same program whatever the hosts
            assert not word.search(text), (name, text)
    full = build_plan(
        LaunchRequest(launcher=launcher, program=["train.py"], **MODE.get(launcher, {})),
        site(launcher),
    )
    assert word.search(full.command + "".join(t for t, _ in full.files.values()))


def test_each_launcher_counts_the_nodes_left():
    assert plan_without("deepspeed", {"h2": "shm"}).argv[:3] == [
        "/opt/v/bin/deepspeed", "--hostfile", "hostfile",
    ]  # fmt: skip
    torchrun = plan_without("torchrun", {"h2": "shm"})
    assert torchrun.argv[4:6] == ["-w", "h1,h3"]
    node_script = torchrun.files["torchrun_node.sh"][0]
    assert node_script.count("--nnodes 2 ") == 2 and "h3) " in node_script
    mpi = plan_without("mpi", {"h2": "shm"})
    assert mpi.files["mpi_hostfile"][0] == "h1 slots=2\nh3 slots=2\n"
    assert mpi.argv[3:5] == ["-np", "4"]
    accelerate = plan_without("accelerate", {"h2": "shm"})
    assert "--num_machines 2 --num_processes 4" in accelerate.files["accelerate_node.sh"][0]
    assert "num_machines: 2" in accelerate.files["accelerate_config.yaml"][0]
    gaudi = plan_without("gaudi_spawn", {"h2": "shm"})
    assert gaudi.files["gaudi_hostfile"][0] == "h1 slots=2\nh3 slots=2\n"
    assert gaudi.argv[2:4] == ["--world_size", "4"]


def test_the_users_filters_are_read_against_the_nodes_left():
    # --include/--exclude naming a node left out drop it; the rest stays as given
    argv = plan_without("deepspeed", {"h2": "shm"}, include="h2@h3:1").argv
    assert argv[argv.index("--include") + 1] == "h3:1"
    p = plan_without("deepspeed", {"h2": "shm"}, exclude="h2@h3:0")
    assert p.argv[p.argv.index("--exclude") + 1] == "h3:0"
    assert p.resources == {"h1": [0, 1], "h3": [1]}
    p = plan_without("torchrun", {"h2": "shm"}, exclude="h2")
    assert p.resources == {"h1": [0, 1], "h3": [0, 1]}
    # --num-nodes: the first N nodes left, and refused when fewer are left
    assert list(plan_without("torchrun", {"h2": "shm"}, num_nodes=2).resources) == ["h1", "h3"]
    with pytest.raises(DsclusterError) as info:
        plan_without("torchrun", {"h2": "shm"}, num_nodes=3)
    assert str(info.value) == (
        "--num-nodes 3 needs 3 nodes and 2 are left once doctor leaves out h2 (shm); lower "
        "--num-nodes or fix them"
    )
    with pytest.raises(DsclusterError, match=r"--include 'h2:0' names only nodes doctor leaves"):
        plan_without("mpi", {"h2": "shm"}, include="h2:0")
    with pytest.raises(DsclusterError, match="the head h1 cannot be left out"):
        plan_without("mpi", {"h1": "rendezvous"})


# ---------------------------------------------------------------- smoke and launch, in process


def fake_run(monkeypatch, report: dict | None = None):
    """The playbook stand-in: keeps what was staged (the job's hostfile) and the --limit, and
    hands back a passed job (with `report` as the smoke job's report.json)."""
    seen: dict[str, str] = {}

    def run_playbook(playbook, inv, *, extravars, limit=None, **kw):
        seen["limit"] = limit
        tar_path = pathlib.Path(extravars["launch_stage_dir"]) / extravars["launch_job_tar"]
        with tarfile.open(tar_path) as tar:
            for member in tar.getmembers():
                if member.name.endswith("/hostfile"):
                    seen["hostfile"] = tar.extractfile(member).read().decode()
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        (fetched / "launcher.log").write_text("node-a: done\n")
        (fetched / "exit_status").write_text("0\n")
        if report is not None:
            (fetched / "report.json").write_text(json.dumps(report))
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, run_playbook)
    return seen


def without_node_c(inventory_dir) -> tuple[str, str, int]:
    """The inventory's full hostfile, the run's without node-c, and the run's world size."""
    files = render_launch_files(load(inventory_dir))
    kept = [f for f in files.facts if f.host != "node-c"]
    return (
        files.hostfile_text,
        render_hostfile((f.host, f.slots) for f in kept),
        sum(f.slots for f in kept),
    )


def test_smoke_runs_without_the_failing_node_and_its_report_names_it(inventory_dir, monkeypatch):
    full, run_hostfile, world = without_node_c(inventory_dir)
    inv = load(inventory_dir)
    fake_doctor(monkeypatch, shm_failing(inv.hosts, inv.head, "node-c"))
    seen = fake_run(monkeypatch, {"ok": True, "world_size": world, "checks": {}, "ranks": []})
    rc, out, err = run_cli("smoke", "-i", str(inventory_dir), "--exclude-unhealthy")
    assert rc == 0, err
    assert seen["hostfile"] == run_hostfile and "node-c" not in seen["hostfile"]
    assert seen["limit"] == "node-a,node-b"  # the playbook does not touch node-c either
    assert (inventory_dir / "hostfile").read_text() == full  # the inventory's stays whole
    assert "node-c" in full
    assert (
        "smoke: leaving node-c out of this run (--exclude-unhealthy): shm: /dev/shm is 64 MiB, "
        "below 1.0 GiB"
    ) in err
    assert f"smoke: 2 nodes, {world} ranks, ZeRO-2" in err
    report = json.loads((inventory_dir / "reports" / "smoke-latest.json").read_text())
    assert report["excluded"] == [
        {"host": "node-c", "checks": ["shm"], "why": "shm: /dev/shm is 64 MiB, below 1.0 GiB"}
    ]
    assert report["hostfile"] == run_hostfile.splitlines()
    assert report["expected_world_size"] == world and report["ok"] is True
    assert f"smoke test passed: {world} ranks without node-c (--exclude-unhealthy)" in out


def test_smoke_refusals_start_nothing(inventory_dir, monkeypatch):
    inv = load(inventory_dir)
    seen = fake_run(monkeypatch)
    # the head failing: one line, nothing staged
    fake_doctor(monkeypatch, shm_failing(inv.hosts, inv.head, "node-a"))
    rc, _, err = run_cli("smoke", "-i", str(inventory_dir), "--exclude-unhealthy")
    assert rc == 1 and seen == {}
    last = err.strip().splitlines()[-1]
    assert last.startswith("dscluster: error: --exclude-unhealthy cannot leave out the head node-a")
    # without the option a failing node stops smoke as before
    fake_doctor(monkeypatch, shm_failing(inv.hosts, inv.head, "node-c"))
    rc, _, err = run_cli("smoke", "-i", str(inventory_dir))
    assert rc == 1 and seen == {}
    assert "doctor: 1 failure(s) on node-c (shm)" in err.strip().splitlines()[-1]
    # --no-doctor leaves nothing to exclude by: refused before anything
    for command, *rest in (["smoke"], ["launch", "--", "/opt/train.py"]):
        flags = ["-i", str(inventory_dir), "--no-doctor", "--exclude-unhealthy"]
        rc, out, err = run_main(command, *flags, *rest)
        assert rc == 2 and out == "" and seen == {}
        assert err == (
            "dscluster: error: --exclude-unhealthy leaves out the nodes doctor fails, and "
            "--no-doctor skips doctor: nothing to exclude by; drop one of them\n"
        )


def test_launch_runs_without_the_failing_node_and_says_so(tmp_path, inventory_dir, monkeypatch):
    full, run_hostfile, world = without_node_c(inventory_dir)
    inv = load(inventory_dir)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    fake_doctor(monkeypatch, shm_failing(inv.hosts, inv.head, "node-c"))
    seen = fake_run(monkeypatch)
    rc, _, err = run_cli(
        "launch", "-i", str(inventory_dir), "--exclude-unhealthy", "--launcher", "torchrun",
        "--", str(script),
    )  # fmt: skip
    assert rc == 0, err
    assert seen["hostfile"] == run_hostfile and seen["limit"] == "node-a,node-b"
    assert (inventory_dir / "hostfile").read_text() == full
    assert f"launch: 2 nodes, {world} ranks without node-c" in err
    last = err.strip().splitlines()[-1]
    assert ": job exited 0; log " in last
    assert last.endswith("; without node-c (--exclude-unhealthy: node-c: shm)")
    # --num-nodes 3 cannot be met by the two nodes left: refused, nothing staged
    seen.clear()
    rc, _, err = run_cli(
        "launch", "-i", str(inventory_dir), "--exclude-unhealthy", "--num-nodes", "3",
        "--", str(script),
    )  # fmt: skip
    assert rc == 1 and seen == {}
    assert err.strip().splitlines()[-1] == (
        "dscluster: error: --num-nodes 3 needs 3 nodes and 2 are left once doctor leaves out "
        "node-c (shm); lower --num-nodes or fix them"
    )


def test_a_dry_run_says_doctor_decides_at_launch(tmp_path, inventory_dir, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    calls = fake_doctor(monkeypatch, shm_failing(["node-a"], "node-a", "node-a"))
    rc, out, err = run_cli(
        "launch", "-i", str(inventory_dir), "--exclude-unhealthy", "--dry-run", "--", str(script)
    )
    assert rc == 0 and calls == [] and "node-c" in out
    assert "--dry-run runs no doctor" in err


def test_excluded_is_what_a_preflight_hands_back():
    # launch.run's LeftOut protocol is what doctor's Excluded gives
    e = Excluded("n3", ("shm", "disk"), "shm: small; disk: full")
    assert launch_run.left_out_of(launch_run.run_preflight(lambda: [e])) == {"n3": "shm, disk"}
    assert launch_run.run_preflight(lambda: None) == [] == launch_run.run_preflight(None)

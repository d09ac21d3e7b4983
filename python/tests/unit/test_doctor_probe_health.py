"""doctor_probe.py's health recording, run with stand-in tools on PATH: what each output,
reason and index entry look like; absent tools cost nothing; the kernel log keeps only the
lines the judges read; outputs are capped; dcgmi's level follows the time budget."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from dscluster.doctor.health import FILES

from .. import rolefiles

PROBE = rolefiles.path("doctor", "files/doctor_probe.py")


@pytest.fixture(scope="module")
def probe():
    return rolefiles.load("doctor", "doctor_probe.py")


def tool(bindir, name: str, script: str) -> None:
    path = bindir / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def bindir(tmp_path, monkeypatch):
    """A PATH of nothing but the stand-ins a test writes (and sh, for them)."""
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", str(d))
    return d


def test_the_probe_records_the_files_the_judges_read(probe):
    assert list(probe.HEALTH) == list(FILES)


def test_absent_tools_are_named_missing_and_cost_nothing(probe, bindir):
    started = time.monotonic()
    health = probe.health(0)
    assert time.monotonic() - started < 0.5
    assert health["files"] == {}
    index = health["index"]
    assert set(index) == set(FILES)
    assert index["nvidia-smi-q.xml"]["missing"] == "nvidia-smi: not found"
    assert index["nvidia-smi-q.xml"]["argv"] == ["nvidia-smi", "-q", "-x"]
    assert index["hl-smi-q.txt"]["missing"] == "hl-smi: not found"
    assert index["dcgmi-diag.json"]["missing"] == "dcgmi: not found"
    assert "dmesg: not found" in index["kernel.log"]["missing"]
    json.dumps(health)


def test_a_tool_without_its_device_gives_its_own_one_line_reason(probe, bindir):
    tool(
        bindir,
        "nvidia-smi",
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        'driver. Make sure that the latest NVIDIA driver is installed and running."\n'
        "echo; exit 9",
    )
    tool(bindir, "fi_info", "echo 'fi_getinfo: -61 (No data available)' >&2; exit 1")
    tool(bindir, "lspci", "printf '00:00.0 Host bridge: Intel\\n'")
    index = probe.health(0)["index"]
    why = index["nvidia-smi-q.xml"]["missing"]
    assert why.startswith("nvidia-smi: NVIDIA-SMI has failed because it couldn't communicate")
    assert "\n" not in why
    assert index["nvidia-smi-q.xml"]["rc"] == 9
    assert index["fi_info-efa.txt"]["missing"] == "fi_info: fi_getinfo: -61 (No data available)"
    assert "missing" not in index["lspci-vvv.txt"] and index["lspci-vvv.txt"]["rc"] == 0


def test_outputs_are_kept_as_the_tools_print_them_and_timed(probe, bindir):
    tool(bindir, "nvidia-smi", 'case "$1" in -q) echo "<?xml version=\\"1.0\\" ?><log/>";; '
         "topo) echo 'GPU0 X';; nvlink) echo \"link $2\";; esac")  # fmt: skip
    health = probe.health(0)
    assert health["files"]["nvidia-smi-q.xml"] == '<?xml version="1.0" ?><log/>\n'
    assert health["files"]["nvidia-smi-topo.txt"] == "GPU0 X\n"
    assert health["files"]["nvidia-smi-nvlink-e.txt"] == "link -e\n"
    entry = health["index"]["nvidia-smi-q.xml"]
    assert entry["rc"] == 0 and entry["seconds"] >= 0 and "missing" not in entry


def test_a_failing_tool_that_still_printed_its_report_is_kept(probe, bindir):
    """dcgmi diag exits non-zero when a test fails: that JSON is what the judge needs."""
    tool(bindir, "dcgmi", 'echo \'{"DCGM GPU Diagnostic": {"level": "\'$3\'"}}\'; exit 226')
    health = probe.health(150)
    assert health["files"]["dcgmi-diag.json"].startswith('{"DCGM GPU Diagnostic"')
    assert '"level": "2"' in health["files"]["dcgmi-diag.json"]
    assert health["index"]["dcgmi-diag.json"]["rc"] == 226
    assert health["index"]["dcgmi-diag.json"]["argv"] == ["dcgmi", "diag", "-r", "2", "-j"]


def test_dcgmi_runs_only_with_a_budget(probe, bindir):
    tool(bindir, "dcgmi", "echo '{}'")
    health = probe.health(0)
    assert "dcgmi-diag.json" not in health["files"]
    assert "--gpu-diag-budget is 0" in health["index"]["dcgmi-diag.json"]["missing"]


@pytest.mark.parametrize(
    ("budget", "level"), [(0, 0), (1, 1), (119, 1), (120, 2), (1799, 2), (1800, 3), (7200, 4)]
)
def test_dcgm_level_is_the_highest_the_budget_covers(probe, budget, level):
    assert probe.dcgm_level(budget) == level


def test_a_slow_tool_is_cut_off_and_named(probe, bindir, monkeypatch):
    monkeypatch.setitem(probe.HEALTH, "ibv_devinfo.txt", (["ibv_devinfo"], 0.5))
    tool(bindir, "ibv_devinfo", "exec sleep 30")
    os.symlink("/bin/sleep", bindir / "sleep")
    started = time.monotonic()
    index = probe.health(0)["index"]
    assert time.monotonic() - started < 5
    assert index["ibv_devinfo.txt"]["missing"].startswith("ibv_devinfo: no answer within")


def test_the_kernel_log_keeps_only_the_lines_the_judges_read(probe, bindir):
    tool(
        bindir,
        "dmesg",
        "printf '[    1.0] Linux version 6.1\\n"
        "[    2.0] usb 1-1: new device, serial 1234\\n"
        "[   50.1] NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, GPU has fallen off the bus.\\n"
        "[   60.0] pcieport 0000:00:01.0: AER: Corrected error received\\n"
        "[   70.0] EXT4-fs (sda1): mounted filesystem\\n'",
    )
    health = probe.health(0)
    log = health["files"]["kernel.log"]
    assert log.splitlines() == [
        "# dscluster doctor: 2 of 5 lines of 'dmesg' kept, those the health judges read",
        "[   50.1] NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, GPU has fallen off the bus.",
        "[   60.0] pcieport 0000:00:01.0: AER: Corrected error received",
    ]
    entry = health["index"]["kernel.log"]
    assert entry["argv"] == ["dmesg"] and entry["lines"] == 5 and entry["kept"] == 2


RESTRICTED_DMESG = "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1"


def test_a_restricted_dmesg_falls_back_to_the_journal(probe, bindir):
    tool(bindir, "dmesg", RESTRICTED_DMESG)
    tool(bindir, "journalctl", "echo '[   50.1] n1 kernel: NVRM: Xid (PCI:0000:5d:00): 48'")
    health = probe.health(0)
    assert "NVRM: Xid" in health["files"]["kernel.log"]
    assert health["index"]["kernel.log"]["argv"][0] == "journalctl"


def test_no_kernel_log_anywhere_says_why_for_both(probe, bindir):
    tool(bindir, "dmesg", RESTRICTED_DMESG)
    tool(bindir, "journalctl", "echo '-- No entries --'")
    why = probe.health(0)["index"]["kernel.log"]["missing"]
    assert why == (
        "dmesg: read kernel buffer failed: Operation not permitted; journalctl: no entries"
    )


def test_outputs_are_capped_and_the_cut_noted(probe, bindir, monkeypatch):
    monkeypatch.setattr(probe, "HEALTH_CAP", 1000)
    tool(
        bindir, "lspci", "i=0; while [ $i -lt 100 ]; do echo 0123456789abcdefghi; i=$((i+1)); done"
    )
    health = probe.health(0)
    assert len(health["files"]["lspci-vvv.txt"]) == 1000
    assert health["index"]["lspci-vvv.txt"]["truncated"] == {
        "bytes": 2000,
        "kept": 1000,
        "end": "first",
    }


def test_node_returns_the_health_outputs_beside_the_other_checks(tmp_path):
    """The whole `node` subcommand as the role runs it, on this machine."""
    proc = subprocess.run(
        [sys.executable, str(PROBE), "node", "--hosts", "{}", "--venv", str(tmp_path / "v"),
         "--recorder", "/nonexistent", "--wheelhouse", str(tmp_path), "--profile-script",
         "/nonexistent", "--accelerators-fact", "/nonexistent", "--gpu-diag-budget", "0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data["health"]) == {"files", "index"}
    assert set(data["health"]["index"]) == set(FILES)

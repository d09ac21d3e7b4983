"""doctor_probe.py's `start` for real, run as the doctor role runs it (`python3 -c <probe>`):
one call makes the private directory, writes the probe there, starts the listener from that
copy in the background and returns the ports it bound; the listener answers with the host's
name, and removing the directory stops it."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import stat
import subprocess
import sys
import time

import pytest

from .. import rolefiles

PROBE = rolefiles.REPO / "roles" / "doctor" / "files" / "doctor_probe.py"


def start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE.read_text(), "start", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose (its parent, the start call, has exited already)
    status = pathlib.Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def banner(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        return sock.recv(512)


@pytest.fixture
def started():
    proc = start("--ephemeral", "2", "--seconds", "60")
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    yield state
    subprocess.run(["rm", "-rf", state["dir"]], check=False)


def test_start_returns_at_once_with_the_ports_and_a_private_copy_of_the_probe(started):
    directory = pathlib.Path(started["dir"])
    assert directory.name.startswith("dscluster-doctor-")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    copy = directory / "doctor_probe.py"
    assert copy.read_text() == PROBE.read_text()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o644
    assert (directory / "listen.json").exists()
    assert started["rendezvous"] is None and started["busy"] == []
    assert len(started["ephemeral"]) == 2
    low, high = started["range"]
    assert all(low <= p <= high for p in started["ephemeral"])
    # the listener runs from the copy, in a session of its own
    cmdline = pathlib.Path(f"/proc/{started['pid']}/cmdline").read_bytes().split(b"\0")
    assert cmdline[1:3] == [str(copy).encode(), b"listen"]
    assert os.getsid(started["pid"]) == started["pid"]


def test_listener_answers_with_the_host_name_and_stops_when_its_directory_goes(started):
    for port in started["ephemeral"]:
        assert banner(port) == b"dscluster-doctor " + socket.gethostname().encode() + b"\n"
    subprocess.run(["rm", "-rf", started["dir"]], check=True)
    deadline = time.monotonic() + 5
    while alive(started["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(started["pid"])


def test_a_taken_rendezvous_port_is_reported_busy_not_an_error():
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("0.0.0.0", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = start("--rendezvous", str(port), "--ephemeral", "1", "--seconds", "30")
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    subprocess.run(["rm", "-rf", state["dir"]], check=False)
    assert state["busy"] == [port] and state["rendezvous"] is None


def test_a_listener_that_cannot_start_fails_in_one_line_and_leaves_nothing(tmp_path):
    # a port no socket takes: the listener dies before it writes its state
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.read_text(), "start", "--rendezvous", "70000"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "doctor's listener exited 1 before it bound its ports"
    assert list(tmp_path.iterdir()) == []

"""doctor_probe.py's `start` for real, run as the doctor role runs it (`python3 <probe>`):
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
        [sys.executable, str(PROBE), "start", *args],
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
        [sys.executable, str(PROBE), "start", "--rendezvous", "70000"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "doctor's listener exited 1 before it bound its ports"
    assert list(tmp_path.iterdir()) == []


# A stand-in for ssh: notes which host it was started for and how many logins are in flight
# at that moment, then answers, after half a second, as the remote `date +%s.%N` would.
STAND_IN_SSH = """#!/bin/sh
for a; do host=$prev; prev=$a; done
echo "$host" >> "$STATE/order"
touch "$STATE/in.$host"
ls "$STATE" | grep -c '^in[.]' >> "$STATE/in_flight"
sleep 0.5
rm -f "$STATE/in.$host"
[ "$host" = refused ] && { echo "Permission denied (publickey)." >&2; exit 255; }
date +%s.%N
"""


# A stand-in for runuser: notes its arguments up to "--" and runs the rest (as this user).
# One printf, so one append: the probe's logins run side by side, and two appends per line
# interleaved ("-u ds -- -u ds -- " then "": a flaky count).
STAND_IN_RUNUSER = """#!/bin/sh
printf '%s %s %s \\n' "$1" "$2" "$3" >> "$STATE/runuser"
[ "$1" = -u ] && [ "$3" = -- ] || exit 125
shift 3
exec "$@"
"""


def stand_ins(tmp_path: pathlib.Path, **scripts: str) -> tuple[dict[str, str], pathlib.Path]:
    """An environment whose PATH finds these scripts (runuser always) first, and the state
    directory they write to."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, text in {"runuser": STAND_IN_RUNUSER, **scripts}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}
    env["USER"] = "root"  # the probe runs as root: the user it reports is --user's
    return env, state


def test_ssh_logs_in_a_few_at_a_time_starting_after_this_node(tmp_path):
    """`ssh` as the doctor role runs it (python3 -I <probe> ssh --user ds --hosts ... --me
    HOST): every login goes through `runuser -u ds --`, every host answered in the play's
    order, never more than SSH_PARALLEL logins in flight, and this node's first logins go to
    the hosts after it (all nodes starting with the first host put every node's first login on
    one sshd, past its MaxStartups on more than 10 nodes)."""
    probe = rolefiles.load("doctor", "doctor_probe.py")
    env, state = stand_ins(tmp_path, ssh=STAND_IN_SSH)
    hosts = [f"n{i:02d}" for i in range(1, 12)] + ["refused"]
    argv = [sys.executable, "-I", str(PROBE), "ssh", "--user", "ds", "--hosts", ",".join(hosts)]
    done = subprocess.run(
        [*argv, "--timeout", "3", "--me", "n05"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["user"] == "ds"
    assert (state / "runuser").read_text().splitlines() == ["-u ds -- "] * len(hosts)
    results = report["results"]
    assert list(results) == hosts
    assert all(results[h]["ok"] for h in hosts[:-1]), results
    assert results["refused"] == {"ok": False, "error": "Permission denied (publickey)."}
    in_flight = [int(n) for n in (state / "in_flight").read_text().split()]
    assert max(in_flight) == probe.SSH_PARALLEL, in_flight
    order = (state / "order").read_text().split()
    assert sorted(order) == sorted(hosts)
    first = probe.login_order(hosts, "n05")[: probe.SSH_PARALLEL]
    assert sorted(order[: probe.SSH_PARALLEL]) == sorted(first) == ["n06", "n07", "n08", "n09"]
    assert order[-1] == "n05" or "n05" in order[-probe.SSH_PARALLEL :]


def test_login_order_starts_after_this_node_and_wraps_round():
    probe = rolefiles.load("doctor", "doctor_probe.py")
    assert probe.login_order(["a", "b", "c", "d"], "b") == ["c", "d", "a", "b"]
    assert probe.login_order(["a", "b", "c", "d"], "d") == ["a", "b", "c", "d"]
    assert probe.login_order(["a", "b"], "") == ["a", "b"]  # --me not given, or not a host


def test_logins_drop_to_the_user_through_runuser_and_the_verdict_is_the_exit_status():
    """The probe runs as root; only the command drops: runuser -u USER -- the ssh or pdsh."""
    probe = rolefiles.load("doctor", "doctor_probe.py")
    assert probe.as_user("ds", ["ssh", "-o", "BatchMode=yes", "n1", "date"]) == [
        "runuser", "-u", "ds", "--", "ssh", "-o", "BatchMode=yes", "n1", "date",
    ]  # fmt: skip


# A stand-in for pdsh that lies: "every host answered", but exits 1 (the exit status the
# probe's root process sees is what counts, whatever the output says).
STAND_IN_PDSH = """#!/bin/sh
printf '%s\\n' "$@" > "$STATE/pdsh.argv"
echo "$PDSH_RCMD_TYPE" > "$STATE/pdsh.rcmd"
echo "n1: memlock=unlimited"
echo "pdsh@n1: n2: ssh exited with exit code 255" >&2
exit 1
"""


def test_pdsh_runs_as_the_user_with_its_environment_and_its_exit_status_is_kept(tmp_path):
    env, state = stand_ins(tmp_path, pdsh=STAND_IN_PDSH)
    done = subprocess.run(
        [sys.executable, "-I", str(PROBE), "pdsh", "--user", "ds", "--hosts", "n1,n2",
         "--timeout", "3"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report == {
        "installed": True, "rc": 1, "memlock": {"n1": "unlimited"},
        "errors": {"n2": "ssh exited with exit code 255"},
    }  # fmt: skip
    assert (state / "runuser").read_text() == "-u ds -- \n"
    assert (state / "pdsh.rcmd").read_text() == "ssh\n"
    argv = (state / "pdsh.argv").read_text().splitlines()
    assert argv[:4] == ["-S", "-R", "ssh", "-f"] and argv[-3:] == ["-w", "n1,n2", argv[-1]]
    assert argv[-1] == "echo memlock=$(ulimit -l)"


@pytest.mark.parametrize("command", ["ssh", "pdsh"])
def test_logins_need_the_user_named(command):
    """No default user: a role that forgot --user fails, it never logs in as root."""
    done = subprocess.run(
        [sys.executable, "-I", str(PROBE), command, "--hosts", "n1"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--user" in done.stderr


def test_nothing_runs_from_a_venv_or_script_that_is_not_roots_up_to_root(tmp_path, monkeypatch):
    """--venv of the training user's (uid 1000), and the interface checker and the
    accelerators fact script of that user's: the probe (root) runs none of them, nor ldd on the
    venv's op, and each finding names the path and its owner. The same venv made root's runs."""
    if os.geteuid() != 0:
        pytest.skip("chowns to another user")
    probe = rolefiles.load("doctor", "doctor_probe.py")
    ran = tmp_path / "ran"
    bindir = tmp_path / "path"
    bindir.mkdir()
    for tool in ("ldd", "ldconfig"):
        (bindir / tool).write_text(f"#!/bin/sh\necho {tool} >> {ran}\n")
        (bindir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    venv = tmp_path / "home" / "venv"
    ops = venv / "lib" / "python3.11" / "site-packages" / "deepspeed" / "ops" / "aio"
    ops.mkdir(parents=True)
    (ops / "async_io_op.so").write_text("")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").write_text(f"#!/bin/sh\necho python >> {ran}\necho '{{}}'\n")
    (venv / "bin" / "python").chmod(0o755)
    script = tmp_path / "home" / "nccl_profile.py"
    script.write_text(f"open({str(ran)!r}, 'a').write('profile\\n')\n")
    fact = tmp_path / "home" / "accelerators.fact"
    fact.write_text(f"#!/bin/sh\necho fact >> {ran}\n")
    fact.chmod(0o755)
    recorder = tmp_path / "record_versions.py"
    recorder.write_text("")
    os.chown(tmp_path / "home", 1000, 1000)

    versions = probe.versions(str(venv), str(recorder), str(tmp_path))
    assert versions["unsafe"] is True
    assert versions["error"].startswith(f"{venv}: {tmp_path / 'home'} belongs to cloudsdk;")
    aio = probe.libaio(str(venv))
    assert "belongs to cloudsdk" in aio["error"] and aio["async_io_op"] == ""
    ifname = probe.ifnames({"NCCL_SOCKET_IFNAME": "eth0"}, "/nonexistent", str(script), {})
    assert ifname["NCCL_SOCKET_IFNAME"]["unsafe"] is True
    assert ifname["NCCL_SOCKET_IFNAME"]["error"].startswith(f"{script}: ")
    fact_found = probe.accelerators(str(fact))
    assert fact_found["unsafe"] is True and fact_found["error"].startswith(f"{fact}: ")
    assert ran.read_text() == "ldconfig\n"  # only the system's ldconfig ran

    # the same tree root's: the venv's python and ldd run (what the refusal above kept out)
    os.chown(tmp_path / "home", 0, 0)
    ran.unlink()
    assert "error" not in probe.versions(str(venv), str(recorder), str(tmp_path))
    probe.libaio(str(venv))
    assert ran.read_text().splitlines() == ["python", "ldconfig", "ldd"]

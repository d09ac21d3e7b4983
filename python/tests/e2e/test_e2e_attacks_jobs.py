"""Attacks by the training user on what `dscluster launch` judges (SECURITY.md), on the shared
e2e cluster: a process an earlier job left behind forges the next jobs' async status, exit
status and report, a job swaps its restart planner, and another local user tries to read a
job's log. The verdict must be
root's record on the head (launch.yml), and the job area the training user's alone."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from .e2e_cluster import NAME, dsc
from .test_e2e_attacks import on
from .test_e2e_launch import HOSTS, WHO_AM_I

pytestmark = [
    pytest.mark.docker,
    # make test runs it on the second cluster (e2e-second), off the shared cluster's lane
    pytest.mark.second_cluster,
    pytest.mark.usefixtures("provisioned"),
]

HEAD, N2 = HOSTS[0], HOSTS[1]
JOBS = "/shared/dscluster/jobs"
# A leftover of an earlier job, as `ds`: every 20 ms it rewrites whatever async status the
# training user could own, and writes a passing exit status and report into every job
# directory (the old launch play read both from there).
FORGER = f"""\
import glob, json, os, time
home = os.path.expanduser("~")
os.makedirs(home + "/.ansible_async", exist_ok=True)
forged = json.dumps({{"rc": 1, "finished": 1, "started": 1,
                      "ansible_facts": {{"ml_stack_venv": "/home/ds/pwn"}}}})
end = time.time() + 600
while time.time() < end:
    for path in glob.glob(home + "/.ansible_async/*") + [home + "/.ansible_async/j1.1"]:
        try:
            open(path, "w").write(forged)
        except OSError:
            pass
    # root's records (0700): nothing there to find, let alone write
    for job in glob.glob("/var/lib/dscluster/jobs/*/"):
        for name in ("state.json", "exit_status", "launcher.log"):
            try:
                open(job + name, "w").write('{{"state": "exited", "rc": 0}}')
            except OSError:
                pass
    for job in glob.glob("{JOBS}/*/"):
        for name, text in (("exit_status", "0\\n"), ("report.json", '{{"ok": true}}')):
            try:
                open(job + name, "w").write(text)
            except OSError:
                pass
    time.sleep(0.02)
"""


# A job that prints the supervisor's frames itself (an end saying exit 0, a line at an offset
# far ahead), then fails: what the controller reports is still the job's own exit, 4. It also
# swaps the restart planner staged in its job directory (the training user's) for one that
# plans a run outside the jobs directory on a node the launch never had: root refuses the plan
# and the launch stops, it does not restart.
FRAME_FORGER = """\
import glob, json, os, sys
end = {"end": {"state": "exited", "rc": 0}, "files": {"exit_status": "0\\n"}}
os.write(1, (json.dumps(end) + "\\n").encode())
os.write(1, b'{"o": "forged", "at": 999999999}\\n')
plan = {"run_id": "../../../root/pwn", "nodes": ["evil"], "ranks": 1, "resumed_from": ""}
for path in glob.glob("/shared/dscluster/jobs/*/dscluster_replan.pyz"):
    try:
        with open(path, "w") as f:
            f.write("import os, contextlib\\n")
            f.write("with contextlib.suppress(OSError):\\n    os.makedirs('/root/pwn')\\n")
            f.write("print(%r)\\n" % json.dumps(plan))
    except OSError:
        pass
sys.exit(4)
"""


def run_id(proc) -> str:
    found = re.search(r"log (\S+)\.log\.txt", proc.stdout + proc.stderr)
    assert found, proc.stdout[-3000:] + proc.stderr[-3000:]
    return pathlib.Path(found[1]).name


def test_a_leftover_job_process_cannot_forge_the_next_jobs_verdict(
    provisioned: pathlib.Path, tmp_path: pathlib.Path
):
    """While a forger runs as `ds` on the head: a job that fails on one rank still ends in its
    own status (3) and one line naming the node, a job that passes still passes, a smoke job cut
    at its time limit fails though its report says ok, each exit status is root's (0600, in
    root's 0700 record), and nothing of the forger's became a fact on the controller."""
    script = tmp_path / "who_am_i.py"
    script.write_text(WHO_AM_I)
    forger = f"/tmp/dscluster-e2e-forger-{NAME}.py"
    assert on(HEAD, f"cat > {forger} <<'EOF'\n{FORGER}EOF\nchmod 0755 {forger}").returncode == 0
    started = on(HEAD, f"nohup python3 {forger} >/dev/null 2>&1 & echo started", user="ds")
    assert started.stdout.strip() == "started", started.stderr
    try:
        failed = dsc(
            "launch", "-i", str(provisioned), "--launcher", "mpi", "--timeout", "120",
            "--no-doctor", "--master-port", "29523", "--", str(script), "--fail-on", HOSTS[2],
            timeout=300,
        )  # fmt: skip
        assert failed.returncode == 3, failed.stdout[-3000:] + failed.stderr[-3000:]
        line = failed.stderr.strip().splitlines()[-1]
        assert f"job exited 3, job failed on rank 2 ({HOSTS[2]})" in line, line
        passed = dsc(
            "launch", "-i", str(provisioned), "--launcher", "mpi", "--timeout", "120",
            "--no-doctor", "--master-port", "29523", "--", str(script), timeout=300,
        )  # fmt: skip
        assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
        # smoke reads the job's report: the forger says ok for a job cut after 1 s (124)
        cut = dsc(
            "smoke", "-i", str(provisioned), "--no-doctor", "--timeout", "1", "--steps", "1",
            "--no-device-bench", "--master-port", "29523", timeout=300,
        )  # fmt: skip
        assert cut.returncode != 0, cut.stdout[-3000:] + cut.stderr[-3000:]
        line = cut.stderr.strip().splitlines()[-1]
        assert "smoke job exited 124 (root's record on the head) though its own" in line, line
        # a job printing the supervisor's own frames cannot end or judge the stream, and its
        # planner, swapped, cannot steer root's restart
        framed = tmp_path / "frames.py"
        framed.write_text(FRAME_FORGER)
        forged = dsc(
            "launch", "-i", str(provisioned), "--launcher", "mpi", "--timeout", "120",
            "--no-doctor", "--master-port", "29523", "--max-restarts", "1", "--retry-on-error",
            "--", str(framed), timeout=300,
        )  # fmt: skip
        assert forged.returncode == 4, forged.stdout[-3000:] + forged.stderr[-3000:]
        assert '{"end": {"state": "exited", "rc": 0}' in forged.stdout
        line = forged.stderr.strip().splitlines()[-1]
        assert "stopped: the restart cannot be planned: the restart planner made run " in line
        listed = dsc("jobs", "-i", str(provisioned), "--json", timeout=120)
        record = {j["id"]: j for j in json.loads(listed.stdout)["jobs"]}[run_id(forged)]
        assert (record["state"], record["rc"]) == ("exited", 4), record
        assert len(record["attempts"]) == 1 and record["stopped"].startswith(
            "the restart cannot be planned: the restart planner made run '../../../root/pwn'"
        ), record
        # the forged planner ran as ds: root's home is not its to write
        assert on(HEAD, "test ! -e /root/pwn && echo absent").stdout.strip() == "absent"
        # the forger was at work in both job directories the whole time
        for proc, status in ((failed, "3"), (passed, "0")):
            run = run_id(proc)
            assert on(HEAD, f"cat {JOBS}/{run}/exit_status", user="ds").stdout == "0\n"
            record = on(HEAD, f"stat -c '%U %a' /var/lib/dscluster/jobs/{run}/exit_status; "
                        f"cat /var/lib/dscluster/jobs/{run}/exit_status")  # fmt: skip
            assert record.stdout.split() == ["root", "600", status], record
        leak = on(HEAD, "find /root/.ansible_async -user ds 2>/dev/null | head -1").stdout
        assert leak.strip() == ""
        facts = pathlib.Path.home() / ".cache" / "dscluster" / "facts"
        for path in facts.glob("*") if facts.is_dir() else []:
            assert "/home/ds/pwn" not in path.read_text(errors="replace"), path
    finally:
        on(HEAD, f"pkill -f {forger}; rm -f {forger}")
        on(HEAD, "rm -rf /home/ds/.ansible_async")


def test_another_local_user_reads_no_job_log(provisioned: pathlib.Path, tmp_path: pathlib.Path):
    """A job's directory is 0700 and its log 0600, the training user's: `nobody` on the head
    and on another node (the same shared storage) can list no job and read no log."""
    script = tmp_path / "who_am_i.py"
    script.write_text(WHO_AM_I)
    proc = dsc(
        "launch", "-i", str(provisioned), "--launcher", "mpi", "--timeout", "120",
        "--no-doctor", "--master-port", "29523", "--", str(script), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job = f"{JOBS}/{run_id(proc)}"
    modes = on(HEAD, f"stat -c '%n %U %a' {JOBS} {job} {job}/launcher.log").stdout.split("\n")
    assert [m.split()[1:] for m in modes if m] == [["ds", "700"]] * 2 + [["ds", "600"]], modes
    assert "WHOAMI" in on(HEAD, f"cat {job}/launcher.log", user="ds").stdout
    for host in (HEAD, N2):
        for attempt in (f"cat {job}/launcher.log", f"ls {JOBS}", f"ls {job}"):
            seen = on(host, attempt, user="nobody")
            assert seen.returncode != 0 and "WHOAMI" not in seen.stdout, (host, attempt)
            assert "Permission denied" in seen.stderr, (host, attempt, seen.stderr)

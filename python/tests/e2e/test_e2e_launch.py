"""Launch modes end to end on the shared e2e cluster: the smoke job under torchrun and
OpenMPI, `dscluster launch` of a user's script with --exclude under every launcher, a failing
rank named, and the MPI hostfile of a dry run checked by mpirun's own mapper and DeepSpeed's
hostfile parser on the head. Needs a Docker engine and a provisioned cluster."""

from __future__ import annotations

import json
import pathlib
import re
import textwrap
import time

import pytest

from .e2e_cluster import NAME, NODES, docker, dsc

pytestmark = pytest.mark.docker

HOSTS = [f"{NAME}-n{i}" for i in range(1, NODES + 1)]
HEAD = f"dsc-{NAME}-n1"
# Not the launchers' default 29500: other jobs may run on a shared cluster meanwhile.
PORT = "29517"

WHO_AM_I = textwrap.dedent(
    """\
    import json, os, socket, sys
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    # one write per line: print() under PYTHONUNBUFFERED writes the text and the newline
    # separately, and mpirun may forward another rank's text in between
    os.write(1, ("WHOAMI " + json.dumps({"rank": os.environ.get("RANK"),
             "world": os.environ.get("WORLD_SIZE"), "host": socket.gethostname(),
             "args": args}) + "\\n").encode())
    sys.exit(3 if "--fail-on" in args and socket.gethostname() == args[-1] else 0)
    """
)


def ranks_reported(stdout: str) -> list[dict]:
    return [
        json.loads(line.split("WHOAMI ", 1)[1]) for line in stdout.splitlines() if "WHOAMI " in line
    ]


# With test_e2e's deepspeed-launcher ZeRO-2 run, the launchers also cover the other stages.
@pytest.mark.parametrize(("launcher", "zero"), [("torchrun", 3), ("mpi", 1)])
def test_smoke_with_launcher_across_every_slot(cluster: pathlib.Path, launcher: str, zero: int):
    started = time.monotonic()
    proc = dsc(
        "smoke", "-i", str(cluster), "--launcher", launcher, "--master-port", PORT, "--no-doctor",
        "--zero", str(zero), "--steps", "10", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"smoke test passed: {NODES} ranks" in proc.stdout  # the table output, not --json
    report = json.loads((cluster / "reports" / "smoke-latest.json").read_text())
    assert report["ok"] is True and report["launcher"] == launcher
    assert report["zero_stage"] == zero
    assert report["world_size"] == NODES
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(NODES))
    assert {r["host"] for r in report["ranks"]} == set(HOSTS)
    assert all(r["last_loss"] < r["first_loss"] for r in report["ranks"])
    assert len({r["checksum"] for r in report["ranks"]}) == 1
    # the launch time reached every rank through this launcher: each first step falls
    # between this command's start and its end
    elapsed = time.monotonic() - started
    assert all(0 < (r["first_step_s"] or 0) < elapsed for r in report["ranks"]), report["ranks"]


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "mpi"])
def test_launch_user_script_with_exclude(cluster: pathlib.Path, tmp_path: pathlib.Path, launcher):
    script = tmp_path / "who_am_i.py"
    script.write_text(WHO_AM_I)
    left_out = HOSTS[1]
    # torchrun and mpi pass any argument exactly; DeepSpeed's pdsh runner only spaces
    odd = "it's $HOME; 50%n" if launcher != "deepspeed" else "two words"
    proc = dsc(
        "launch", "-i", str(cluster), "--launcher", launcher, "--exclude", left_out, "--no-doctor",
        "--master-port", PORT, "--timeout", "120", "--", str(script), "--tag", odd, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = ranks_reported(proc.stdout)
    assert sorted(r["host"] for r in ranks) == [h for h in HOSTS if h != left_out]
    assert sorted(r["rank"] for r in ranks) == [str(i) for i in range(NODES - 1)]
    assert {r["world"] for r in ranks} == {str(NODES - 1)}
    assert all(r["args"] == ["--tag", odd] for r in ranks)
    log = re.search(r"log (\S+\.log\.txt)", proc.stderr)
    assert log and "WHOAMI" in pathlib.Path(log[1]).read_text()


def test_launch_exits_with_the_jobs_status_naming_the_node(cluster: pathlib.Path, tmp_path):
    script = tmp_path / "who_am_i.py"
    script.write_text(WHO_AM_I)
    proc = dsc(
        "launch", "-i", str(cluster), "--launcher", "mpi", "--timeout", "120", "--no-doctor",
        "--master-port", PORT, "--", str(script), "--fail-on", HOSTS[2], timeout=300,
    )  # fmt: skip
    assert proc.returncode == 3  # the job's own status
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("dscluster: error: launch "), line
    # its log (mpirun's banner lines included) does not spoil the inventory directory
    again = dsc("hostfile", "-i", str(cluster), timeout=120)
    assert again.returncode == 0, again.stderr
    # A script's own error is not a lost node: every node stayed reachable.
    assert f"job exited 3, job failed on rank 2 ({HOSTS[2]}), every node reachable" in line
    assert "lost node" not in line
    # sys.exit("...") leaves no traceback: its message is the error, with its node; a
    # missing module elsewhere gets its known fix.
    script = tmp_path / "fails.py"
    script.write_text(FAILS)
    proc = dsc(
        "launch", "-i", str(cluster), "--timeout", "120", "--no-doctor", "--master-port", PORT,
        "--", str(script), HOSTS[1], HOSTS[2], timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert f"; first error on {HOSTS[1]}: no data on {HOSTS[1]}; " in line, line
    assert (
        f"known error on {HOSTS[2]}: ModuleNotFoundError: No module named 'dscluster_e2e_gone'\n"
        "    fix: add dscluster_e2e_gone (its name on PyPI) to ml_stack_extra_requirements "
        "and run 'dscluster provision'\n"
    ) in proc.stderr, proc.stderr[-3000:]


# One node exits with a message and no traceback; another, a little later (its failure is not
# the first), lacks a module.
FAILS = textwrap.dedent(
    """\
    import socket, sys, time
    host = socket.gethostname()
    if host == sys.argv[-2]:
        sys.exit(f"no data on {host}")
    time.sleep(3)
    if host == sys.argv[-1]:
        import dscluster_e2e_gone
    """
)


HANG_AT_EXIT = textwrap.dedent(
    """\
    import os, socket, sys, time
    rank = os.environ.get("RANK")
    os.write(1, f"UP rank {rank} on {socket.gethostname()}\\n".encode())
    if rank == sys.argv[-1]:
        time.sleep(900)  # as a rank deadlocked at exit: the others are done
    """
)


def test_launch_cut_at_its_time_limit_names_the_rank_still_running(
    cluster: pathlib.Path, tmp_path: pathlib.Path
):
    """A job cut by --timeout says which rank was still running, and on which node: the
    others finished (their torchrun agents still waiting for it are not ranks). The limit is
    waited out in full, on e2e's critical path: 45 s (was 60), ample for ranks that import
    nothing heavy to print UP (torchrun's agents import torch; the ranks do not)."""
    script = tmp_path / "hang_at_exit.py"
    script.write_text(HANG_AT_EXIT)
    proc = dsc(
        "launch", "-i", str(cluster), "--launcher", "torchrun", "--timeout", "45",
        "--no-doctor", "--master-port", PORT, "--", str(script), "1", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 124, proc.stdout[-3000:] + proc.stderr[-2000:]
    for rank, host in enumerate(HOSTS):
        assert f"UP rank {rank} on {host}" in proc.stdout, proc.stdout[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "job exited 124 (cut at --timeout; still running at the time limit: " in line, line
    note = line.split("still running at the time limit: ", 1)[1]
    assert note.startswith(f"rank 1 on {HOSTS[1]} (") and "hang_at_exit.py 1)" in note, line
    assert HOSTS[0] not in note and HOSTS[2] not in note, line


def test_launch_unknown_host_is_one_line_before_anything_runs(cluster: pathlib.Path):
    proc = dsc("launch", "-i", str(cluster), "--include", "nosuch", "--", "/bin/true", timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"dscluster: error: --include names host 'nosuch', which is not in the hostfile "
        f"({', '.join(HOSTS)})"
    ]


def test_mpi_dry_run_hostfile_accepted_by_mpirun_and_deepspeed(cluster: pathlib.Path, tmp_path):
    proc = dsc(
        "launch", "-i", str(cluster), "--launcher", "mpi", "--dry-run", "--no-stage",
        "--exclude", HOSTS[1], "--", "/opt/train.py", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("mpirun --hostfile mpi_hostfile -np 2 ")
    assert lines[1].endswith(" ./mpi_rank.sh /opt/train.py")
    start = lines.index("# --- mpi_hostfile") + 1
    hostfile = lines[start : lines.index("# --- mpi_rank.sh")]
    assert hostfile == [f"{HOSTS[0]} slots=1", f"{HOSTS[2]} slots=1"]
    # every slot, for the user's own mpirun, beside the inventory
    full = (cluster / "mpi_hostfile").read_text().splitlines()
    assert full == [f"{h} slots=1" for h in HOSTS]
    docker("exec", HEAD, "mkdir", "-p", "/tmp/mpicheck")
    docker("cp", str(cluster / "mpi_hostfile"), f"{HEAD}:/tmp/mpicheck/all")
    (path := tmp_path / "mpi_hostfile").write_text("\n".join(hostfile) + "\n")
    docker("cp", str(path), f"{HEAD}:/tmp/mpicheck/job")
    docker("exec", HEAD, "chmod", "-R", "a+rX", "/tmp/mpicheck")
    for name, expect in (("job", [HOSTS[0], HOSTS[2]]), ("all", HOSTS)):
        # OpenMPI's mapper on the head: which node gets which ranks, nothing started.
        shown = docker(
            "exec", "-u", "ds", HEAD, "mpirun", "--hostfile", f"/tmp/mpicheck/{name}",
            "-np", str(len(expect)), "--map-by", "slot", "--bind-to", "none",
            "--display-map", "--do-not-launch", "true",
        )  # fmt: skip
        nodes = re.findall(r"Data for node: (\S+)\s+Num slots: (\d+).*?Num procs: (\d+)", shown)
        assert nodes == [(h, "1", "1") for h in expect], shown
        ranks = [int(r) for r in re.findall(r"Process rank: (\d+)", shown)]
        assert ranks == list(range(len(expect)))
    check = (
        "from deepspeed.launcher.runner import fetch_hostfile; import json; "
        "print(json.dumps(dict(fetch_hostfile('/tmp/mpicheck/job'))))"
    )
    printed = docker("exec", HEAD, "/opt/dscluster/venv/bin/python", "-c", check)
    assert json.loads(printed.strip().splitlines()[-1]) == {HOSTS[0]: 1, HOSTS[2]: 1}

"""Launch builders: DeepSpeed's include/exclude rules, the argv of each launcher, the MPI
hostfile, heterogeneous slots, quoting, one-line errors."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
import uuid

import pytest
import yaml

from dscluster import cli
from dscluster.cli import flags
from dscluster.errors import DsclusterError
from dscluster.hostfile import render_hostfile
from dscluster.jobs import launch_watch
from dscluster.launch import (
    LAUNCH_TIME,
    JobSite,
    LaunchRequest,
    accelerate,
    build_plan,
    lost_nodes,
    modes,
    parse_node_specs,
    render_mpi_hostfile,
    select_resources,
)

POOL = {"h1": 4, "h2": 2, "h3": 1}
ENV = "PATH=/opt/v/bin:/usr/bin\nOMP_NUM_THREADS=2\nNCCL_SOCKET_IFNAME=eth0\n"


def plan(launcher: str, program=("train.py", "--lr", "0.1"), **kw):
    args = {
        "launcher": launcher,
        "run_id": "launch-1",
        "job_dir": "/shared/dscluster/jobs/launch-1",
        "head": "h1",
        "venv": "/opt/v",
        "pool": POOL,
        "accelerators": dict.fromkeys(POOL, "cuda"),
        "hostfile_text": render_hostfile(POOL.items()),
        "env_text": ENV,
        "program": list(program),
    }
    args.update(kw)
    site = {f.name: args.pop(f.name) for f in dataclasses.fields(JobSite) if f.name in args}
    return build_plan(LaunchRequest(**args), JobSite(**site))


# --- DeepSpeed's include/exclude semantics (deepspeed/launcher/runner.py) ---------------------


def test_node_specs_as_deepspeeds_parse_node_config_list():
    assert parse_node_specs("h1:0,2@h2", "--include") == {"h1": [0, 2], "h2": []}
    # a host named twice gets the union of its slots, sorted, no repeats
    assert parse_node_specs("h1:3@h1:1,3", "--include") == {"h1": [1, 3]}


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, {"h1": [0, 1, 2, 3], "h2": [0, 1], "h3": [0]}),
        # docstring example: all slots of one host, chosen slots of another
        ({"include": "h1@h2:1"}, {"h1": [0, 1, 2, 3], "h2": [1]}),
        # result keeps hostfile order, not the order the filter names hosts
        ({"include": "h3@h1:2"}, {"h1": [2], "h3": [0]}),
        ({"exclude": "h2"}, {"h1": [0, 1, 2, 3], "h3": [0]}),
        ({"exclude": "h1:0,3"}, {"h1": [1, 2], "h2": [0, 1], "h3": [0]}),
        # a host whose every slot is excluded disappears
        ({"exclude": "h2:0,1@h3"}, {"h1": [0, 1, 2, 3]}),
        ({"num_nodes": 2}, {"h1": [0, 1, 2, 3], "h2": [0, 1]}),
        ({"num_nodes": 2, "num_gpus": 1}, {"h1": [0], "h2": [0]}),
    ],
)
def test_select_resources_follows_deepspeed(kw, expected):
    assert select_resources(POOL, **kw) == expected
    assert list(select_resources(POOL, **kw)) == list(expected)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"include": "h9"}, "--include names host 'h9', which is not in the hostfile (h1, h2, h3)"),
        ({"exclude": "h1@nope:0"}, "--exclude names host 'nope'"),
        ({"include": "h2:2"}, "--include names slot 2 on h2, which has slots 0-1"),
        ({"include": "h1", "exclude": "h2"}, "--include and --exclude are mutually exclusive"),
        ({"include": "h1", "num_nodes": 1}, "cannot be combined with --include/--exclude"),
        ({"include": "h1:x"}, "slots in 'h1:x' are not integers"),
        ({"include": "h1:0:1"}, "more than one ':'"),
        ({"exclude": "h1@h2@h3"}, "leaves no slot to run on"),
        ({"num_gpus": 3}, "--num-gpus 3 is more than the slots of h2 (2), h3 (1)"),
        ({"num_nodes": 0}, "--num-nodes 0"),
    ],
)
def test_select_resources_errors_are_one_line(kw, message):
    with pytest.raises(DsclusterError) as exc:
        select_resources(POOL, **kw)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


# --- deepspeed ----------------------------------------------------------------------------


def test_deepspeed_passes_filters_verbatim():
    p = plan("deepspeed", include="h1:0,1@h3")
    assert p.argv == [
        "/opt/v/bin/deepspeed", "--hostfile", "hostfile", "--launcher", "pdsh", "--force_multi",
        "--master_addr", "h1", "--master_port", "29500",
        "--include", "h1:0,1@h3", "--no_python", "./ds_rank.sh", "train.py", "--lr", "0.1",
    ]  # fmt: skip
    assert p.world_size == 3
    assert p.files["hostfile"][0] == "h1 slots=4\nh2 slots=2\nh3 slots=1\n"


@pytest.mark.parametrize("kw", [{"include": "h2"}, {"num_nodes": 1}, {"exclude": "h2@h3"}])
def test_deepspeed_runs_one_node_over_pdsh_too(kw):
    """DeepSpeed's runner reads .deepspeed_env only for a pdsh run: a one-node run (the last
    attempt of launch --max-restarts) must be one too, or its ranks miss the job's variables."""
    p = plan("deepspeed", **kw)
    assert len(p.resources) == 1
    assert "--force_multi" in p.argv[: p.argv.index("--no_python")]


def test_deepspeed_master_is_first_selected_host_and_filter_is_checked_first():
    p = plan("deepspeed", exclude="h1", master_port=29511)
    assert p.argv[p.argv.index("--master_addr") + 1] == "h2"
    assert "29511" in p.argv
    with pytest.raises(DsclusterError, match="host 'h4'"):
        plan("deepspeed", exclude="h4")


@pytest.mark.parametrize("arg", ["a;b", "$HOME", "it's", "50%n", 'a"b', ""])
def test_deepspeed_refuses_args_its_pdsh_runner_would_change(arg):
    with pytest.raises(DsclusterError, match="use --launcher torchrun or mpi"):
        plan("deepspeed", program=["train.py", arg])


def test_deepspeed_keeps_args_with_spaces_and_the_launch_time():
    p = plan("deepspeed", program=["train.py", "--name", "a b", "--t", LAUNCH_TIME])
    script = p.files["launch.sh"][0]
    assert "train.py --name 'a b' --t \"$DSCLUSTER_LAUNCH_TIME\"" in script
    # the deepspeed launcher reads the head's ./.deepspeed_env and exports it to every rank
    assert 'echo "DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME" >> .deepspeed_env' in script


# --- torchrun -----------------------------------------------------------------------------


def test_torchrun_heterogeneous_slots_each_node_its_own_nproc():
    p = plan("torchrun", pool={"h1": 4, "h2": 2}, hostfile_text="h1 slots=4\nh2 slots=2\n")
    assert p.argv[:6] == ["pdsh", "-S", "-f", "1024", "-w", "h1,h2"]
    assert p.argv[6:9] == ["bash", "/shared/dscluster/jobs/launch-1/torchrun_node.sh", "%h"]
    script = p.files["torchrun_node.sh"][0]
    common = (
        "--nnodes 2 --nproc-per-node {n} --rdzv-backend c10d --rdzv-endpoint h1:29500 "
        "--rdzv-id launch-1 --rdzv-conf is_host={host} --max-restarts 0 train.py --lr 0.1 ;;"
    )
    assert f"  h1) exec /opt/v/bin/torchrun {common.format(n=4, host=1)}" in script
    assert f"  h2) exec /opt/v/bin/torchrun {common.format(n=2, host=0)}" in script
    # .deepspeed_env exported on every node, as DeepSpeed's PDSH runner does
    assert "export OMP_NUM_THREADS=2\nexport NCCL_SOCKET_IFNAME=eth0\n" in script
    assert p.world_size == 6


def test_torchrun_slot_filter_pins_devices_and_moves_the_rendezvous():
    p = plan("torchrun", include="h2:1@h3")
    script = p.files["torchrun_node.sh"][0]
    assert "  h2) export CUDA_VISIBLE_DEVICES=1; exec " in script
    assert "--rdzv-endpoint h2:29500" in script and "h1)" not in script
    assert "  h3) exec " in script  # all of h3's slots: nothing to pin
    assert p.argv[5] == "h2,h3"


def test_torchrun_node_script_quotes_args_exactly(tmp_path):
    odd = ["it's", "$HOME", "a b", "x;y", "50%n", ""]
    p = plan("torchrun", program=["train.py", *odd])
    script = p.files["torchrun_node.sh"][0]
    line = next(ln for ln in script.splitlines() if ln.startswith("  h3)"))
    # run what bash would exec: print the argv instead of exec'ing torchrun
    cmd = line.split(") ", 1)[1].removesuffix(" ;;").replace("exec ", "printf '%s\\n' ", 1)
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[-len(odd) - 1 : -1] == odd


# --- mpi ----------------------------------------------------------------------------------


def test_mpi_hostfile_is_openmpis_format():
    assert render_mpi_hostfile({"h1": [0, 1, 2, 3], "h2": [0, 1]}) == "h1 slots=4\nh2 slots=2\n"


def test_mpi_argv_exports_env_and_wraps_ranks():
    p = plan("mpi", exclude="h2", interface="eth0")
    argv = p.argv
    assert argv[:5] == ["mpirun", "--hostfile", "mpi_hostfile", "-np", "5"]
    assert p.files["mpi_hostfile"] == ("h1 slots=4\nh3 slots=1\n", "0644")
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert exported == [
        "PATH=/opt/v/bin:/usr/bin", "OMP_NUM_THREADS=2", "NCCL_SOCKET_IFNAME=eth0",
        "MASTER_ADDR=h1", "MASTER_PORT=29500", "DSCLUSTER_LAUNCH_TIME",
    ]  # fmt: skip
    assert argv[argv.index("plm_rsh_agent") - 1 :][:3] == ["--mca", "plm_rsh_agent", "ssh"]
    assert argv[argv.index("--bind-to") :][:2] == ["--bind-to", "none"]
    assert argv[-4:] == ["./mpi_rank.sh", "train.py", "--lr", "0.1"]
    text, mode = p.files["mpi_rank.sh"]
    # the rank runs under the job's launch_watch.py (staged beside it), which says its exit
    exec_line = text.rstrip("\n").splitlines()[-1]
    assert mode == "0755" and exec_line == (
        'exec /opt/v/bin/python -S -u launch_watch.py rank -- /opt/v/bin/python -u "$@"'
    )
    assert "launch_watch.py" in p.files


# A rank's python: prints its environment, then does what its first argument says.
ENV_RANK = "import os, sys\nfor k, v in sorted(os.environ.items()):\n    print(f'{k}={v}')\n"


def stage_mpi_wrapper(tmp_path) -> None:
    """mpi_rank.sh and launch_watch.py in tmp_path (the job directory), this interpreter for
    the nodes' python."""
    p = plan("mpi")
    (tmp_path / "launch_watch.py").write_text(p.files["launch_watch.py"][0])
    wrapper = tmp_path / "mpi_rank.sh"
    wrapper.write_text(p.files["mpi_rank.sh"][0].replace("/opt/v/bin/python", sys.executable))


def start_mpi_rank(tmp_path, code: str) -> subprocess.Popen[str]:
    """Rank 5 running `python -c code` under mpi_rank.sh, as mpirun starts it."""
    stage_mpi_wrapper(tmp_path)
    return subprocess.Popen(
        ["sh", "./mpi_rank.sh", "-c", code], env={"PATH": "/usr/bin:/bin", **MPI_RANK_5},
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def run_mpi_wrapper(tmp_path, env: dict, *args: str) -> subprocess.CompletedProcess[str]:
    """mpi_rank.sh as mpirun runs it: /bin/sh in the job directory (stage_mpi_wrapper)."""
    stage_mpi_wrapper(tmp_path)
    return subprocess.run(
        ["sh", "./mpi_rank.sh", *args], env={"PATH": "/usr/bin:/bin", **env}, cwd=tmp_path,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def env_of(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def test_mpi_rank_wrapper_maps_openmpis_rank_variables(tmp_path):
    env = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    proc = run_mpi_wrapper(tmp_path, env, "-c", ENV_RANK)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    got = env_of(proc)
    assert (got["RANK"], got["WORLD_SIZE"], got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"]) == (
        "5", "6", "1", "2",
    )  # fmt: skip


MPI_RANK_5 = {
    "OMPI_COMM_WORLD_RANK": "5",
    "OMPI_COMM_WORLD_SIZE": "7",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
}


def test_mpi_rank_says_its_own_non_zero_exit_naming_the_rank(tmp_path):
    """mpirun's verdict may be missing (the other ranks ended normally before mpirun acted on
    the failure): the rank's own line then names it; its status is passed on unchanged."""
    proc = run_mpi_wrapper(tmp_path, MPI_RANK_5, "-c", "import sys; print('out'); sys.exit(3)")
    assert proc.returncode == 3
    assert proc.stdout == "out\n"
    assert proc.stderr.splitlines() == ["dscluster: rank 5 exited with code 3"]
    assert launch_watch.RANK_EXITED_RE.match(proc.stderr.strip())
    ok = run_mpi_wrapper(tmp_path, MPI_RANK_5, "-c", "print('fine')")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "fine\n", "")
    # stdin reaches the rank (mpirun forwards it to rank 0)
    echo = subprocess.run(
        ["sh", "./mpi_rank.sh", "-c", "import sys; print(sys.stdin.read().upper())"],
        env={"PATH": "/usr/bin:/bin", **MPI_RANK_5}, cwd=tmp_path, input="hello",
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (echo.returncode, echo.stdout) == (0, "HELLO\n")


def test_mpi_rank_killed_by_a_signal_ends_its_wrapper_by_that_signal(tmp_path):
    # mpirun then says "exited on signal 9" for the rank: a lost rank, not a script error
    proc = run_mpi_wrapper(
        tmp_path, MPI_RANK_5, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    )
    assert proc.returncode == -signal.SIGKILL
    assert "exited with code" not in proc.stderr


def test_mpi_rank_does_not_outlive_its_wrapper_killed_outright(tmp_path):
    """mpirun's daemon SIGKILLs a rank's process that outlasts its SIGTERM: the rank (its
    child, here one that ignores SIGTERM) goes with it, as it did when it was that process,
    instead of holding the job's output open until the time limit."""
    code = (
        "import os, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(os.getpid(), flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = start_mpi_rank(tmp_path, code)
    assert proc.stdout is not None
    rank = int(proc.stdout.readline())
    assert rank != proc.pid  # the rank is the wrapper's child
    proc.send_signal(signal.SIGTERM)  # ignored by the rank
    time.sleep(0.5)
    assert proc.poll() is None
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(rank, 0)
        except ProcessLookupError:
            break
        # reaped by init, or a zombie of ours until then: its state says
        with contextlib.suppress(FileNotFoundError):
            if pathlib.Path(f"/proc/{rank}/stat").read_text().split(") ")[1][0] == "Z":
                break
        time.sleep(0.1)
    else:
        os.kill(rank, signal.SIGKILL)
        pytest.fail(f"the rank ({rank}) outlived its wrapper")


@pytest.mark.parametrize(("handled", "rc"), [(True, 5), (False, -signal.SIGTERM)])
def test_mpi_rank_gets_the_signals_sent_to_its_wrapper(tmp_path, handled, rc):
    """mpirun ends a job by signalling each rank's process (the wrapper's): the rank gets
    them, and exits as it chooses (a handler's exit 5, said) or by the signal (not said)."""
    code = "import signal, sys, time\n"
    if handled:
        code += (
            "def term(*_):\n"
            "    print('got TERM', flush=True)\n"
            "    sys.exit(5)\n"
            "signal.signal(signal.SIGTERM, term)\n"
        )
    code += "print('UP', flush=True)\ntime.sleep(60)\n"
    proc = start_mpi_rank(tmp_path, code)
    assert proc.stdout is not None and proc.stdout.readline() == "UP\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == rc
    if handled:
        assert out == "got TERM\n"
        assert err.splitlines() == ["dscluster: rank 5 exited with code 5"]
    else:
        assert "exited with code" not in err


def test_mpi_refuses_what_a_hostfile_cannot_express():
    with pytest.raises(DsclusterError, match="cannot pin ranks to slots \\[2\\] on h1"):
        plan("mpi", include="h1:2")
    # CPU slots are not devices: any of them will do
    assert plan("mpi", include="h1:2", accelerators=dict.fromkeys(POOL, "cpu")).world_size == 1


# --- every launcher -----------------------------------------------------------------------


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "mpi"])
def test_launch_script_runs_the_argv_from_the_job_dir(launcher):
    p = plan(launcher)
    text, mode = p.files["launch.sh"]
    assert mode == "0755"
    assert text.startswith("#!/bin/bash\n")
    assert "export PATH=/opt/v/bin:" in text and "export PDSH_RCMD_TYPE=ssh" in text
    # the launcher runs under launch_watch.py, staged beside it
    assert text.rstrip().endswith(" -- " + p.command)
    assert "exec /opt/v/bin/python -u launch_watch.py --grace 10 " in text
    assert '--marker "DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME" --hosts h1,h2,h3 --' in text
    assert p.files["launch_watch.py"][1] == "0644"
    assert "export PDSH_SSH_ARGS_APPEND='-o ServerAliveInterval=5" in text
    assert shlex.split(p.command.replace('"$DSCLUSTER_LAUNCH_TIME"', "T")) == [
        "T" if a == LAUNCH_TIME else a for a in p.argv
    ]


def test_plan_errors():
    with pytest.raises(DsclusterError, match="launcher 'srun' is unknown"):
        plan("srun")
    with pytest.raises(DsclusterError, match="no script to run"):
        plan("torchrun", program=[])
    with pytest.raises(DsclusterError, match="not a TCP port"):
        plan("mpi", master_port=70000)


def test_cli_parser_takes_the_script_after_double_dash():
    parser = cli.build_parser()
    args = parser.parse_args(
        ["launch", "-i", "inv", "--launcher", "mpi", "--exclude", "h2", "--", "t.py", "--x", "1"]
    )
    assert (args.launcher, args.exclude, args.program) == ("mpi", "h2", ["--", "t.py", "--x", "1"])
    assert flags.after_dashes(args.program) == ["t.py", "--x", "1"]
    # --master-port: unset on the command line, the inventory's or the default applies
    assert args.master_port is None
    assert parser.parse_args(["launch", "-i", "x", "--port", "29411"]).master_port == 29411
    with pytest.raises(SystemExit):
        parser.parse_args(["launch", "-i", "x", "--launcher", "srun"])


def test_lost_nodes_blames_the_killed_rank_not_the_ranks_it_broke():
    log = [
        "n1: [rank0]: RuntimeError: Connection closed by peer",
        "n1: [ERROR] [launch.py:335:sigkill_handler] ['python'] exits with return code = 1",
        "pdsh@n1: n1: ssh exited with exit code 1",
        "n2: [ERROR] [launch.py:335:sigkill_handler] ['python'] exits with return code = -9",
        "pdsh@n1: n2: ssh exited with exit code 247",
    ]
    assert lost_nodes(log) == {"n2": "a rank exited with code -9"}
    # `pkill -9 -f smoke_job.py` kills the node's launcher too: only pdsh's line is left
    log = [log[2], "pdsh@n1: n2: ssh exited with exit code 137"]
    assert lost_nodes(log) == {"n2": "remote command killed by signal 9"}
    assert lost_nodes(log[:1]) == {"n1": "remote command exited with code 1"}
    assert lost_nodes(["pdsh@n1: n3: ssh exited with exit code 247"]) == {
        "n3": "a rank was killed by signal 9"
    }


def test_lost_nodes_from_torchrun_and_mpirun_logs():
    torchrun_log = [
        "n2: [rank1]: RuntimeError: Connection closed by peer",
        "n2:   exitcode  : 1 (pid: 77)",
        "n1:   exitcode  : 0 (pid: 12)",
    ]
    assert lost_nodes(torchrun_log) == {"n2": "a rank exited with code 1"}
    mpi_log = [
        "mpirun noticed that process rank 2 with PID 0 on node n3 exited on signal 9 (Killed).",
    ]
    assert lost_nodes(mpi_log) == {"n3": "a rank was killed by signal 9"}
    verdict = [
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "  Process name: [[27718,1],4]",
        "  Exit code:    3",
    ]
    rank_hosts = plan("mpi").rank_hosts
    assert rank_hosts == ["h1", "h1", "h1", "h1", "h2", "h2", "h3"]
    assert lost_nodes(verdict, rank_hosts) == {"h2": "rank 4 exited with code 3"}
    assert lost_nodes(["ssh: connect to host n3 port 22: No route to host"]) == {
        "n3": "ssh: connect to host n3 port 22: No route to host"
    }


# --- launch_watch.py: a lost node ends the job within the grace, not a collective's timeout --

WATCH = pathlib.Path(launch_watch.__file__)


@pytest.fixture
def fake_pdsh(tmp_path: pathlib.Path, monkeypatch) -> pathlib.Path:
    """A `pdsh` that records its argv and runs the remote command here, on this machine, so
    the reaping really kills the marked processes (every 'node' is this machine)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pdsh = bin_dir / "pdsh"
    # pdsh's "host: " prefix, as the first host of -w (every "node" is this machine); the
    # other hosts hold none of the job, so they print the survey's last line alone. A host
    # in $FAKE_PDSH_SILENT prints nothing (it did not answer within pdsh -u).
    pdsh.write_text(
        '#!/bin/bash\necho "$@" >> "$PDSH_ARGS_LOG"\n'
        'while [ "$1" != -w ]; do shift; done; hosts=${2//,/ }; host=${2%%,*}\n'
        '{ bash -c "${@: -1}" | sed "s/^/$host: /"\n'
        '  for h in ${hosts#"$host"}; do case "${@: -1}" in\n'
        '    *dscluster-surveyed*) echo "$h: dscluster-surveyed" ;; esac; done\n'
        '} | grep -v "^${FAKE_PDSH_SILENT:-none}: "\nexit 0\n'
    )
    pdsh.chmod(0o755)
    for name in launch_watch.RANK_VARS:  # only the test's own "ranks" carry one
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("PDSH_ARGS_LOG", str(tmp_path / "pdsh.args"))
    return tmp_path / "pdsh.args"


def watch(tmp_path, launcher: str, *extra: str, timeout: float = 60):
    script = tmp_path / "launcher.sh"
    script.write_text(launcher)
    marker = f"DSCLUSTER_LAUNCH_TIME=test-{uuid.uuid4().hex}"
    argv = [sys.executable, "-u", str(WATCH), "--grace", "1", "--term-wait", "1"]
    argv += ["--marker", marker, "--hosts", "h1,h2,h3", *extra, "--", "bash", str(script)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    return proc, started, marker


def alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_watch_ends_a_launcher_that_hangs_after_losing_a_node(tmp_path, fake_pdsh):
    # The launcher: a "rank" outside its process group (as remote ranks are), the pdsh line
    # of a lost node, then a hang as ranks waiting in a collective would.
    proc, started, marker = watch(
        tmp_path,
        "setsid sleep 300 & echo $! > rank.pid\n"
        "echo 'h1: step 1'\n"
        "echo 'pdsh@h1: h3: ssh exited with exit code 255'\n"
        "sleep 300 & echo $! > hang.pid; wait\n",
    )
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 1
    assert took < 15, f"took {took:.1f} s"
    lines = out.splitlines()
    assert "h1: step 1" in lines and "pdsh@h1: h3: ssh exited with exit code 255" in lines
    assert "dscluster: lost node h3 (ssh exited with exit code 255); the job ends within 1 s" in out
    assert "dscluster: ending the launcher 1 s after losing h3" in out
    # the launcher's group is gone, and the marked rank was reaped on the reachable nodes
    assert not alive(int((tmp_path / "hang.pid").read_text()))
    assert not alive(int((tmp_path / "rank.pid").read_text()))
    reaped = fake_pdsh.read_text()
    assert " -w h1,h2 " in reaped and marker in reaped


def test_watch_keeps_the_launchers_own_status(tmp_path, fake_pdsh):
    proc, _, _ = watch(tmp_path, "echo 'h2: a rank exited'\nexit 3\n")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "ending the launcher" not in out
    assert " -w h1,h2,h3 " in fake_pdsh.read_text()  # a failed job is cleaned up everywhere
    fake_pdsh.unlink()
    proc, _, _ = watch(tmp_path, "echo ok\n")
    out, _ = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "ok\n")
    assert not fake_pdsh.exists()  # nothing to clean up after a job that ended well


def test_watch_passes_the_marker_to_the_launcher_alone(tmp_path, fake_pdsh):
    proc, _, marker = watch(tmp_path, 'echo "seen $DSCLUSTER_LAUNCH_TIME"\n')
    out, _ = proc.communicate(timeout=60)
    assert out == f"seen {marker.split('=', 1)[1]}\n"
    env = pathlib.Path(f"/proc/{os.getpid()}/environ").read_bytes()
    assert marker.encode() not in env


def test_watch_ends_the_job_on_sigterm(tmp_path, fake_pdsh):
    proc, started, _ = watch(tmp_path, "sleep 300 & echo $! > hang.pid; echo started; wait\n")
    assert proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 124
    assert "dscluster: the job's time limit was reached; ending the launcher" in out
    # the launcher's own processes carry the marker but no rank variable
    assert "dscluster: no rank was still running at the time limit\n" in out
    assert time.monotonic() - started < 15
    assert not alive(int((tmp_path / "hang.pid").read_text()))


def test_watch_names_the_ranks_still_running_at_the_time_limit(tmp_path, fake_pdsh):
    """A rank hung at exit (outside the launcher's group, as remote ranks are), with a child
    that inherits its environment, and a rank that finished: only the running rank is named,
    once, and it is then reaped."""
    proc, _, marker = watch(
        tmp_path,
        "RANK=0 true\n"
        "RANK=2 setsid bash -c 'sleep 300 & wait' & echo $! > rank.pid\n"
        "sleep 1; echo started; sleep 300 & wait\n",
    )
    assert proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 124
    said = [line for line in out.splitlines() if "at the time limit" in line]
    running = "rank 2 on h1 (bash -c sleep 300 & wait)"
    assert said == [f"dscluster: still running at the time limit: {running}"], out
    assert not alive(int((tmp_path / "rank.pid").read_text()))
    surveyed, reaped = fake_pdsh.read_text().splitlines()
    assert " -w h1,h2,h3 " in surveyed and marker in surveyed and "dscluster-rank" in surveyed
    assert "kill -9" in reaped


def test_watch_names_the_nodes_that_did_not_answer_the_survey(tmp_path, fake_pdsh, monkeypatch):
    """A node that says nothing within pdsh -u at the time limit is named as not surveyed:
    "no rank was still running" would otherwise claim what nobody looked at."""
    monkeypatch.setenv("FAKE_PDSH_SILENT", "h3")
    proc, _, _ = watch(tmp_path, "echo started; sleep 300 & wait\n")
    assert proc.stdout.readline() == "started\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 124
    said = [line for line in out.splitlines() if "at the time limit" in line]
    assert said == ["dscluster: no rank was still running at the time limit; "
                    "no answer from h3 within 10 s"], out  # fmt: skip


def test_survey_command_quotes_the_marker_and_reads_every_rank_variable():
    command = launch_watch.survey_command("K=it's")
    assert "grep -qsxzF 'K=it'\\''s'" in command
    assert "^(RANK|OMPI_COMM_WORLD_RANK|PMI_RANK)=" in command
    lines = [
        "h2: dscluster-rank 3 77 /opt/dscluster/venv/bin/python -u train.py",
        "h2: dscluster-rank 3 78 python -u train.py",  # its dataloader worker
        # an mpirun rank's supervisor (mpi_rank.sh's launch_watch.py rank) is not the rank
        "h3: dscluster-rank 4 90 /opt/v/bin/python -S -u launch_watch.py rank -- "
        "/opt/v/bin/python -u train.py",
        "h3: dscluster-rank 4 91 /opt/v/bin/python -u train.py",
        "h1: dscluster-rank 0 12 ",
        "h1: not a survey line",
    ]
    assert launch_watch.still_running(lines) == (
        "still running at the time limit: rank 0 on h1, rank 3 on h2 (python -u train.py), "
        "rank 4 on h3 (python -u train.py)"
    )
    assert launch_watch.still_running(["h1: other"]) == launch_watch.NONE_RUNNING
    # with the hosts asked: those whose survey did not end with its last line are named
    answered = ["h1: dscluster-surveyed", "h2: dscluster-surveyed"]
    h1_h2 = [line for line in lines if not line.startswith("h3")]
    assert launch_watch.still_running([*h1_h2, *answered], ["h1", "h2"]) == (
        "still running at the time limit: rank 0 on h1, rank 3 on h2 (python -u train.py)"
    )
    assert launch_watch.still_running(answered[:1], ["h1", "h2", "h3"], within=3) == (
        "no rank was still running at the time limit; no answer from h2, h3 within 3 s"
    )
    assert command.endswith("; done; echo dscluster-surveyed; exit 0")
    assert launch_watch.short_args("/usr/bin/python3 " + "x" * 200) == "python3 " + "x" * 111 + "…"


@pytest.mark.parametrize(
    ("line", "found"),
    [
        (
            "pdsh@n1: n3: ssh exited with exit code 255",
            ("n3", "ssh exited with exit code 255", True),
        ),
        ("pdsh@n1: n2: ssh exited with exit code 1", ("n2", "ssh exited with exit code 1", False)),
        ("pdsh@n1: n2: ssh exited with exit code 0", None),
        (
            "n3: ssh: connect to host n3 port 22: No route to host",
            ("n3", "ssh: connect to host n3 port 22: No route to host", True),
        ),
        (
            "n2: [x] [ERROR] [launch.py:1:h] ['python'] exits with return code = -9",
            ("n2", "a rank exited with code -9", False),
        ),
        ("n2:   exitcode  : 1 (pid: 77)", ("n2", "a rank exited with code 1", False)),
        (
            "  Remote daemon: [[2000,0],2] on node n3",
            ("n3", "mpirun lost its daemon on the node", True),
        ),
        ("n1: step 3 loss 0.5", None),
    ],
)
def test_lost_line(line, found):
    assert launch_watch.lost_line(line) == found


def test_reap_command_quotes_the_marker():
    assert "grep -qsxzF 'K=it'\\''s'" in launch_watch.reap_command("K=it's")


# --- issue 15: the ecosystems' launch modes ----------------------------------------------------


def run_wrapper(tmp_path, text: str, python: str, env: dict) -> dict[str, str]:
    """Run a rank wrapper with /bin/sh, `env` standing in for python: the env it execs."""
    wrapper = tmp_path / "w.sh"
    wrapper.write_text(text.replace(f"{python} -u", "env"))
    proc = subprocess.run(
        ["sh", str(wrapper)], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def test_deepspeed_rank_wrapper_gives_lightning_the_node_rank(tmp_path):
    p = plan("deepspeed")
    text, mode = p.files["ds_rank.sh"]
    assert mode == "0755" and 'exec /opt/v/bin/python -u "$@"' in text
    # as DeepSpeed's launch.py sets them for rank 5 (node 2 of 3, 2 ranks there), in Slurm
    got = run_wrapper(
        tmp_path, text, "/opt/v/bin/python",
        {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "7", "CROSS_RANK": "2",
         "CROSS_SIZE": "3", "LOCAL_SIZE": "2", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
         "ACCELERATE_USE_CPU": "true"},
    )  # fmt: skip
    assert (got["NODE_RANK"], got["GROUP_RANK"], got["LOCAL_WORLD_SIZE"]) == ("2", "2", "2")
    # the CPU profile's switch would turn an HF Trainer's --deepspeed into plain DDP
    assert "ACCELERATE_USE_CPU" not in got
    assert (got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"]) == ("5", "1", "7")
    assert "SLURM_NTASKS" not in got and "SLURM_PROCID" not in got
    # launch.py runs `ds_rank.sh --local_rank=1 train.py --lr 0.1`: python gets the script first
    wrapper = tmp_path / "args.sh"
    wrapper.write_text(text.replace("/opt/v/bin/python -u", "printf '%s\\n'"))
    proc = subprocess.run(
        ["sh", str(wrapper), "--local_rank=1", "train.py", "--name", "a b"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout.splitlines() == ["train.py", "--local_rank=1", "--name", "a b"]
    proc = subprocess.run(
        ["sh", str(wrapper), "train.py", "--x"], capture_output=True, text=True, check=True
    )
    assert proc.stdout.splitlines() == ["train.py", "--x"]  # --no_local_rank: as given


@pytest.mark.parametrize(("rank", "node"), [("0", "0"), ("3", "0"), ("4", "1"), ("6", "2")])
def test_mpi_rank_wrapper_names_each_ranks_node(tmp_path, rank, node):
    # plan("mpi"): slots 4, 2, 1 in hostfile order
    proc = run_mpi_wrapper(
        tmp_path,
        {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": "7",
         "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
        "-c", ENV_RANK,
    )  # fmt: skip
    got = env_of(proc)
    assert (got["NODE_RANK"], got["GROUP_RANK"]) == (node, node)


EVEN = {"h1": 2, "h2": 2, "h3": 2}


def accel_plan(**kw):
    args = {"pool": EVEN, "hostfile_text": render_hostfile(EVEN.items())}
    args.update(kw)
    return plan("accelerate", **args)


def node_lines(p, name: str) -> dict[str, list[str]]:
    """host -> the words its case branch execs in the node script."""
    out = {}
    for line in p.files[name][0].splitlines():
        if ") " in line and "exec " in line:
            host, rest = line.strip().split(") ", 1)
            out[host] = shlex.split(rest.split("exec ", 1)[1].removesuffix(" ;;"))
    return out


def test_accelerate_one_agent_per_node_with_its_machine_rank():
    p = accel_plan(master_port=29511)
    assert p.argv[:6] == ["pdsh", "-S", "-f", "1024", "-w", "h1,h2,h3"]
    assert p.argv[7] == "/shared/dscluster/jobs/launch-1/accelerate_node.sh"
    nodes = node_lines(p, "accelerate_node.sh")
    for rank, host in enumerate(["h1", "h2", "h3"]):
        argv = nodes[host]
        assert argv[:4] == [
            "/opt/v/bin/accelerate",
            "launch",
            "--config_file",
            "accelerate_config.yaml",
        ]
        assert argv[4:] == [
            "--machine_rank", str(rank), "--main_process_ip", "h1",
            "--main_process_port", "29511", "--num_machines", "3", "--num_processes", "6",
            "--rdzv_backend", "static", "--same_network", "--max_restarts", "0",
            "train.py", "--lr", "0.1",
        ]  # fmt: skip
    config = yaml.safe_load(p.files["accelerate_config.yaml"][0])
    assert config["distributed_type"] == "MULTI_GPU" and config["mixed_precision"] == "no"
    assert (config["num_machines"], config["num_processes"]) == (3, 6)


def test_accelerate_on_cpu_starts_every_rank_not_one_per_node():
    p = accel_plan(accelerators=dict.fromkeys(EVEN, "cpu"))
    config = yaml.safe_load(p.files["accelerate_config.yaml"][0])
    assert config["distributed_type"] == "MULTI_CPU" and config["use_cpu"] is True
    # MULTI_CPU alone runs one process per node with no ranks: --multi_gpu runs them all
    assert all("--multi_gpu" in argv for argv in node_lines(p, "accelerate_node.sh").values())
    with pytest.raises(DsclusterError, match="FSDP only on GPU-like devices"):
        accel_plan(accelerators=dict.fromkeys(EVEN, "cpu"), accelerate_config_kind="fsdp")


def test_accelerate_config_kinds_in_accelerates_format():
    fsdp = yaml.safe_load(
        accel_plan(accelerate_config_kind="fsdp").files[accelerate.CONFIG_NAME][0]
    )
    assert fsdp["distributed_type"] == "FSDP"
    assert fsdp["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    ds = yaml.safe_load(
        accel_plan(accelerate_config_kind="deepspeed").files[accelerate.CONFIG_NAME][0]
    )
    assert ds["distributed_type"] == "DEEPSPEED"
    assert ds["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
    cpu = dict.fromkeys(EVEN, "cpu")
    # accelerate gives DeepSpeed no process group without a GPU: refused on CPU nodes, as FSDP
    for kind in ("deepspeed", "fsdp"):
        with pytest.raises(DsclusterError, match=f"--accelerate-config-kind {kind}: .*ddp"):
            accel_plan(accelerate_config_kind=kind, accelerators=cpu)
    # the user's own FSDP/DeepSpeed config likewise (seed 003's FSDP file), MULTI_GPU accepted
    for kind in ("FSDP", "DEEPSPEED"):
        with pytest.raises(DsclusterError, match=f"distributed_type {kind} does not run on CPU"):
            accel_plan(
                accelerate_config=f"distributed_type: {kind}\n",
                accelerate_config_name="accelerate_config.yaml",
                accelerators=cpu,
            )
    gpu_style = accel_plan(
        accelerate_config="distributed_type: MULTI_GPU\n",
        accelerate_config_name="accelerate_config.yaml",
        accelerators=cpu,
    )
    assert gpu_style.files["accelerate_config.yaml"][0] == "distributed_type: MULTI_GPU\n"
    # every key is one of accelerate's ClusterConfig fields (config_args.py)
    known = {
        "compute_environment", "debug", "distributed_type", "downcast_bf16", "gpu_ids",
        "machine_rank", "main_training_function", "mixed_precision", "num_machines",
        "num_processes", "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster",
        "tpu_use_sudo", "use_cpu", "fsdp_config", "deepspeed_config",
    }  # fmt: skip
    assert set(fsdp) <= known and set(ds) <= known


def test_accelerate_users_config_is_staged_and_checked():
    text = "distributed_type: MULTI_CPU\nnum_processes: 1\n"
    p = accel_plan(accelerate_config=text, accelerate_config_name="accelerate_config.yaml")
    assert p.files["accelerate_config.yaml"][0] == text
    assert all("--multi_gpu" in a for a in node_lines(p, "accelerate_node.sh").values())
    j = accel_plan(accelerate_config='{"distributed_type": "MULTI_GPU"}',
                   accelerate_config_name="accelerate_config.json")  # fmt: skip
    assert "accelerate_config.json" in j.files
    assert all("--multi_gpu" not in a for a in node_lines(j, "accelerate_node.sh").values())
    with pytest.raises(DsclusterError, match="has no distributed_type"):
        accel_plan(accelerate_config="a: 1\n", accelerate_config_name="accelerate_config.yaml")
    with pytest.raises(DsclusterError, match="not valid YAML"):
        accel_plan(accelerate_config="a: [\n", accelerate_config_name="accelerate_config.yaml")


def test_accelerate_pins_slots_and_refuses_uneven_nodes():
    p = accel_plan(include="h1:1@h2:0")
    text = p.files["accelerate_node.sh"][0]
    assert "h1) export CUDA_VISIBLE_DEVICES=1; exec" in text
    with pytest.raises(DsclusterError, match="same number of ranks on every node"):
        plan("accelerate")  # POOL: 4, 2, 1 slots


def test_launch_watch_wraps_the_new_modes_too():
    p = accel_plan()
    assert p.files["launch.sh"][0].rstrip().endswith(" -- " + p.command)
    g = plan("gaudi_spawn", gaudi_spawn="gaudi_spawn.py", accelerators=dict.fromkeys(POOL, "hpu"))
    assert (
        'echo "DSCLUSTER_LAUNCH_TIME=$DSCLUSTER_LAUNCH_TIME" >> .deepspeed_env'
        in (g.files["launch.sh"][0])
    )


def test_gaudi_spawn_argv_hostfile_and_hccl_env():
    g = plan(
        "gaudi_spawn", gaudi_spawn="/opt/oh/examples/gaudi_spawn.py", num_gpus=1,
        accelerators=dict.fromkeys(POOL, "hpu"), interface="ens5",
    )  # fmt: skip
    assert g.argv == [
        "/opt/v/bin/python", "/opt/oh/examples/gaudi_spawn.py", "--world_size", "3",
        "--hostfile", "gaudi_hostfile", "--use_deepspeed", "train.py", "--lr", "0.1",
    ]  # fmt: skip
    assert g.files["gaudi_hostfile"][0] == "h1 slots=1\nh2 slots=1\nh3 slots=1\n"
    assert g.files[".deepspeed_env"][0].endswith("HCCL_SOCKET_IFNAME=ens5\n")
    with pytest.raises(DsclusterError, match="needs --gaudi-spawn PATH"):
        plan("gaudi_spawn")
    with pytest.raises(DsclusterError, match="port 29500 and takes no other"):
        plan("gaudi_spawn", gaudi_spawn="g.py", master_port=29511)
    with pytest.raises(DsclusterError, match="cannot pin ranks to slots \\[2\\] on h1"):
        plan(
            "gaudi_spawn",
            gaudi_spawn="g.py",
            include="h1:2",
            accelerators=dict.fromkeys(POOL, "hpu"),
        )
    with pytest.raises(DsclusterError, match="use --launcher torchrun or mpi"):
        plan("gaudi_spawn", gaudi_spawn="g.py", program=["train.py", "a;b"])


def test_mode_options_become_plan_keywords_and_staged_files(tmp_path):
    config = tmp_path / "acc.json"
    config.write_text('{"distributed_type": "MULTI_GPU"}')
    kw, stage = modes.plan_options("accelerate", accelerate_config=config)
    assert kw == {
        "accelerate_config_kind": "ddp",
        "accelerate_config": config.read_text(),
        "accelerate_config_name": "accelerate_config.json",
    }
    assert stage == {}
    local = tmp_path / "gaudi_spawn_local.py"
    local.write_text("# optimum-habana's\n")
    kw, stage = modes.plan_options("gaudi_spawn", gaudi_spawn=str(local))
    assert (kw, stage) == ({"gaudi_spawn": "gaudi_spawn.py"}, {"gaudi_spawn.py": local})
    kw, stage = modes.plan_options("gaudi_spawn", gaudi_spawn="/opt/oh/examples/gaudi_spawn.py")
    assert (kw, stage) == ({"gaudi_spawn": "/opt/oh/examples/gaudi_spawn.py"}, {})
    assert modes.plan_options("torchrun") == ({}, {})
    # an absolute path not here is checked on the head before anything starts
    g = plan("gaudi_spawn", gaudi_spawn="/opt/oh/g.py", accelerators=dict.fromkeys(POOL, "hpu"))
    script = g.files["launch.sh"][0]
    assert "[ -f /opt/oh/g.py ] || { printf 'dscluster: --gaudi-spawn %s is not a file" in script
    assert script.index("[ -f /opt/oh/g.py ]") < script.index("exec ")


# --- job secrets (SECURITY.md): the node's 0600 file, sourced by every rank wrapper ------------


@pytest.mark.parametrize(
    ("launcher", "wrapper"),
    [("deepspeed", "ds_rank.sh"), ("torchrun", "torchrun_node.sh"), ("mpi", "mpi_rank.sh"),
     ("accelerate", "accelerate_node.sh")],
)  # fmt: skip
def test_every_rank_wrapper_sources_the_nodes_secrets_file(tmp_path, launcher, wrapper):
    """A rank gets dscluster_secret_env from the node's own file, read by its wrapper as the
    training user; the job's files and the head's command line never hold a secret (the
    client does not read dscluster_secret_env at all)."""
    from dscluster.storage import SECRETS_FILE, SOURCE_SECRETS  # noqa: PLC0415

    p = accel_plan() if launcher == "accelerate" else plan(launcher)
    names = {name for name in p.files if name.endswith(".sh")}
    assert wrapper in names, names
    text, _ = p.files[wrapper]
    assert SOURCE_SECRETS in text
    secrets = tmp_path / "secrets.env"
    secrets.write_text("export HF_TOKEN='tok en'\n")
    head = text.split(SOURCE_SECRETS, 1)[0].replace("set -eu", "set -u")
    script = tmp_path / "part.sh"
    script.write_text(head + SOURCE_SECRETS.replace(SECRETS_FILE, str(secrets)) + "\nenv\n")
    proc = subprocess.run(
        ["bash", str(script), "h1", "0"], env={"PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "HF_TOKEN=tok en" in proc.stdout.splitlines()
    # where the file is missing (no secrets set) the wrapper goes on without it
    script.write_text(head + SOURCE_SECRETS + "\necho went-on\n")
    proc = subprocess.run(
        ["bash", str(script), "h1", "0"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "went-on" in proc.stdout

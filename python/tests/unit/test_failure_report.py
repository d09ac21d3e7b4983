"""A failed launch: the script's own error (ranks exited non-zero, every node reachable) told
apart from a lost node, with the failed ranks and the first error lines, from launcher logs
as DeepSpeed (pdsh), torchrun (pdsh, with and without --tee) and mpirun (with and without
--tag-output) write them."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from dscluster.jobs import launch_watch
from dscluster.launch.watch import (
    ScriptFailure,
    last_error,
    lost_nodes,
    script_failure,
    split_prefix,
)
from dscluster.runner import PlaybookResult

from .clirun import run_cli
from .jobfake import stand_in

HOSTS = ["n1", "n2", "n3"]
ERR = "ValueError: Expected a string path to an existing deepspeed config, or a dictionary"


def ds_rank(host: str, pid: int) -> list[str]:
    """One node of the deepspeed launcher (pdsh) whose rank raised, as Python 3.12 prints it."""
    p = f"{host}: "
    return [
        f"{p}[2026-11-23 20:01:02,345] [INFO] [launch.py:256:main] process {pid} spawned with "
        "command: ['/opt/v/bin/python', '-u', 'train.py', '--local_rank=0', '--deepspeed', "
        "'ds_config.json']",
        f"{p}Traceback (most recent call last):",
        f'{p}  File "/shared/dscluster/jobs/launch-1/train.py", line 40, in <module>',
        f"{p}    main()",
        f'{p}  File "/shared/dscluster/jobs/launch-1/train.py", line 31, in main',
        f"{p}    model, *_ = deepspeed.initialize(args=args, model=model)",
        f"{p}                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        f'{p}  File "/opt/v/lib/python3.12/site-packages/deepspeed/__init__.py", line 181, in '
        "initialize",
        f"{p}    config_class = DeepSpeedConfig(config, mpu, mesh_device=mesh_device)",
        f"{p}{ERR}",
        f"{p}[2026-11-23 20:01:04,001] [INFO] [launch.py:319:sigkill_handler] Killing "
        f"subprocess {pid}",
        f"{p}[2026-11-23 20:01:04,002] [ERROR] [launch.py:325:sigkill_handler] "
        "['/opt/v/bin/python', '-u', 'train.py', '--local_rank=0'] exits with return code = 1",
    ]


DEEPSPEED_ALL_FAIL = [
    "[2026-11-23 20:01:00,000] [INFO] [runner.py:607:main] cmd = pdsh -S -f 1024 -w n1,n2,n3 ...",
    *ds_rank("n2", 201),
    *ds_rank("n3", 301),
    *ds_rank("n1", 101),
    "pdsh@n1: n2: ssh exited with exit code 1",
    "pdsh@n1: n3: ssh exited with exit code 1",
    "pdsh@n1: n1: ssh exited with exit code 1",
]


def test_deepspeed_script_error_on_every_rank_is_not_a_lost_node():
    failure = script_failure(DEEPSPEED_ALL_FAIL, HOSTS)
    assert failure is not None
    assert failure.ranks == [0, 1, 2]
    assert failure.hosts == ["n1", "n2", "n3"]
    # the node whose failure the log shows first
    assert failure.error_from == "of rank 1 (n2)"
    # the last five lines: frames (3.11's ^^^ markers left out), then the exception
    assert failure.error_lines == [
        '  File "/shared/dscluster/jobs/launch-1/train.py", line 31, in main',
        "    model, *_ = deepspeed.initialize(args=args, model=model)",
        '  File "/opt/v/lib/python3.12/site-packages/deepspeed/__init__.py", line 181, in '
        "initialize",
        "    config_class = DeepSpeedConfig(config, mpu, mesh_device=mesh_device)",
        ERR,
    ]


def test_the_first_failure_is_shown_not_the_peers_it_broke():
    victim = [
        "n1: Traceback (most recent call last):",
        'n1:   File "/shared/dscluster/jobs/launch-1/train.py", line 20, in <module>',
        "n1:     dist.all_reduce(t)",
        "n1: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
        "by peer [10.0.0.3]:41234",
        "n1: [x] [ERROR] [launch.py:325:sigkill_handler] ['python'] exits with return code = 1",
    ]
    failure = script_failure([*ds_rank("n3", 301), *victim], HOSTS)
    assert failure is not None
    assert (failure.ranks, failure.error_from) == ([0, 2], "of rank 2 (n3)")
    assert failure.error_lines[-1] == ERR
    assert failure.why == "n3: a rank exited with code 1"


def test_a_lost_node_stays_a_lost_node():
    unreachable = [*ds_rank("n1", 101), "pdsh@n1: n3: ssh exited with exit code 255"]
    assert script_failure(unreachable, HOSTS) is None
    assert lost_nodes(unreachable, HOSTS) == {"n3": "ssh exited with code 255"}
    killed = [
        "n2: [x] [ERROR] [launch.py:1:h] ['python'] exits with return code = -9",
        *ds_rank("n1", 101),
    ]
    assert script_failure(killed, HOSTS) is None
    assert lost_nodes(killed, HOSTS) == {"n2": "a rank exited with code -9"}
    frozen = ["n3: ssh: connect to host n3 port 22: Connection timed out", *ds_rank("n1", 1)]
    assert script_failure(frozen, HOSTS) is None
    assert script_failure(["pdsh@n1: n2: ssh exited with exit code 137"], HOSTS) is None
    assert script_failure(["h1: step 1"], HOSTS) is None  # nothing failed that the log says


def test_one_ranks_error_is_not_blamed_on_the_nodes_the_watch_then_ended():
    log = [
        *ds_rank("n3", 301),
        "dscluster: a rank failed on n3 (a rank exited with code 1); the job ends within 10 s "
        "unless it ends by itself",
        "dscluster: ending the launcher 10 s after a rank failed on n3",
        "n1: [x] [ERROR] [launch.py:1:h] ['python'] exits with return code = -15",
        "pdsh@n1: n2: ssh exited with exit code 143",
    ]
    failure = script_failure(log, HOSTS)
    assert failure is not None
    assert (failure.ranks, failure.hosts, failure.error_from) == ([2], ["n3"], "of rank 2 (n3)")
    # the watch's own verdict on a node it lost stands
    lost = ["dscluster: lost node n2 (ssh: Timeout, server n2 not responding.); the job ...", *log]
    assert script_failure(lost, HOSTS) is None


TORCHRUN_SUMMARY = [
    "n2: E1123 20:01:05.123000 77 torch/distributed/elastic/multiprocessing/api.py:882] "
    "failed (exitcode: 1) local_rank: 0 (pid: 78) of binary: /opt/v/bin/python",
    "n2: Traceback (most recent call last):",
    'n2:   File "/opt/v/bin/torchrun", line 8, in <module>',
    "n2:     sys.exit(main())",
    'n2:   File "/opt/v/lib/python3.12/site-packages/torch/distributed/run.py", line 936, in main',
    "n2:     run(args)",
    "n2: torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "n2: ============================================================",
    "n2: train.py FAILED",
    "n2: ------------------------------------------------------------",
    "n2: Failures:",
    "n2:   <NO_OTHER_FAILURES>",
    "n2: ------------------------------------------------------------",
    "n2: Root Cause (first observed failure):",
    "n2: [0]:",
    "n2:   time      : 2026-11-23_20:01:05",
    "n2:   host      : n2",
    "n2:   rank      : 1 (local_rank: 0)",
    "n2:   exitcode  : 1 (pid: 78)",
    "n2:   error_file: <N/A>",
    "n2:   traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
    "n2: ============================================================",
    "pdsh@n1: n2: ssh exited with exit code 1",
]


@pytest.mark.parametrize(
    ("prefix", "error_from"),
    [
        ("", "of rank 1 (n2)"),  # untagged: the node's own lines
        ("[rank1]:", "of rank 1 (n2)"),  # --log-line-prefix-template '[rank${rank}]:'
        ("[default0]:", "of rank 1 (n2)"),  # --tee 3: role and local rank
    ],
)
def test_torchrun_rank_error_skips_the_agents_own_traceback(prefix, error_from):
    rank = [
        f"n2: {prefix}Traceback (most recent call last):",
        f'n2: {prefix}  File "/shared/dscluster/jobs/launch-1/train.py", line 3, in <module>',
        f'n2: {prefix}    raise KeyError("lr")',
        f"n2: {prefix}KeyError: 'lr'",
    ]
    failure = script_failure(["n1: step 1", *rank, *TORCHRUN_SUMMARY], HOSTS)
    assert failure is not None
    assert (failure.ranks, failure.hosts) == ([1], ["n2"])
    assert failure.error_from == error_from
    assert failure.error_lines == [
        '  File "/shared/dscluster/jobs/launch-1/train.py", line 3, in <module>',
        '    raise KeyError("lr")',
        "KeyError: 'lr'",
    ]


MPI_VERDICT = [
    "--------------------------------------------------------------------------",
    "Primary job  terminated normally, but 1 process returned",
    "a non-zero exit code. Per user-direction, the job has been aborted.",
    "--------------------------------------------------------------------------",
    "--------------------------------------------------------------------------",
    "mpirun detected that one or more processes exited with non-zero status, thus causing",
    "the job to be terminated. The first process to do so was:",
    "",
    "  Process name: [[27718,1],2]",
    "  Exit code:    3",
    "--------------------------------------------------------------------------",
]


def rank_2_of_n3_failed(log: list[str]) -> ScriptFailure:
    """The script failure of an mpirun log in which rank 2 (on n3) exited 3."""
    failure = script_failure(log, HOSTS)
    assert failure is not None
    assert (failure.ranks, failure.hosts, failure.why) == (
        [2],
        ["n3"],
        "n3: rank 2 exited with code 3",
    )
    return failure


@pytest.mark.parametrize(
    ("tag", "error_from"),
    [
        ("[1,2]<stderr>:", "of rank 2 (n3)"),
        ("[1,2]<stderr>: ", "of rank 2 (n3)"),
        ("", "in the log"),
    ],
)
def test_mpirun_rank_error_with_and_without_tag_output(tag, error_from):
    log = [
        f"{tag}Traceback (most recent call last):",
        f'{tag}  File "/shared/dscluster/jobs/launch-1/train.py", line 9, in <module>',
        f"{tag}    sys.exit(check())",
        f'{tag}  File "/shared/dscluster/jobs/launch-1/train.py", line 5, in check',
        f'{tag}    raise RuntimeError("no data")',
        f"{tag}RuntimeError: no data",
        *MPI_VERDICT,
    ]
    failure = rank_2_of_n3_failed(log)
    assert failure.error_from == error_from
    assert failure.error_lines[0].endswith("line 9, in <module>")
    assert failure.error_lines[-1] == "RuntimeError: no data"
    assert len(failure.error_lines) == 5


# What mpirun printed (1 in 40 runs on a loaded 2-core machine) when rank 2 exited 3 and the
# others ended normally before mpirun acted on it: its abort notice and no "Process name".
MPI_NO_VERDICT = [
    'WHOAMI {"rank": "2", "world": "3", "host": "n3"}',
    "--------------------------------------------------------------------------",
    "Primary job  terminated normally, but 1 process returned",
    "a non-zero exit code. Per user-direction, the job has been aborted.",
    "--------------------------------------------------------------------------",
    'WHOAMI {"rank": "0", "world": "3", "host": "n1"}',
    'WHOAMI {"rank": "1", "world": "3", "host": "n2"}',
]


def test_mpirun_without_its_verdict_names_the_rank_its_wrapper_said():
    assert script_failure(MPI_NO_VERDICT, HOSTS) is None  # nothing to go on
    # mpi_rank.sh's launch_watch.py rank says the exit, wherever mpirun's IOF puts it
    said = "dscluster: rank 2 exited with code 3"
    for at in (1, len(MPI_NO_VERDICT)):
        log = [*MPI_NO_VERDICT[:at], said, *MPI_NO_VERDICT[at:]]
        rank_2_of_n3_failed(log)
        assert lost_nodes(log, HOSTS) == {"n3": "rank 2 exited with code 3"}


def test_mpirun_verdict_outranks_the_ranks_that_exited_after_its_abort():
    """A rank that catches the SIGTERM of mpirun's abort and exits 1 says so too: mpirun's
    verdict, when there is one, names the first rank (the cause) alone."""
    log = [
        "dscluster: rank 2 exited with code 3",
        "dscluster: rank 0 exited with code 1",  # ended by the abort
        *MPI_VERDICT,
    ]
    failure = script_failure(log, HOSTS)
    assert failure is not None
    assert (failure.ranks, failure.hosts) == ([2], ["n3"])
    # without it, every rank that said so, the first in the log first
    failure = script_failure(log[:2], HOSTS)
    assert failure is not None
    assert (failure.ranks, failure.hosts, failure.why) == (
        [0, 2],
        ["n1", "n3"],
        "n3: rank 2 exited with code 3",
    )
    # a rank number beyond the job's is no one's
    assert script_failure(["dscluster: rank 7 exited with code 1"], HOSTS) is None


def test_a_plain_exit_has_ranks_and_no_error_lines():
    failure = script_failure(MPI_VERDICT, HOSTS)
    assert failure is not None and failure.error_lines == [] and failure.error_from == ""


def test_prefixes_and_tracebacks():
    assert split_prefix("n2: [rank5]: x", HOSTS) == ("n2", 5, None, "x")
    assert split_prefix("n2: [default1]:x", HOSTS) == ("n2", None, 1, "x")
    assert split_prefix("[1,4]<stdout>:x", HOSTS) == (None, 4, None, "x")
    # a line that only looks like a node's prefix is not one
    assert split_prefix("ValueError: boom", HOSTS) == (None, None, None, "ValueError: boom")
    # a traceback cut off before its exception line says nothing
    assert last_error(["Traceback (most recent call last):", '  File "x.py", line 1']) == []
    deep = ["Traceback (most recent call last):"]
    deep += [f'  File "x.py", line {i}, in f' for i in range(9)] + ["RecursionError: deep"]
    assert last_error(deep) == [*deep[-5:]]


@pytest.mark.parametrize(
    ("why", "unreachable", "expected"),
    [
        ("a rank exited with code 1", False, True),
        ("ssh exited with exit code 1", False, True),
        ("a rank exited with code -9", False, False),
        ("ssh exited with exit code 137", False, False),
        ("ssh exited with exit code 255", True, False),
        ("a rank was killed by signal 9", False, False),
    ],
)
def test_watch_tells_a_rank_failure_from_a_lost_node(why, unreachable, expected):
    assert launch_watch.script_error(why, unreachable) is expected


def fake_job(log: list[str], rc: int):
    def fake_playbook(playbook, inv, *, extravars, **kw):
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        (fetched / "launcher.log").write_text("\n".join(log) + "\n")
        (fetched / "exit_status").write_text(f"{rc}\n")
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    return fake_playbook


def test_cli_reports_a_script_error_in_one_line_after_its_error_lines(
    tmp_path, inventory_dir, monkeypatch, capsys
):
    script = tmp_path / "train.py"
    script.write_text("raise ValueError\n")
    names = {"n1": "node-a", "n2": "node-b", "n3": "node-c"}
    log = [line for line in DEEPSPEED_ALL_FAIL if not line.startswith(("n1", "pdsh@n1: n1"))]
    for short, name in names.items():
        log = [line.replace(f"{short}:", f"{name}:") for line in log]
    stand_in(monkeypatch, fake_job(log, 1))
    rc, _, err = run_cli("launch", "-i", str(inventory_dir), "--no-doctor", "--", str(script))
    assert rc == 1
    # node-b's ranks 4 and 5 (node-a has 4 slots, node-b 2, node-c 2 CPU slots)
    lines = err.strip().splitlines()
    block = lines[lines.index("first error lines on node-b:") + 1 :]
    assert block[-1] == f"    {ERR}" and len(block) == 5
    assert all(b.startswith("      ") for b in block[:-1])
    last = capsys.readouterr().err.strip().splitlines()
    assert len(last) == 1
    assert last[0].startswith("dscluster: error: launch launch-")
    assert (
        ": job exited 1, job failed on ranks 4,5,6,7 (node-b, node-c), every node reachable; "
        f"first error on node-b: {ERR}; log "
    ) in last[0]
    assert "lost node" not in err + last[0]


def test_cli_without_error_lines_names_the_exit(tmp_path, inventory_dir, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    log = ["pdsh@node-a: node-c: ssh exited with exit code 3"]
    stand_in(monkeypatch, fake_job(log, 3))
    rc, _, err = run_cli("launch", "-i", str(inventory_dir), "--no-doctor", "--", str(script))
    assert rc == 3
    assert "first error" not in err
    assert (
        ": job exited 3, job failed on ranks 6,7 (node-c), every node reachable: "
        "node-c: remote command exited with code 3; log "
    ) in capsys.readouterr().err


def test_cli_keeps_the_lost_node_wording(tmp_path, inventory_dir, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    log = ["node-a: step 1", "pdsh@node-a: node-c: ssh exited with exit code 255"]
    stand_in(monkeypatch, fake_job(log, 1))
    rc, _, err = run_cli("launch", "-i", str(inventory_dir), "--no-doctor", "--", str(script))
    assert rc == 1
    assert "first error" not in err
    last = capsys.readouterr().err
    assert ": job exited 1, lost node(s) node-c (node-c: ssh exited with code 255); " in last
    assert "; fix (ssh_failed on node-c): ssh from the head to a node failed: " in last


@pytest.mark.parametrize(
    ("said", "note"),
    [
        # a rank hung at exit on one node (the others done): that node is the one named
        ("dscluster: still running at the time limit: rank 1 on node-b (python -u train.py)",
         "; still running at the time limit: rank 1 on node-b (python -u train.py))"),
        ("dscluster: no rank was still running at the time limit",
         "; no rank was still running at the time limit)"),
        # a node that did not answer the survey is named with the verdict
        ("dscluster: no rank was still running at the time limit; no answer from node-c within 3 s",
         "; no rank was still running at the time limit; no answer from node-c within 3 s)"),
        (None, ")"),  # a watcher killed before it could look: the exit alone
    ],
)  # fmt: skip
def test_cli_names_the_ranks_still_running_at_the_time_limit(
    tmp_path, inventory_dir, monkeypatch, capsys, said, note
):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    log = ["node-a: RESULT {}", "dscluster: the job's time limit was reached; ending the launcher"]
    log += [said] if said else []
    stand_in(monkeypatch, fake_job(log, 124))
    rc, _, _ = run_cli("launch", "-i", str(inventory_dir), "--no-doctor", "--", str(script))
    assert rc == 124
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f": job exited 124 (cut at --timeout{note}; log " in last, last


def test_watch_says_a_rank_failed_and_still_ends_the_hung_launcher(tmp_path):
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(
        "echo 'n3: [x] [ERROR] [launch.py:1:h] [python] exits with return code = 1'\n"
        "sleep 300 & wait\n"
    )
    proc = subprocess.run(
        [sys.executable, launch_watch.__file__, "--grace", "1", "--reap-timeout", "1",
         "--marker", "DSCLUSTER_TEST=1", "--hosts", "", "--", "bash", str(launcher)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "dscluster: a rank failed on n3 (a rank exited with code 1); the job ends" in proc.stdout
    assert "dscluster: ending the launcher 1 s after a rank failed on n3" in proc.stdout
    failure = script_failure(proc.stdout.splitlines(), HOSTS)
    assert failure is not None and failure.ranks == [2]


def test_the_first_failed_node_s_own_message_beats_the_others_tracebacks():
    """A real log: one rank exits with a one-line sys.exit message (no traceback); the others
    then fail in a collective, with tracebacks, and their exits are logged first. The watcher's
    line says which node failed first: its message is the error shown, not rank 0's gloo error."""
    log = pathlib.Path(__file__).parent / "fixtures" / "launch" / "deepspeed_planted_nvme_dir.log"
    hosts = ["local-n1", "local-n2", "local-n3"]
    failure = script_failure(log.read_text().splitlines(), hosts)
    assert failure is not None
    assert failure.why.startswith("local-n2: ")
    assert failure.error_from == "on local-n2"
    assert failure.error_lines == [
        "--nvme-dir /tmp/dscluster-nvme-2000 is not a directory of this user's (uid 65534); "
        "remove it or pass --nvme-dir with a directory of your own"
    ]
    assert sorted(failure.hosts) == hosts


def test_a_first_node_whose_last_line_ends_a_traceback_keeps_the_traceback():
    lines = [*ds_rank("n2", 201), *ds_rank("n1", 101)]
    lines.insert(0, "dscluster: a rank failed on n2 (a rank exited with code 1); the job ends")
    failure = script_failure(lines, HOSTS[:2])
    assert failure is not None and failure.error_from == "of rank 1 (n2)"
    assert failure.error_lines[-1] == ERR


@pytest.mark.parametrize(
    ("launcher", "error_from"),
    [("deepspeed", "on sig-n2"), ("torchrun", "on sig-n2"), ("mpi", "of rank 1 (sig-n2)")],
)
def test_a_rank_s_exit_message_is_its_error_under_every_launcher(launcher, error_from):
    """Real logs: sys.exit("...") on sig-n2, no traceback. torchrun's agent prints its own
    traceback and summary after the message; mpirun's ranks' lines name no node (the rank's
    wrapper says it exited, after the message)."""
    log = pathlib.Path(__file__).parent / "fixtures" / "launch" / f"{launcher}_exit_message.log"
    failure = script_failure(log.read_text().splitlines(), ["sig-n1", "sig-n2", "sig-n3"])
    assert failure is not None
    assert (failure.ranks, failure.hosts) == ([1], ["sig-n2"])
    assert failure.error_from == error_from
    assert failure.error_lines == ["no data on sig-n2"]


def test_an_mpi_rank_s_traceback_is_not_taken_for_its_exit_message():
    raised = [
        "Traceback (most recent call last):",
        '  File "/shared/dscluster/jobs/launch-1/train.py", line 1, in <module>',
        "    import sentencepiece",
        "ModuleNotFoundError: No module named 'sentencepiece'",
        "dscluster: rank 2 exited with code 1",
    ]
    failure = script_failure([*raised, *MPI_VERDICT], HOSTS)
    assert failure is not None and failure.error_from == "in the log"
    assert failure.error_lines[-1] == "ModuleNotFoundError: No module named 'sentencepiece'"

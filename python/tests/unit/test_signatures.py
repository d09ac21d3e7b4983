"""Known failure signatures matched in real logs (fixtures/signatures, SOURCES.md), named with
the node and rank whose line it was, and carried to launch's error line and smoke's report."""

from __future__ import annotations

import io
import json
import pathlib

import pytest
from rich.console import Console

from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.launch.signatures import SIGNATURES, match_signatures
from dscluster.smoke import run_smoke

from .clirun import run_cli
from .jobfake import stand_in
from .test_failure_report import fake_job

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "signatures"


def lines_of(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


@pytest.mark.parametrize(
    ("log", "name"),
    [
        ("nccl_no_socket_interface.log", "nccl_no_socket_interface"),
        ("address_in_use_torchrun.log", "address_in_use"),
        ("address_in_use_dist_network_error.log", "address_in_use"),
        ("cuda_oom_torch_cuda.log", "cuda_out_of_memory"),
        ("cuda_oom_runtime_error.log", "cuda_out_of_memory"),
        ("deepspeed_batch_world_size_1_rank.log", "deepspeed_batch_world_size_1"),
        ("deepspeed_batch_world_size_1_accelerate.log", "deepspeed_batch_world_size_1"),
        ("deepspeed_batch_size.log", "deepspeed_batch_size"),
        ("nccl_collective_timeout.log", "nccl_collective_timeout"),
        ("deepspeed_sigkill.log", "rank_sigkill"),
        ("pdsh_ssh_denied.log", "ssh_failed"),
        ("dataloader_shm.log", "dataloader_shm"),
        ("store_unreachable.log", "store_unreachable"),
    ],
)
def test_each_real_log_has_its_signature_once(log, name):
    found = match_signatures(lines_of(log))
    assert [m.name for m in found] == [name]
    assert found[0].help == dict((n, h) for n, _, h in SIGNATURES)[name]


def test_every_signature_has_a_real_log():
    listed = (FIXTURES / "SOURCES.md").read_text()
    for name, _, _ in SIGNATURES:
        assert f"| {name} |" in listed, name


@pytest.mark.parametrize(
    ("log", "name", "where"),
    [
        ("launch_deepspeed_module_not_found.log", "module_not_found", "sig-n3"),
        ("launch_torchrun_sigkill.log", "rank_sigkill", "sig-n2"),
    ],
)
def test_recorded_launch_logs_name_the_node(log, name, where):
    found = match_signatures(lines_of(log), ["sig-n1", "sig-n2", "sig-n3"])
    assert [(m.name, m.where) for m in found] == [(name, where)]


def test_the_table_is_data_with_one_sentence_each():
    names = [name for name, _, _ in SIGNATURES]
    assert len(names) == len(set(names))
    for _, pattern, help_text in SIGNATURES:
        assert pattern.pattern and help_text and "\n" not in help_text
        assert not help_text.endswith(".")  # one clause of the error line


def test_the_node_and_rank_come_from_the_line_s_prefixes():
    log = [
        "n2: [rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE) ran for "
        "600020 milliseconds before timing out.",
        *(f"n3: {line}" for line in lines_of("deepspeed_sigkill.log")),
        *lines_of("address_in_use_dist_network_error.log"),
        "pdsh@n1: n2: ssh exited with exit code 255",
    ]
    found = match_signatures(log, ["n1", "n2", "n3"])
    assert [(m.name, m.host, m.rank, m.where) for m in found] == [
        ("nccl_collective_timeout", "n2", 1, "rank 1 (n2)"),
        ("rank_sigkill", "n3", None, "n3"),
        ("address_in_use", None, None, "the log"),
        ("ssh_failed", "n2", None, "n2"),  # pdsh's line names the node
    ]
    assert found[0].line.startswith("[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616]")


def test_world_size_1_takes_its_own_help_and_not_the_general_one():
    log = lines_of("deepspeed_batch_world_size_1_accelerate.log") * 2
    log += lines_of("deepspeed_batch_size.log")
    found = match_signatures(log)
    assert [m.name for m in found] == ["deepspeed_batch_world_size_1", "deepspeed_batch_size"]
    assert "Accelerate or HF Trainer trains alone at world size 1 (CPU nodes)" in found[0].help
    heading = "### Accelerate or HF Trainer trains alone at world size 1 (CPU nodes)"
    docs = pathlib.Path(__file__).parents[3] / "docs" / "troubleshooting.md"
    assert heading in docs.read_text().splitlines()


def test_the_watch_s_own_ending_of_the_job_is_left_out():
    log = [
        "n2: ModuleNotFoundError: No module named 'sentencepiece'",
        "dscluster: ending the launcher 10 s after a rank failed on n2",
        *(f"n3: {line}" for line in lines_of("deepspeed_sigkill.log")),
    ]
    assert [m.name for m in match_signatures(log, ["n1", "n2", "n3"])] == ["module_not_found"]
    cut = ["dscluster: the job's time limit was reached; ending the launcher", *log]
    assert match_signatures(cut, ["n1", "n2", "n3"]) == []


def test_a_missing_module_names_its_top_level_package():
    [m] = match_signatures(["n1: ModuleNotFoundError: No module named 'google.protobuf'"], ["n1"])
    assert m.help == (
        "add google (its name on PyPI) to ml_stack_extra_requirements and run 'dscluster provision'"
    )
    defaults = pathlib.Path(__file__).parents[3] / "roles" / "ml_stack" / "defaults" / "main.yml"
    assert "\nml_stack_extra_requirements:" in defaults.read_text()


def launch_with_log(tmp_path, inventory_dir, monkeypatch, log: list[str], rc: int):
    """`dscluster launch` of a script whose job leaves `log` and exits `rc`: (rc, stderr)."""
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    stand_in(monkeypatch, fake_job(log, rc))
    rc, _, err = run_cli("launch", "-i", str(inventory_dir), "--no-doctor", "--", str(script))
    return rc, err


def test_launch_prints_each_fix_and_the_first_in_its_error_line(
    tmp_path, inventory_dir, monkeypatch, capsys
):
    log = [
        "node-b: Traceback (most recent call last):",
        'node-b:   File "/shared/dscluster/jobs/launch-1/train.py", line 1, in <module>',
        "node-b:     import sentencepiece",
        "node-b: ModuleNotFoundError: No module named 'sentencepiece'",
        "node-b: [x] [ERROR] [launch.py:1:h] ['python'] exits with return code = 1",
        "pdsh@node-a: node-b: ssh exited with exit code 1",
    ]
    rc, err = launch_with_log(tmp_path, inventory_dir, monkeypatch, log, 1)
    assert rc == 1
    lines = err.strip().splitlines()
    at = lines.index("known error on node-b: ModuleNotFoundError: No module named 'sentencepiece'")
    fix = "add sentencepiece (its name on PyPI) to ml_stack_extra_requirements and run "
    assert lines[at + 1] == f"    fix: {fix}'dscluster provision'"
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"; fix (module_not_found on node-b): {fix}'dscluster provision'; log " in last


def test_a_job_that_exits_0_is_not_matched(tmp_path, inventory_dir, monkeypatch, capsys):
    log = ["node-a: [W socket.cpp:464] [c10d] ... (errno: 98 - Address already in use)."]
    rc, err = launch_with_log(tmp_path, inventory_dir, monkeypatch, log, 0)
    assert rc == 0 and "known error" not in err and "fix" not in capsys.readouterr().err


def smoke_with_log(inventory_dir, monkeypatch, log: list[str], rc: int) -> tuple[str, dict]:
    """run_smoke of a job that leaves `log` and exits `rc`: its error line and JSON report."""
    stand_in(monkeypatch, fake_job(log, rc))
    inv = load(str(inventory_dir))
    with pytest.raises(DsclusterError) as caught:
        run_smoke(inv, steps=1, console=Console(file=io.StringIO()))
    report = json.loads((inv.directory / "reports" / "smoke-latest.json").read_text())
    return str(caught.value), report


def test_smoke_report_holds_the_signatures_and_the_failure_line_the_first_fix(
    inventory_dir, monkeypatch
):
    log = [
        "node-c: [rank6]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 6] Watchdog "
        "caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE) ran for "
        "600020 milliseconds before timing out.",
        "pdsh@node-a: node-c: ssh exited with exit code 134",
    ]
    line, report = smoke_with_log(inventory_dir, monkeypatch, log, 134)
    assert "; fix (nccl_collective_timeout on rank 6 (node-c)): a collective waited" in line
    assert report["signatures"] == [
        {
            "name": "nccl_collective_timeout",
            "help": dict((n, h) for n, _, h in SIGNATURES)["nccl_collective_timeout"],
            "host": "node-c",
            "rank": 6,
            "where": "rank 6 (node-c)",
            "line": log[0].split("[rank6]:", 1)[1],
        }
    ]


def test_smoke_failure_line_quotes_a_rank_s_exit_message(inventory_dir, monkeypatch):
    log = [
        "node-b: --nvme-dir /tmp/x is not a directory of this user's (uid 65534)",
        "node-b: [2026-12-03 16:51:19,953] [ERROR] [launch.py:259:sigkill_handler] ['python', "
        "'-u', 'smoke_job.py'] exits with return code = 1",
        "pdsh@node-a: node-b: ssh exited with exit code 1",
    ]
    line, report = smoke_with_log(inventory_dir, monkeypatch, log, 1)
    assert line.startswith(
        "smoke job failed on ranks 4,5 (node-b); first error on node-b: --nvme-dir /tmp/x is "
        "not a directory of this user's (uid 65534); report: "
    )
    assert report["failure"]["error_lines"] == [log[0].removeprefix("node-b: ")]
    assert "signatures" not in report

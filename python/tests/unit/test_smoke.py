from __future__ import annotations

import argparse
import ast
import io
import json
import os
import pathlib
import stat
import subprocess
import sys
import tarfile

import pytest
from PIL import Image
from rich.console import Console

from dscluster import cli
from dscluster.cli.flags import zero_stages
from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.jobs import SMOKE_JOB_FILES, smoke_checks, smoke_job
from dscluster.launch import workdir
from dscluster.smoke import (
    config_table,
    find_stragglers,
    host_step_times,
    link_bandwidths,
    link_table,
    lost_nodes,
    rank_table,
    report_stragglers,
)
from dscluster.smoke.figure import build_figure, render_png, write_png
from dscluster.smoke.run import _failure_line, run_smoke

from .jobfake import stand_in


def test_lost_nodes_from_launcher_log():
    log = [
        "pdsh@n1: n3: ssh exited with exit code 255",
        "n3: ssh: connect to host n3 port 22: No route to host",
        "n2: [2026-11-22 00:45:30,163] [ERROR] [launch.py:335:sigkill_handler] ['python', "
        "'-u', 'smoke_job.py'] exits with return code = -9",
        "n1: [INFO] all good",
    ]
    # n3 was unreachable: n2's rank failing afterwards is a consequence, not a cause.
    assert lost_nodes(log) == {"n3": "ssh: connect to host n3 port 22: No route to host"}
    assert lost_nodes(log[2:]) == {"n2": "a rank exited with code -9"}
    assert lost_nodes(["pdsh@n1: n4: ssh exited with exit code 1"]) == {
        "n4": "remote command exited with code 1"
    }
    assert lost_nodes(["n1: training step 3"]) == {}


# --- --zero / --offload ---------------------------------------------------------------------


def test_zero_stages_parses_a_comma_list():
    assert zero_stages("2") == (2,)
    assert zero_stages("1,2,3") == (1, 2, 3)
    assert zero_stages("3, 1,3") == (3, 1)
    for bad in ("7", "0", "a", "", "1,,2", "1;2"):
        with pytest.raises(argparse.ArgumentTypeError, match="invalid choice"):
            zero_stages(bad)


def test_smoke_parser_defaults_are_todays_demo():
    args = cli.build_parser().parse_args(["smoke", "-i", "inventories/x"])
    assert args.zero == (2,)
    assert args.offload is None
    assert args.straggler_factor == 2.0
    assert args.fail_on_straggler is False
    assert args.launcher == "deepspeed"
    args = cli.build_parser().parse_args(
        ["smoke", "-i", "x", "--zero", "1,2,3", "--offload", "nvme", "--straggler-factor", "3",
         "--fail-on-straggler"]
    )  # fmt: skip
    assert (args.zero, args.offload, args.straggler_factor) == ((1, 2, 3), "nvme", 3.0)
    assert args.fail_on_straggler is True
    # one vocabulary: --offload none is accepted as in dsconfig, --port is --master-port
    args = cli.build_parser().parse_args(["smoke", "-i", "x", "--offload", "none", "--port", "1"])
    assert (args.offload, args.master_port) == ("none", 1)
    assert cli.build_parser().parse_args(["smoke", "-i", "x"]).master_port is None


def test_job_accepts_what_run_smoke_passes():
    args = smoke_job.parse_args(
        ["--zero", "1,2,3", "--offload", "nvme", "--nvme-dir", "/tmp/x", "--report", "r.json"]
    )
    assert args.zero == [1, 2, 3] and args.offload == "nvme" and args.nvme_dir == "/tmp/x"
    assert smoke_job.parse_args(["--zero", "2", "--report", "r"]).zero == [2]  # sbatch's use
    assert smoke_job.parse_args(["--report", "r"]).straggler_factor == 2.0
    assert smoke_job.parse_args(["--report", "r", "--straggler-factor", "3"]).straggler_factor == 3
    with pytest.raises(SystemExit):
        smoke_job.parse_args(["--zero", "4", "--report", "r"])


class Staged(Exception):
    """Raised by the playbook stand-in once it has unpacked the job: nothing runs further."""


def test_the_staged_job_runs_from_its_directory_without_dscluster(
    tmp_path, inventory_dir, monkeypatch
):
    """The smoke job as launch.yml unpacks it on the nodes (run_smoke's job tarball): the entry
    script and every module it imports, side by side, nothing of dscluster among their imports.
    Run from there (and from this package's jobs/, as the e2e tests do) by a Python with its
    standard library only (-S: no site-packages, so no dscluster and no torch, which the job
    imports after its arguments), `--help` answers."""
    unpacked = tmp_path / "unpacked"

    def fake_playbook(playbook, inv, *, extravars, **kw):
        tar_path = pathlib.Path(extravars["launch_stage_dir"]) / extravars["launch_job_tar"]
        with tarfile.open(tar_path) as tar:
            tar.extractall(unpacked, filter="tar")
        raise Staged

    stand_in(monkeypatch, fake_playbook)
    with pytest.raises(Staged):
        run_smoke(load(inventory_dir), console=Console(file=io.StringIO()))
    (job,) = unpacked.iterdir()
    here = pathlib.Path(smoke_job.__file__).parent
    staged = {p.name for p in job.glob("*.py")}
    assert set(SMOKE_JOB_FILES) <= staged and SMOKE_JOB_FILES[0] == "smoke_job.py"
    assert staged - set(SMOKE_JOB_FILES) <= workdir.JOB_FILE_NAMES  # the launcher's own
    siblings = {name.removesuffix(".py") for name in SMOKE_JOB_FILES}
    allowed = set(sys.stdlib_module_names) | {"torch", "deepspeed"} | siblings
    for name in SMOKE_JOB_FILES:
        assert (job / name).read_bytes() == (here / name).read_bytes()
        for node in ast.walk(ast.parse((job / name).read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                relative = node.level or not node.module
                roots = {a.name for a in node.names} if relative else {node.module.split(".")[0]}
            else:
                continue
            assert roots <= allowed, f"{name}: {ast.unparse(node)}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    bare = [sys.executable, "-E", "-s", "-S"]
    nothing = subprocess.run(
        [*bare, "-c", "import dscluster"], cwd=tmp_path, env=env, capture_output=True, check=False
    )
    assert nothing.returncode != 0 and b"No module named 'dscluster'" in nothing.stderr
    for where in (job, here):
        proc = subprocess.run(
            [*bare, str(where / "smoke_job.py"), "--help"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("usage: smoke_job.py "), proc.stdout
        assert "--straggler-factor" in proc.stdout and proc.stderr == ""


def names(configs):
    return [(c["name"], c.get("skip", "")) for c in configs]


def test_plan_configs_without_offload_runs_each_stage_once():
    assert names(smoke_checks.plan_configs([2], "none")) == [("zero2", "")]
    assert names(smoke_checks.plan_configs([1, 2, 3], "none")) == [
        ("zero1", ""),
        ("zero2", ""),
        ("zero3", ""),
    ]


def test_plan_configs_cpu_offload_on_every_zero_stage():
    plan = smoke_checks.plan_configs([1, 2, 3], "cpu")
    assert [c["name"] for c in plan] == ["zero1", "zero1+cpu", "zero2", "zero2+cpu", "zero3",
                                         "zero3+cpu"]  # fmt: skip
    assert not any(c.get("skip") for c in plan)
    assert "skip" in smoke_checks.plan_configs([0], "cpu")[1]


def test_plan_configs_nvme_only_zero3_and_only_where_async_io_is_usable():
    good = {"n1": {"usable": True, "reason": "pre-built"}, "n2": {"usable": True}}
    plan = smoke_checks.plan_configs([1, 2, 3], "nvme", good)
    skipped = {c["name"]: c.get("skip", "") for c in plan}
    assert list(skipped) == ["zero1", "zero1+nvme", "zero2", "zero2+nvme", "zero3", "zero3+nvme"]
    assert "needs ZeRO-3" in skipped["zero1+nvme"] and "needs ZeRO-3" in skipped["zero2+nvme"]
    assert skipped["zero3+nvme"] == "" and skipped["zero3"] == ""

    bad = {**good, "n2": {"usable": False, "reason": "async_io is not pre-built"}}
    zero3 = smoke_checks.plan_configs([3], "nvme", bad)
    assert zero3[1]["skip"] == "async_io op not usable on n2: async_io is not pre-built"
    assert "unknown" in smoke_checks.plan_configs([3], "nvme", None)[1]["skip"]
    why = "pre-built async_io fails to load: undefined symbol: io_submit"
    same = {h: {"usable": False, "reason": why} for h in ("n1", "n2", "n3")}
    assert smoke_checks.plan_configs([3], "nvme", same)[1]["skip"] == (
        f"async_io op not usable on n1, n2, n3: {why}"
    )


def test_ds_config_offload_blocks():
    plain = smoke_checks.ds_config(2, "none", "/tmp/n", bf16=False)
    assert plain["zero_optimization"] == {"stage": 2}
    cpu3 = smoke_checks.ds_config(3, "cpu", "/tmp/n", bf16=False)["zero_optimization"]
    assert cpu3["offload_optimizer"]["device"] == cpu3["offload_param"]["device"] == "cpu"
    assert cpu3["stage3_param_persistence_threshold"] == 0
    cpu1 = smoke_checks.ds_config(1, "cpu", "/tmp/n", bf16=False)["zero_optimization"]
    assert "offload_param" not in cpu1  # ZeRO-3 only
    nvme = smoke_checks.ds_config(3, "nvme", "/tmp/n", bf16=True)
    zero = nvme["zero_optimization"]
    assert zero["offload_optimizer"]["nvme_path"] == zero["offload_param"]["nvme_path"] == "/tmp/n"
    assert nvme["bf16"] == {"enabled": True}


def test_node_leaders_first_rank_per_host():
    assert smoke_checks.node_leaders(["a", "a", "b", "c", "c"]) == (["a", "b", "c"], [0, 2, 3])
    assert smoke_checks.node_leaders(["a"]) == (["a"], [0])


def test_faster_pass_keeps_each_directions_best_and_what_either_measured():
    first = [[None, 2.1, 0.4], [2.0, None, None], [1.9, 1.0, None]]
    second = [[None, 1.2, 2.2], [2.3, None, 0.9], [None, 0.8, None]]
    assert smoke_checks.faster_pass(first, second) == [
        [None, 2.1, 2.2], [2.3, None, 0.9], [1.9, 1.0, None]
    ]  # fmt: skip
    # A link slowed for one pass is healthy; slow in both, it stays slow (a straggler).
    hosts = ["a", "b", "c", "d"]
    busy = [[None, 2.0, 2.0, 2.0], [2.0, None, 0.5, 2.0], [2.0, 0.5, None, 2.0],
            [2.0, 2.0, 2.0, None]]  # fmt: skip
    calm = [[None, 2.0, 2.0, 2.0], [2.0, None, 2.1, 2.0], [2.0, 2.1, None, 2.0],
            [2.0, 2.0, 2.0, None]]  # fmt: skip
    assert [s.nodes for s in find_stragglers(hosts, busy, {})] == [("b", "c")]
    assert find_stragglers(hosts, smoke_checks.faster_pass(busy, calm), {}) == []
    assert [s.nodes for s in find_stragglers(hosts, smoke_checks.faster_pass(busy, busy), {})] == [
        ("b", "c")
    ]


def test_recheck_plan_measures_everything_again_once_the_rules_would_name_a_straggler():
    mib8 = 8 << 20

    def plan(gbps, factor=2):
        return smoke_checks.recheck_plan(gbps, factor=factor, nbytes=mib8, iters=5)

    hosts = ["a", "b", "c"]
    healthy = [[None, 2.0, 2.1], [1.9, None, 2.2], [2.0, 1.8, None]]
    assert smoke_checks.suspects(healthy, 2) == [] and plan(healthy) == []
    # One direction caught by a busy moment in both passes, its link below the median link / 2
    # (0.84 < 1.8 / 2): every direction measured again before the link is named, each for
    # ~1 s at the speed it showed (0.84 GB/s x 1 s / 8 MiB = 101 messages).
    busy = [[None, 0.84, 2.1], [1.9, None, 2.2], [2.0, 1.8, None]]
    assert smoke_checks.suspects(busy, 2) == [(0, 1)]
    assert [s.nodes for s in find_stragglers(hosts, busy, {})] == [("a", "b")]
    assert plan(busy) == [(0, 1, 101), (0, 2, 251), (1, 0, 227), (1, 2, 263), (2, 0, 239),
                          (2, 1, 215)]  # fmt: skip
    # Exactly at the fastest / factor is not suspect (as find_stragglers' boundary).
    edge = [[None, 1.1, 2.1], [1.9, None, 2.2], [2.0, 1.8, None]]
    assert smoke_checks.suspects(edge, 2) == [] and plan(edge) == []
    # A node behind a 200 Mbit/s limit: its own directions are the suspects, at `iters`
    # messages (every one is slow: 8 MiB at 0.025 GB/s is 0.34 s); a bigger factor lets it be.
    tc = [[None, 2.0, 2.1], [1.9, None, 2.2], [0.025, 0.024, None]]
    assert smoke_checks.suspects(tc, 2) == [(2, 0), (2, 1)]
    assert [(i, j, n) for i, j, n in plan(tc) if i == 2] == [(2, 0, 5), (2, 1, 5)]
    assert plan(tc, factor=100) == []
    # Whatever the straggler rules can name has a suspect: a node slow both ways (the median
    # direction slow too) has every one of its directions below the fastest / factor.
    both = [[None, 2.0, 0.4], [2.0, None, 0.4], [0.4, 0.4, None]]
    assert [s.nodes for s in find_stragglers(hosts, both, {})] == [("c",)]
    assert set(smoke_checks.suspects(both, 2)) == {(0, 2), (1, 2), (2, 0), (2, 1)}
    # A suspect the straggler rules do not name is not measured again: it would only raise
    # figures, and the report names nothing (a busy host's 3-node run: n3 -> n2 below the
    # fastest / 2, every link above the median link / 2 and every node above its median / 2).
    real = [[None, 3.49, 2.2], [2.3, None, 3.37], [2.65, 1.66, None]]
    assert smoke_checks.suspects(real, 2) == [(2, 1)] and plan(real) == []
    assert find_stragglers(hosts, real, {}) == []
    # Two nodes: one link, shared by both, so bandwidth names neither and nothing is rechecked.
    two = [[None, 3.0], [1.0, None]]
    assert smoke_checks.suspects(two, 2) == [(1, 0)] and plan(two) == []
    # Many directions share the budget (10 s): 72 of them get 10/72 s each, never below iters
    # (one link, 2 <-> 3, slow enough to be named).
    n = 9
    speed = {(0, 1): 4.0, (2, 3): 0.3}
    wide = [[None if i == j else speed.get((i, j), 1.0) for j in range(n)]
            for i in range(n)]  # fmt: skip
    assert [s.nodes for s in find_stragglers(list(range(n)), wide, {})] == [(2, 3)]
    counts = {(i, j): c for i, j, c in plan(wide)}
    assert len(counts) == n * (n - 1)
    # 10/72 s x 4, 1 and 0.3 GB/s over 8 MiB: 67, 17 and 5 (= iters) messages
    assert counts[(0, 1)] == 67 and counts[(2, 3)] == 5 and set(counts.values()) == {67, 17, 5}
    tiny = [[None if i == j else (0.05 if (i, j) == (0, 1) else 0.2) for j in range(n)]
            for i in range(n)]  # fmt: skip
    assert {c for _, _, c in plan(tiny)} == {5}
    # At most RECHECK_MAX_ITERS messages however fast the direction looked.
    fast = [[None, 50.0, 50.0], [50.0, None, 1.0], [50.0, 50.0, None]]
    assert plan(fast)[0] == (0, 1, smoke_checks.RECHECK_MAX_ITERS) and (1, 2, 120) in plan(fast)
    assert plan([[None]]) == [] and smoke_checks.suspects([[None]], 2) == []


# --- stragglers -----------------------------------------------------------------------------


def matrix(hosts, bw):
    """Symmetric matrix from {frozenset pair: GB/s}."""
    return [[None if a == b else bw[frozenset((a, b))] for b in hosts] for a in hosts]


HOSTS3 = ["n1", "n2", "n3"]


def test_link_bandwidth_is_the_slower_direction():
    gbps = [[None, 1.0, 0.9], [0.2, None, None], [1.1, 1.0, None]]
    assert link_bandwidths(HOSTS3, gbps) == {("n1", "n2"): 0.2, ("n1", "n3"): 0.9}


def test_three_nodes_one_slow_node_is_flagged_by_name():
    gbps = matrix(HOSTS3, {frozenset(("n1", "n2")): 1.0, frozenset(("n1", "n3")): 0.1,
                           frozenset(("n2", "n3")): 0.12})  # fmt: skip
    found = find_stragglers(HOSTS3, gbps, {}, 2.0)
    assert [(s.kind, s.nodes, s.metric) for s in found] == [("node", ("n3",), "bandwidth")]
    assert found[0].value == pytest.approx(0.11)
    assert found[0].median == pytest.approx(0.55)
    assert found[0].message.startswith("straggler: node n3: median link bandwidth 0.110 GB/s")


def test_equal_links_and_equal_steps_flag_nothing():
    gbps = matrix(HOSTS3, {frozenset(p): 1.0 for p in (("n1", "n2"), ("n1", "n3"), ("n2", "n3"))})
    assert find_stragglers(HOSTS3, gbps, {"n1": 0.01, "n2": 0.01, "n3": 0.01}) == []


def test_one_slow_link_among_four_nodes_is_the_link_not_a_node():
    hosts = ["a", "b", "c", "d"]
    bw = {frozenset((x, y)): 1.0 for i, x in enumerate(hosts) for y in hosts[i + 1 :]}
    bw[frozenset(("a", "b"))] = 0.3
    found = find_stragglers(hosts, matrix(hosts, bw), {}, 2.0)
    assert [(s.kind, s.nodes) for s in found] == [("link", ("a", "b"))]
    assert "link a <-> b: 0.300 GB/s, below the median link 1.000 GB/s / 2" in found[0].message


def test_two_nodes_bandwidth_cannot_single_one_out_step_time_can():
    gbps = [[None, 0.01], [5.0, None]]  # even very lopsided: one link, shared by both
    assert find_stragglers(["a", "b"], gbps, {"a": 0.01, "b": 0.011}, 2.0) == []
    # with two nodes the median is their mean: b is above it x1.5 when b > 3a
    found = find_stragglers(["a", "b"], gbps, {"a": 0.01, "b": 0.05}, 1.5)
    assert [(s.nodes, s.metric) for s in found] == [(("b",), "step time")]
    assert "above the median 30.0 ms x 1.5" in found[0].message


def test_factor_boundary_is_not_a_straggler():
    # node medians: n1 0.6, n2 0.6, n3 0.3 (median 0.6): 0.3 is exactly 0.6 / 2
    gbps = matrix(HOSTS3, {frozenset(("n1", "n2")): 0.9, frozenset(("n1", "n3")): 0.3,
                           frozenset(("n2", "n3")): 0.3})  # fmt: skip
    assert find_stragglers(HOSTS3, gbps, {}, 2.0) == []
    assert [s.nodes for s in find_stragglers(HOSTS3, gbps, {}, 1.99)] == [("n3",)]
    steps = {"n1": 0.010, "n2": 0.010, "n3": 0.020}  # exactly median x 2
    assert find_stragglers(HOSTS3, [], steps, 2.0) == []
    assert [s.metric for s in find_stragglers(HOSTS3, [], steps, 1.99)] == ["step time"]
    with pytest.raises(DsclusterError, match="below 1"):
        find_stragglers(HOSTS3, gbps, {}, 0.5)


def test_host_step_times_average_a_nodes_ranks():
    ranks = [
        {"rank": 1, "host": "a", "mean_step_s": 0.3},
        {"rank": 0, "host": "a", "mean_step_s": 0.1},
        {"rank": 2, "host": "b", "mean_step_s": 0.5},
    ]
    assert host_step_times(ranks) == pytest.approx({"a": 0.2, "b": 0.5})


# --- report: tables, failure line, picture ---------------------------------------------------


def rank(i, host, step=0.01, ok=True):
    return {
        "rank": i,
        "host": host,
        "first_loss": 1.0,
        "last_loss": 0.5 if ok else 1.5,
        "loss_decreased": ok,
        "mean_step_s": step,
        "first_step_s": 12.0,
        "checksum": "ab" * 32,
    }


def sample_report(slow: str | None = "n3") -> dict:
    hosts = ["n1", "n2", "n3", "n4"]
    bw = {frozenset((x, y)): 1.0 for i, x in enumerate(hosts) for y in hosts[i + 1 :]}
    if slow:
        for other in hosts:
            if other != slow:
                bw[frozenset((slow, other))] = 0.05
    ranks = [rank(0, "n1"), rank(1, "n1"), rank(2, "n2"), rank(3, "n3"), rank(4, "n4")]
    configs = [
        {"name": "zero1", "zero_stage": 1, "offload": "none", "status": "passed", "wall_s": 3.0,
         "checks": {"checksums_agree": True}, "ranks": ranks},
        {"name": "zero1+nvme", "zero_stage": 1, "offload": "nvme", "status": "skipped",
         "skip": "NVMe offload needs ZeRO-3"},
        {"name": "zero3+nvme", "zero_stage": 3, "offload": "nvme", "status": "passed",
         "wall_s": 9.0, "checks": {"checksums_agree": True}, "ranks": ranks},
    ]  # fmt: skip
    report = {
        "ok": True,
        "run_id": "smoke-20260101T000000000000",
        "world_size": 5,
        "zero_stage": 1,
        "configs": configs,
        "ranks": ranks,
        "p2p": {"hosts": hosts, "ranks": [0, 2, 3, 4], "bytes": 8 << 20, "iters": 5,
                "gbps": matrix(hosts, bw)},
    }  # fmt: skip
    report["stragglers"] = [s.as_dict() for s in report_stragglers(report, 2.0)]
    return report


def render(table) -> str:
    console = Console(file=io.StringIO(), width=250)
    console.print(table)
    return console.file.getvalue()


def test_tables_show_every_configuration_and_link():
    report = sample_report()
    ranks = render(rank_table(report))
    assert "zero1, zero1+nvme (skipped), zero3+nvme" in ranks
    assert ranks.count("zero3+nvme ") >= 5  # one row per rank of each configuration that ran
    configs = render(config_table(report))
    assert "skipped" in configs and "NVMe offload needs ZeRO-3" in configs
    links = render(link_table(report))
    assert all(h in links for h in ("n1", "n2", "n3", "n4")) and "0.050" in links


def test_sample_report_flags_the_slow_node():
    stragglers = sample_report()["stragglers"]
    assert [(s["kind"], s["nodes"]) for s in stragglers] == [("node", ["n3"])]
    assert sample_report(slow=None)["stragglers"] == []


def test_failure_line_names_the_failed_configuration_and_ranks():
    report = sample_report()
    report["configs"][2].update(
        status="failed",
        checks={"loss_decreased_on_every_rank": False, "checksums_agree": True},
        ranks=[rank(0, "n1"), rank(3, "n3", ok=False)],
    )
    line = _failure_line(report, [], pathlib.Path("r.json"))
    assert line == (
        "smoke job ran but failed zero3+nvme: loss_decreased_on_every_rank (ranks 3@n3); "
        "report: r.json"
    )


def test_figure_labels_every_node_and_rank_and_marks_the_straggler():
    report = sample_report()
    fig = build_figure(report)
    heat, bars = fig.axes[0], fig.axes[1]
    hosts = report["p2p"]["hosts"]
    assert [t.get_text() for t in heat.get_xticklabels()] == hosts
    assert [t.get_text() for t in heat.get_yticklabels()] == hosts
    assert [t.get_text() for t in bars.get_xticklabels()] == [
        "0@n1", "1@n1", "2@n2", "3@n3", "4@n4"
    ]  # fmt: skip
    red = [t.get_text() for t in heat.get_yticklabels() if t.get_color() == "#d62728"]
    assert red == ["n3"]
    cells = [t.get_text() for t in heat.texts]
    assert len(cells) == 16 and cells.count("-") == 4 and "0.05" in cells
    title = fig._suptitle.get_text()
    assert report["run_id"] in title and "world size 5" in title and "zero3+nvme" in title
    assert "stragglers: n3" in title


def test_png_renders_and_decodes(tmp_path: pathlib.Path):
    report = sample_report()
    fig = build_figure(report)
    width, height = (fig.get_size_inches() * fig.dpi).round().astype(int)
    image = Image.open(io.BytesIO(render_png(report)))
    assert image.format == "PNG" and image.size == (width, height)
    assert width > 600 and height > 300
    a, b = tmp_path / "reports" / "run.png", tmp_path / "reports" / "smoke-latest.png"
    write_png(report, a, b)
    assert a.read_bytes() == b.read_bytes() and Image.open(a).size == (width, height)
    assert not list(a.parent.glob(".*"))  # no temporary file left behind


def test_png_of_a_single_node_run():
    report = sample_report(slow=None)
    report["p2p"] = {"hosts": ["n1"], "ranks": [0], "bytes": 1 << 20, "iters": 1,
                     "gbps": [[None]]}  # fmt: skip
    report["ranks"] = [rank(0, "n1")]
    assert Image.open(io.BytesIO(render_png(report))).size[0] > 0


def test_the_default_nvme_dir_is_a_private_one_another_user_cannot_plant(tmp_path):
    """--nvme-dir's default is under the shared /tmp, per user: made 0700 where missing, and
    refused in one line where another user put a link or a directory of their own first (the
    ranks would write their optimizer state there)."""
    default = smoke_job.parse_args(["--report", "r.json"]).nvme_dir
    assert default.endswith(f"dscluster-nvme-{os.getuid()}") and "/tmp" in default
    mine = tmp_path / "mine"
    smoke_checks.private_dir(str(mine))
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    smoke_checks.private_dir(str(mine))  # again: kept
    target = tmp_path / "victim"
    target.mkdir()
    link = tmp_path / "planted-link"
    link.symlink_to(target)
    with pytest.raises(SystemExit, match="is a symbolic link; remove it"):
        smoke_checks.private_dir(str(link))
    if os.getuid() == 0:
        foreign = tmp_path / "planted-dir"
        foreign.mkdir(mode=0o777)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(SystemExit, match=r"not a directory of this user's \(uid 65534\)"):
            smoke_checks.private_dir(str(foreign))


@pytest.mark.parametrize(
    ("written", "status", "said"),
    [
        # a leftover process of an earlier job rewrote the report of a job that was cut
        ('{"ok": true, "checks": {}, "ranks": []}', "124", "exited 124"),
        ("[]", "0", "report_readable"),  # not an object
        ('{"ok": true, "ranks": [1, 2]}', "0", "report_ranks_readable"),
        ('{"ok": true, "world_size": true}', "0", "report_world_size_readable"),
        (None, "0", "no report written"),
    ],
)
def test_the_pass_needs_roots_record_and_a_report_of_the_known_shape(
    inventory_dir, monkeypatch, written, status, said
):
    """The job's report.json is the training user's (SECURITY.md): a report that says ok does
    not pass a job root's record on the head says exited 124, and one of another shape fails
    in one line (no traceback) rather than steering the grading."""
    from dscluster.runner import PlaybookResult  # noqa: PLC0415

    def fake_playbook(playbook, inv, *, extravars, **kw):
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        if written is not None:
            (fetched / "report.json").write_text(written)
        (fetched / "launcher.log").write_text("")
        (fetched / "exit_status").write_text(f"{status}\n")
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, fake_playbook)
    with pytest.raises(DsclusterError) as failed:
        run_smoke(load(str(inventory_dir)), steps=1, console=Console(file=io.StringIO()))
    line = str(failed.value)
    assert "\n" not in line and said in line, line
    if status != "0":
        assert "root's record on the head) though its own report says ok" in line
    report = json.loads((inventory_dir / "reports" / "smoke-latest.json").read_text())
    assert report["ok"] is (written is not None and status != "0")
    assert report["launcher_rc"] == int(status)

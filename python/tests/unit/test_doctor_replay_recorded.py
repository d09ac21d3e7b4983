"""`doctor --replay` on folders built from the recorded real outputs (fixtures/health/*,
SOURCES.md there says where each came from): healthy machines exit 0; the same machines with
the documented faults (health_fixtures.FAULTS) exit 1 with each fault named, its action and
its fix. The folders are assembled at test time, so no recording is stored twice."""

from __future__ import annotations

import json
import pathlib

import pytest

from dscluster.cli import main

from .health_fixtures import NVLINK_V100, V100S, fault, fixture

NO_XID = "xid/journal-k_no-xid_gpud1209.txt"
XID79 = "xid/dmesg-t_xid79_xid154_openrm1151.txt"
HPU = "hpu/hl-smi-L-i_gaudi2_hl225_full.txt"
HPU_HOT = "hpu/hl-smi_gaudi2_thermal_slowdown_edited.txt"
IB = "fabric/ibv_devinfo_roce_3x_deepep128.txt"
IB_DOWN = "fabric/ibv_devinfo_roce_mlx5_1_down_edited.txt"


def folder(root: pathlib.Path, host: str, expect: dict, **files: str) -> None:
    """One node's folder as --record writes it: its files and expect.json."""
    (root / host).mkdir(parents=True)
    for name, text in files.items():
        (root / host / name).write_text(text)
    (root / host / "expect.json").write_text(json.dumps(expect))


def cluster(root: pathlib.Path, *, faulty: bool) -> pathlib.Path:
    nvidia = {"accelerator": "nvidia", "devices": 8}
    folder(
        root,
        "v100s",
        nvidia,
        **{
            "nvidia-smi-q.xml": fault("v100s_lost_gpu7") if faulty else fixture(V100S),
            "kernel.log": fixture(XID79 if faulty else NO_XID),
        },
    )
    folder(
        root,
        "v100-sxm2",
        {"accelerator": "nvidia", "devices": 4},
        **{
            "nvidia-smi-nvlink-s.txt": (
                fault("v100_nvlink_gpu1_down") if faulty else fixture(NVLINK_V100)
            ),
            "ibv_devinfo.txt": fixture(IB_DOWN if faulty else IB),
        },
    )
    folder(
        root,
        "gaudi2",
        {"accelerator": "gaudi", "devices": 1},
        **{"hl-smi-q.txt": fixture(HPU_HOT if faulty else HPU)},
    )
    return root


def test_a_healthy_recorded_cluster_replays_to_exit_0(tmp_path, capsys):
    assert main(["doctor", "--replay", str(cluster(tmp_path, faulty=False))]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "every check passed on 3 nodes" in out


@pytest.mark.parametrize(
    ("host", "check", "words"),
    [
        ("v100s", "gpu_count", ("isolate", "7")),
        ("v100s", "xid", ("79",)),
        ("v100-sxm2", "nvlink", ("GPU 1",)),
        ("gaudi2", "hpu", ("thermal",)),
        ("v100-sxm2", "fabric", ("mlx5_1", "port_down")),
    ],
)
def test_each_recorded_fault_is_named_with_its_action_and_fix(tmp_path, capsys, host, check, words):
    root = cluster(tmp_path, faulty=True)
    assert main(["doctor", "--replay", str(root), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    problems = {(p["host"], p["check"]): p for p in report["failures"] + report["warnings"]}
    problem = problems[(host, check)]
    detail = problem["detail"].lower()
    assert all(w.lower() in detail for w in words), problem
    assert problem["fix"], problem


def test_the_faulty_replay_prints_the_table_and_one_line_per_failure(tmp_path, capsys):
    root = cluster(tmp_path, faulty=True)
    assert main(["doctor", "--replay", str(root)]) == 1
    out = capsys.readouterr().out
    assert "│ gpu_count" in out and "│ xid" in out
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert any(line.startswith("FAIL v100s gpu_count: isolate") for line in fails), out
    assert any(line.startswith("FAIL v100s xid: isolate") for line in fails), out

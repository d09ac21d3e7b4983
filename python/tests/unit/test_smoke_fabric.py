"""Grading smoke's all-reduce and point-to-point figures against the fabric's ceiling
(dscluster.smoke.fabric, the rows of dscluster.smoke.ceilings).

No smoke report recorded on real hardware is in the repository yet; the GPU cases grade the
published nccl-tests figures each ceiling row cites (NVIDIA/nccl#527: one p4d 230.77 GB/s
busbw at 1 GiB, two p4d 57.20 GB/s), the TCP cases small reports of the shape the job writes.
"""

from __future__ import annotations

import io
import json
import pathlib
import types

import pytest
from rich.console import Console

from dscluster import cli
from dscluster.errors import DsclusterError
from dscluster.inventory import load
from dscluster.runner import PlaybookResult
from dscluster.smoke import FabricContext, ceilings, fabric_table, grade, run_smoke
from dscluster.smoke import run as smoke_run
from dscluster.smoke.fabric import choose, context_from_facts

from .jobfake import stand_in

GIB = 1 << 30


def allreduce(busbw: float, nbytes: int = GIB) -> list[dict]:
    return [{"bytes": nbytes, "time_s": 0.01, "algbw_gbps": busbw / 2, "busbw_gbps": busbw}]


def test_published_rows_carry_sources_and_consistent_figures():
    rows = ceilings.by_name()
    assert {"nvlink3", "nvlink4", "nvlink5", "efa-p4d", "efa-p5", "efa-p5en", "tcp"} <= set(rows)
    for row in rows.values():
        assert row.sources and all(s.strip() for s in row.sources), row.name
        assert row.link_gbps <= row.node_gbps
    assert ceilings.NVLINK["nvlink4"].link_gbps == 900 / 2  # per direction of 900 GB/s
    assert ceilings.EFA["p5.48xlarge"].node_gbps == 3200 / 8  # Gbps -> GB/s
    assert ceilings.EFA["p4d.24xlarge"].node_gbps == 400 / 8


@pytest.mark.parametrize(
    ("model", "row"),
    [
        ("NVIDIA A100-SXM4-40GB", "nvlink3"),
        ("NVIDIA A100-SXM4-80GB", "nvlink3"),
        ("NVIDIA H100 80GB HBM3", "nvlink4"),
        ("NVIDIA H200", "nvlink4"),
        ("NVIDIA B200", "nvlink5"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA A100-PCIE-40GB", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA A10G", None),
    ],
)
def test_nvlink_row_of_a_model(model, row):
    found = ceilings.nvlink_for(model)
    assert (found.name if found else None) == row


def test_choice_follows_what_the_facts_know():
    h100 = FabricContext(accelerator="cuda", models=("NVIDIA H100 80GB HBM3",), gpus_per_node=8)
    assert choose(h100, 1, tcp_measured=False).ceiling.name == "nvlink4"
    p5 = FabricContext(
        accelerator="cuda",
        models=("NVIDIA H100 80GB HBM3",),
        profiles=("efa",),
        instance_types=("p5.48xlarge",),
    )
    assert choose(p5, 2, tcp_measured=True).ceiling.name == "efa-p5"
    plain = FabricContext(
        accelerator="cuda", profiles=("ethernet",), instance_types=("p5.48xlarge",)
    )
    tcp = choose(plain, 2, tcp_measured=True)
    assert tcp.measured and tcp.ceiling is ceilings.TCP
    cpu = FabricContext(profiles=("cpu",))
    assert choose(cpu, 3, tcp_measured=True).measured
    nothing = choose(cpu, 3, tcp_measured=False)
    assert nothing.ceiling is None and "no raw TCP figures measured" in nothing.why
    assert "no published ceiling" in choose(cpu, 1, tcp_measured=True).why
    ib = choose(FabricContext(accelerator="cuda", profiles=("ib",)), 2, tcp_measured=True)
    assert ib.ceiling is None and "--fabric ib-hdr or ib-ndr" in ib.why
    named = FabricContext(accelerator="cuda", profiles=("ib",), fabric="ib-ndr")
    assert choose(named, 2, tcp_measured=True).ceiling.name == "ib-ndr"
    with pytest.raises(DsclusterError, match="--fabric ib-xdr is not a known fabric"):
        choose(FabricContext(fabric="ib-xdr"), 2, tcp_measured=True)


def test_one_p4d_published_allreduce_grades_77_percent_of_nvlink3():
    context = FabricContext(accelerator="cuda", models=("NVIDIA A100-SXM4-40GB",), gpus_per_node=8)
    graded = grade({"allreduce": allreduce(230.77), "p2p": {"hosts": ["n1"]}}, context)
    assert graded["ceiling"]["name"] == "nvlink3" and graded["ceiling"]["allreduce_gbps"] == 300
    assert graded["allreduce"]["fraction"] == pytest.approx(230.77 / 300)
    assert graded["warnings"] == [] and graded["links"] == []


def test_two_p4d_published_allreduce_is_over_the_efa_line_rate_and_no_warning():
    """NCCL's tree on two nodes crosses the network less than busbw counts (nccl-tests#22)."""
    context = FabricContext(
        accelerator="cuda",
        models=("NVIDIA A100-SXM4-40GB",),
        profiles=("efa",),
        instance_types=("p4d.24xlarge",),
        gpus_per_node=8,
    )
    report = {
        "allreduce": allreduce(57.20),
        "p2p": {"hosts": ["a", "b"], "gbps": [[None, 5.0], [1.0, None]]},
    }
    graded = grade(report, context)
    assert graded["allreduce"]["fraction"] == pytest.approx(57.20 / 50)
    # the p2p pair gets a GPU's share of the instance's EFA: 50 / 8 GB/s
    assert [(x["from"], x["to"], round(x["fraction"], 2)) for x in graded["links"]] == [
        ("a", "b", 0.8),
        ("b", "a", 0.16),
    ]
    assert graded["warnings"] == [
        "fabric: link b -> a: point-to-point 1 GB/s, 16% of the 6.25 GB/s ceiling (EFA 4x 100 "
        "Gbps (p4d/p4de, 8x A100)); below --min-fabric-fraction 0.5"
    ]


def tcp_report(p2p: list[list], tcp: list[list], busbw: float) -> dict:
    hosts = [f"n{i + 1}" for i in range(len(p2p))]
    return {
        "p2p": {"hosts": hosts, "gbps": p2p},
        "tcp": {"bytes": 64 << 20, "iters": 3, "gbps": tcp, "errors": []},
        "allreduce": allreduce(busbw, 32 << 20),
    }


CPU = FabricContext(accelerator="cpu", profiles=("cpu",))


def test_local_cluster_links_are_graded_against_their_own_raw_tcp():
    tcp = [[None, 2.0, 2.0], [2.0, None, 2.0], [2.0, 2.0, None]]
    p2p = [[None, 1.6, 1.5], [1.7, None, 1.4], [1.5, 0.5, None]]
    graded = grade(tcp_report(p2p, tcp, 1.2), CPU)
    assert graded["ceiling"]["measured"] and graded["ceiling"]["allreduce_gbps"] == 2.0
    assert graded["allreduce"]["fraction"] == pytest.approx(0.6)
    assert len(graded["links"]) == 6
    assert graded["warnings"] == [
        "fabric: link n3 -> n2: point-to-point 0.5 GB/s, 25% of the 2 GB/s ceiling (raw TCP "
        "between the nodes); below --min-fabric-fraction 0.5"
    ]


def test_a_node_whose_every_link_is_low_is_named_once():
    tcp = [[None, 2.0, 2.0], [2.0, None, 2.0], [2.0, 2.0, None]]
    p2p = [[None, 1.6, 0.2], [1.7, None, 0.3], [0.2, 0.1, None]]
    graded = grade(tcp_report(p2p, tcp, 0.5), CPU, min_fraction=0.5)
    # the all-reduce is graded (25 %) but, against raw TCP, not warned about: CPU ranks'
    # all-reduce is bound by the host's cores as much as by the wire
    assert graded["allreduce"]["fraction"] == pytest.approx(0.25)
    assert graded["warnings"] == [
        "fabric: node n3: every link on it below 0.5 of the ceiling (raw TCP between the "
        "nodes); best 15%",
    ]


def test_an_allreduce_far_below_a_published_ceiling_is_a_warning():
    context = FabricContext(accelerator="cuda", models=("NVIDIA H100 80GB HBM3",), gpus_per_node=8)
    graded = grade({"allreduce": allreduce(100.0), "p2p": {"hosts": ["n1"]}}, context)
    assert graded["warnings"] == [
        "fabric: all-reduce across one node reaches 100 GB/s busbw (1024 MiB), 22% of the 450 "
        "GB/s ceiling (NVLink 4 (H100/H200 SXM, NVSwitch): 900 GB/s per GPU both ways); below "
        "--min-fabric-fraction 0.5"
    ]


def test_every_direction_low_is_one_line_not_one_per_link():
    tcp = [[None, 2.0, 2.0], [2.0, None, 2.0], [2.0, 2.0, None]]
    p2p = [[None, 0.4, 0.5], [0.6, None, 0.4], [0.5, 0.4, None]]
    graded = grade(tcp_report(p2p, tcp, 1.5), CPU)
    assert graded["warnings"] == [
        "fabric: every point-to-point direction (6) below 0.5 of the ceiling (raw TCP between "
        "the nodes); best 30%"
    ]


def test_a_slowed_nic_slows_raw_tcp_too_so_the_fabric_grade_stays_quiet():
    """tc on one node's eth0 (test_e2e_smoke) limits its raw TCP as much as gloo: that is a
    straggler (stragglers.py names it), not a stack that falls short of its network."""
    tcp = [[None, 2.0, 0.025], [2.0, None, 0.025], [0.025, 0.025, None]]
    p2p = [[None, 1.6, 0.02], [1.7, None, 0.021], [0.022, 0.02, None]]
    graded = grade(tcp_report(p2p, tcp, 0.9), CPU)
    assert not any(w.startswith("fabric: node") or "link" in w for w in graded["warnings"])


def test_no_ceiling_grades_nothing_and_says_why():
    graded = grade(tcp_report([[None, 1.0], [1.0, None]], [[None, None], [None, None]], 1.0), CPU)
    assert graded["ceiling"] is None and graded["allreduce"] is None and graded["links"] == []
    assert "no raw TCP figures measured" in graded["why"]
    with pytest.raises(DsclusterError, match="--min-fabric-fraction"):
        grade({}, CPU, min_fraction=0)


def test_fabric_table_shows_the_share_and_marks_the_low():
    tcp = [[None, 2.0], [2.0, None]]
    graded = grade(tcp_report([[None, 1.8], [0.4, None]], tcp, 1.0), CPU)
    console = Console(file=io.StringIO(), width=200)
    console.print(fabric_table({"fabric_grade": graded}))
    text = console.file.getvalue()
    assert "all-reduce busbw (32 MiB)" in text and "50%" in text
    assert "n2 -> n1" in text and "20% ✗" in text and "90%" in text


def test_context_from_facts():
    facts = [
        types.SimpleNamespace(accelerator="cuda", models=("NVIDIA H100 80GB HBM3",),
                              nccl_env={"profile": "efa"}, accelerator_count=8),
        types.SimpleNamespace(accelerator="cuda", models=("NVIDIA H100 80GB HBM3",),
                              nccl_env={}, accelerator_count=8),
    ]  # fmt: skip
    context = context_from_facts(facts, {"a": "p5.48xlarge", "b": ""}, "")
    assert context == FabricContext(
        accelerator="cuda",
        models=("NVIDIA H100 80GB HBM3",),
        profiles=("", "efa"),
        instance_types=("p5.48xlarge",),
        gpus_per_node=8,
    )


def test_smoke_fabric_flags():
    args = cli.build_parser().parse_args(["smoke", "-i", "x"])
    assert (args.min_fabric_fraction, args.fabric) == (0.5, "")
    args = cli.build_parser().parse_args(
        ["smoke", "-i", "x", "--min-fabric-fraction", "0.8", "--fabric", "efa-p5"]
    )
    assert (args.min_fabric_fraction, args.fabric) == (0.8, "efa-p5")
    for bad in (["--fabric", "token-ring"], ["--min-fabric-fraction", "0"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["smoke", "-i", "x", *bad])


def test_run_smoke_adds_the_slow_devices_and_the_fabric_grade(inventory_dir, monkeypatch):
    """run_smoke over a job that wrote device_bench and tcp sections: the controller names
    the slow device and grades the fabric, into the JSON report."""
    devices = [
        {"rank": r, "local_rank": 0, "host": h, "device": "cpu: test", "matmul_tflops": t,
         "copy_gbps": 10.0, "matmul_dtype": "float32"}
        for r, (h, t) in enumerate([("node-a", 0.1), ("node-b", 0.1), ("node-c", 0.01)])
    ]  # fmt: skip
    job_report = {
        "ok": True,
        "checks": {},
        "ranks": [],
        "device_bench": {"seconds": 0.5, "scale": 1.0, "devices": devices},
        "tcp": {"bytes": 1, "iters": 3, "errors": [], "gbps": [[None, 2.0], [2.0, None]]},
        "p2p": {"hosts": ["node-a", "node-b"], "gbps": [[None, 1.5], [0.2, None]]},
        "allreduce": allreduce(1.5, 32 << 20),
    }

    def fake_playbook(playbook, inv, *, extravars, **kw):
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        (fetched / "report.json").write_text(json.dumps(job_report))
        (fetched / "launcher.log").write_text("")
        (fetched / "exit_status").write_text("0\n")
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    programs: list[list[str]] = []
    original = smoke_run.plan_for

    def plan_for(inv, files, request, run_id):
        programs.append(request.program)
        return original(inv, files, request, run_id)

    stand_in(monkeypatch, fake_playbook)
    monkeypatch.setattr(smoke_run, "plan_for", plan_for)
    report, path = run_smoke(
        load(str(inventory_dir)), steps=1, console=Console(file=io.StringIO()), fabric="tcp"
    )
    assert json.loads(path.read_text()) == report
    (slow,) = report["device_bench"]["slow"]
    assert (slow["host"], slow["rank"], slow["metric"]) == ("node-c", 2, "matmul_tflops")
    graded = report["fabric_grade"]
    assert graded["context"]["fabric"] == "tcp" and graded["ceiling"]["measured"]
    assert graded["warnings"] == [
        "fabric: link node-b -> node-a: point-to-point 0.2 GB/s, 10% of the 2 GB/s ceiling "
        "(raw TCP between the nodes); below --min-fabric-fraction 0.5"
    ]
    # raw TCP is measured where it is the ceiling, and not where a published row is
    assert "--tcp-mb" not in programs[-1]
    assert programs[-1][programs[-1].index("--device-bench-s") + 1] == "0.5"
    run_smoke(
        load(str(inventory_dir)), console=Console(file=io.StringIO()), fabric="efa-p5",
        device_bench_s=2,
    )  # fmt: skip
    assert programs[-1][programs[-1].index("--tcp-mb") :][:2] == ["--tcp-mb", "0"]
    assert programs[-1][programs[-1].index("--device-bench-s") + 1] == "2"
    with pytest.raises(DsclusterError, match="--fabric ib-xdr is not a known fabric"):
        run_smoke(load(str(inventory_dir)), console=Console(file=io.StringIO()), fabric="ib-xdr")

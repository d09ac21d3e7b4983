"""doctor/health/fabric.py on recorded `fi_info -p efa` (fixtures/efa, fixtures/accelerators)
and `ibv_devinfo` outputs (fixtures/health/fabric/SOURCES.md)."""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dscluster.doctor.health import Expect, NodeOutputs, Unreadable, fabric

UNIT = pathlib.Path(__file__).parent / "fixtures"
EFA = UNIT / "efa"
ACCEL = UNIT / "accelerators"
IB = UNIT / "health" / "fabric"


def recorded(path: pathlib.Path) -> str:
    return path.read_text()


def judge(fi_info: str | None = None, ibv: str | None = None, **expect):
    files = {}
    if fi_info is not None:
        files[fabric.FI_INFO] = fi_info
    if ibv is not None:
        files[fabric.IBV] = ibv
    return fabric.judge_fabric(NodeOutputs("n1", files), Expect(**expect))


P4D = ["rdmap144s27", "rdmap160s27", "rdmap16s27", "rdmap32s27"]


@pytest.mark.parametrize(
    ("path", "names"),
    [
        (EFA / "fi_info_p4d_4x_rdm.txt", P4D),
        (ACCEL / "fi_info-p_efa-t_rdm_p4d_4x.txt", P4D),
        (EFA / "fi_info_efa_direct_1x.txt", ["rdmap47s0"]),  # one device under two fabrics
        (EFA / "fi_info_hpc6a_1x.txt", ["rdmap0s31"]),
        (ACCEL / "fi_info-p_efa_efa0_2020.txt", ["efa_0"]),  # with an efa;ofi_rxd entry
        (EFA / "fi_info_no_device.stderr", []),
    ],
)
def test_counts_devices_not_entries(path, names):
    assert fabric.parse_fi_info(recorded(path)) == names


def test_the_expected_efa_count_passes():
    (finding,) = judge(
        recorded(EFA / "fi_info_p4d_4x_rdm.txt"), efa=4, instance_type="p4d.24xlarge"
    )
    assert finding.status == "pass"
    assert finding.detail.startswith("EFA: 4 device(s) (expected 4): rdmap144s27,")


def test_fewer_efa_devices_than_the_instance_type_has_isolates_the_node():
    (finding,) = judge(recorded(EFA / "fi_info_hpc6a_1x.txt"), efa=4, instance_type="p4d.24xlarge")
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail == "EFA: 1 of 4 expected devices (p4d.24xlarge) seen by libfabric"
    assert finding.evidence == "fi_info -p efa devices: rdmap0s31"
    (finding,) = judge(recorded(EFA / "fi_info_no_device.stderr"), efa=1)
    assert finding.status == "fail" and finding.evidence.endswith("devices: none")


def test_active_roce_and_infiniband_ports_pass():
    (finding,) = judge(ibv=recorded(IB / "ibv_devinfo_roce_3x_deepep128.txt"))
    assert finding.status == "pass" and finding.detail == "3 RDMA port(s) active (Ethernet)"
    (finding,) = judge(ibv=recorded(IB / "ibv_devinfo_ib_1x_deepep55.txt"))
    assert finding.detail == "1 RDMA port(s) active (InfiniBand)"
    ports = fabric.parse_ibv_devinfo(recorded(IB / "ibv_devinfo_ib_1x_deepep55.txt"))
    assert ports[0].device == "mlx5_3" and ports[0].active_mtu == "4096 (5)"


def test_a_down_roce_port_beside_active_ones_warns():
    (finding,) = judge(ibv=recorded(IB / "ibv_devinfo_roce_down_deepep60.txt"))
    assert (finding.status, finding.action) == ("warn", "monitor")
    assert finding.detail == (
        "RoCE (Ethernet) mlx5_12 port 1 is PORT_DOWN while 1 other port(s) are active"
    )
    assert finding.evidence == ("hca_id: mlx5_12 port: 1 state: PORT_DOWN (1) link_layer: Ethernet")
    (finding,) = judge(ibv=recorded(IB / "ibv_devinfo_roce_mlx5_1_down_edited.txt"))
    assert "mlx5_1 port 1 is PORT_DOWN while 2 other" in finding.detail


def test_the_only_infiniband_port_not_active_takes_the_node_out():
    (finding,) = judge(ibv=recorded(IB / "ibv_devinfo_ib_port_init_edited.txt"))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert "InfiniBand mlx5_3 port 1 is PORT_INIT and no RDMA port" in finding.detail
    assert "subnet manager" in finding.fix


def test_both_files_together():
    findings = judge(
        recorded(EFA / "fi_info_hpc6a_1x.txt"),
        recorded(IB / "ibv_devinfo_roce_down_deepep60.txt"),
        efa=1,
    )
    assert [f.status for f in findings] == ["warn"]
    (finding,) = judge(
        recorded(EFA / "fi_info_hpc6a_1x.txt"),
        recorded(IB / "ibv_devinfo_ib_1x_deepep55.txt"),
        efa=1,
    )
    assert finding.detail == (
        "EFA: 1 device(s) (expected 1): rdmap0s31; 1 RDMA port(s) active (InfiniBand)"
    )


def test_no_fabric_tools_skips_with_both_reasons():
    outputs = NodeOutputs("n1", {}, {fabric.FI_INFO: "fi_info: not found"})
    (finding,) = fabric.judge_fabric(outputs, Expect())
    assert finding.status == "skip"
    assert finding.detail.startswith("no fabric tools' output: fi_info: not found; ")
    assert "ibv_devinfo.txt was not recorded" in finding.detail


@pytest.mark.parametrize(
    "why",
    # no libfabric; no EFA device (the probe's reason for fixtures/efa/fi_info_no_device.stderr)
    ["fi_info: not found", "fi_info: fi_getinfo: -61"],
)
def test_an_instance_with_efa_attached_and_none_listed_is_taken_out(why):
    ibv = recorded(IB / "ibv_devinfo_ib_1x_deepep55.txt")
    outputs = NodeOutputs("n1", {fabric.IBV: ibv}, {fabric.FI_INFO: why})
    (finding,) = fabric.judge_fabric(outputs, Expect(efa=4, instance_type="p4d.24xlarge"))
    assert (finding.status, finding.action) == ("fail", "isolate")
    assert finding.detail == f"EFA: 0 of 4 expected devices (p4d.24xlarge): {why}"
    assert "dscluster provision" in finding.fix


def test_no_efa_expected_and_no_fi_info_judges_the_ports_alone():
    findings = judge(ibv=recorded(IB / "ibv_devinfo_ib_1x_deepep55.txt"), efa=0)
    assert [f.status for f in findings] == ["pass"]


def test_garbage_and_truncated_outputs_are_unreadable_in_one_line():
    with pytest.raises(Unreadable, match=r"^fi_info-efa.txt: not fi_info output: "):
        judge("Segmentation fault (core dumped)\n")
    text = recorded(EFA / "fi_info_p4d_4x_rdm.txt")
    cut = text[: text.rindex("domain:")]
    with pytest.raises(Unreadable, match=r"^fi_info-efa.txt: entry 4 has no domain"):
        judge(cut)
    with pytest.raises(Unreadable, match=r"^ibv_devinfo.txt: no hca_id"):
        judge(ibv="Segmentation fault (core dumped)\n")
    text = recorded(IB / "ibv_devinfo_roce_3x_deepep128.txt")
    with pytest.raises(Unreadable, match=r"^ibv_devinfo.txt: mlx5_2 port 1 has no link_layer"):
        judge(ibv=text[: text.rindex("link_layer")])
    with pytest.raises(Unreadable, match=r"^ibv_devinfo.txt: mlx5_2 has 1 port\(s\) but 0"):
        judge(ibv=text[: text.rindex("port:")])


def test_no_ib_devices_is_zero_ports():
    (finding,) = judge(ibv="No IB devices found\n")
    assert finding.detail == "ibv_devinfo: 0 port(s), none InfiniBand or RoCE"


LINES = st.sampled_from(
    [
        "provider: efa",
        "    fabric: efa",
        "    domain: rdmap16s27-rdm",
        "    type: FI_EP_RDM",
        "hca_id:\tmlx5_0",
        "\tphys_port_cnt:\t1",
        "\t\tport:\t1",
        "\t\t\tstate:\tPORT_ACTIVE (4)",
        "\t\t\tlink_layer:\tInfiniBand",
        "",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.lists(LINES | st.text(max_size=20), max_size=12).map("\n".join))
def test_any_text_parses_or_is_unreadable(text):
    for name, parser in (
        (fabric.FI_INFO, fabric.parse_fi_info),
        (fabric.IBV, fabric.parse_ibv_devinfo),
    ):
        try:
            parser(text)
        except Unreadable as exc:
            assert str(exc).startswith(f"{name}: ") and "\n" not in str(exc)

"""The per-device benchmark: the judge that names slow devices (dscluster.smoke.devices), and
the job's raw TCP pass between node leaders (jobs/smoke_device.py) over real sockets."""

from __future__ import annotations

import io
import math
import socket
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from dscluster import cli
from dscluster.errors import DsclusterError
from dscluster.jobs import smoke_device, smoke_job
from dscluster.smoke import device_table, slow_devices
from dscluster.smoke.devices import median_mad

GPU = "NVIDIA H100 80GB HBM3"


def dev(rank: int, tflops: float | None, gbps: float | None = 1000.0, *, device=GPU, host=""):
    return {
        "rank": rank,
        "local_rank": rank % 8,
        "host": host or f"n{rank // 8 + 1}",
        "device": device,
        "matmul_tflops": tflops,
        "copy_gbps": gbps,
    }


def named(found) -> list[tuple[int, str]]:
    return [(s.rank, s.metric) for s in found]


# --- the judge: examples ---------------------------------------------------------------------


def test_one_slow_gpu_among_eight_is_named_with_its_figure_and_the_median():
    devices = [dev(r, 700.0 + r) for r in range(8)]
    devices[5] = dev(5, 350.0)
    (slow,) = slow_devices(devices)
    assert (slow.host, slow.rank, slow.local_rank, slow.metric) == ("n1", 5, 5, "matmul_tflops")
    assert slow.message == (
        f"slow device: n1 rank 5 (local 5, {GPU}): matmul 350 TFLOPS, 50% of the median 702 of 8 "
        "devices"
    )


def test_identical_figures_name_nothing_and_a_slow_one_among_them_is_named():
    assert slow_devices([dev(r, 100.0) for r in range(6)]) == []
    devices = [dev(r, 100.0) for r in range(6)] + [dev(6, 79.0)]
    assert named(slow_devices(devices)) == [(6, "matmul_tflops")]  # MAD 0: the floor decides
    devices[-1] = dev(6, 81.0)  # within 20 %: not named however tight the others are
    assert slow_devices(devices) == []


def test_one_or_two_devices_and_a_half_slow_cluster_name_nothing():
    assert slow_devices([dev(0, 1.0)]) == []
    assert slow_devices([dev(0, 1.0), dev(1, 100.0)]) == []
    # two nodes, one held to a fraction of a core: the median lies between them
    devices = [
        dev(0, 1.0, host="a"),
        dev(1, 1.0, host="a"),
        dev(2, 9.0, host="b"),
        dev(3, 9.0, host="b"),
    ]
    assert slow_devices(devices) == []


def test_missing_and_nan_figures_are_left_out_of_their_metric():
    devices = [dev(0, 10.0), dev(1, 10.0), dev(2, math.nan), dev(3, None), dev(4, 2.0)]
    devices.append({"rank": 5, "device": GPU})  # a rank that reported no figures at all
    assert named(slow_devices(devices)) == [(4, "matmul_tflops")]
    # copy: every device reported 1000 GB/s but two; those are not named for a missing figure
    assert all(s.metric == "matmul_tflops" for s in slow_devices(devices))


def test_each_kind_is_judged_among_its_own():
    cpus = [dev(r, 0.1, 20.0, device="cpu: Xeon") for r in range(8, 12)]
    gpus = [dev(r, 700.0) for r in range(4)]
    assert slow_devices(gpus + cpus) == []  # a CPU rank is not slow next to a GPU
    cpus[1] = dev(9, 0.1, 5.0, device="cpu: Xeon")
    assert named(slow_devices(gpus + cpus)) == [(9, "copy_gbps")]


def test_the_threshold_is_a_fraction():
    devices = [dev(r, 100.0) for r in range(4)] + [dev(4, 60.0)]
    assert named(slow_devices(devices, threshold=0.3)) == [(4, "matmul_tflops")]
    assert slow_devices(devices, threshold=0.4) == []  # exactly 40 % below is not more than
    for bad in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(DsclusterError, match="--device-bench-threshold"):
            slow_devices(devices, threshold=bad)


# --- the judge: properties -------------------------------------------------------------------

figure = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
figures = st.lists(figure, min_size=0, max_size=24)
thresholds = st.floats(min_value=0.01, max_value=0.9)


def devices_of(values: list[float]) -> list[dict]:
    return [dev(r, v) for r, v in enumerate(values)]


@given(figures, thresholds)
def test_a_named_device_is_below_the_median_by_more_than_the_threshold(values, threshold):
    found = slow_devices(devices_of(values), threshold=threshold)
    for s in found:
        assert s.value < s.median * (1 - threshold)
        assert s.median == median_mad(values)[0]
    assert len(found) <= len(values) // 2  # a median has as many figures above as below


@given(figures, thresholds, st.randoms(use_true_random=False))
def test_the_order_of_the_ranks_does_not_matter(values, threshold, rnd):
    devices = devices_of(values)
    shuffled = devices[:]
    rnd.shuffle(shuffled)
    assert slow_devices(shuffled, threshold=threshold) == slow_devices(devices, threshold=threshold)


@given(figures, st.integers(min_value=-12, max_value=12))
def test_units_do_not_matter(values, exponent):
    """TFLOPS or GFLOPS: the same devices (a power of two scales every step exactly)."""
    scaled = devices_of([v * 2.0**exponent for v in values])
    assert named(slow_devices(scaled)) == named(slow_devices(devices_of(values)))


@given(figure, st.integers(min_value=1, max_value=20), thresholds)
def test_identical_figures_never_name_anything(value, count, threshold):
    assert slow_devices(devices_of([value] * count), threshold=threshold) == []


@given(figure, st.integers(min_value=3, max_value=20), st.floats(min_value=0.0, max_value=0.75))
def test_one_device_well_below_identical_peers_is_always_named(value, peers, share):
    devices = devices_of([value] * peers + [value * share])
    assert named(slow_devices(devices)) == [(peers, "matmul_tflops")]


@given(figures, st.lists(st.sampled_from([math.nan, math.inf, None]), max_size=5))
def test_unmeasured_devices_change_nothing_for_the_measured(values, gaps):
    measured = devices_of(values)
    more = measured + [dev(len(values) + i, g) for i, g in enumerate(gaps)]
    assert slow_devices(more) == slow_devices(measured)


# --- the table, the flags ----------------------------------------------------------------------


def test_device_table_marks_the_slow_figure():
    devices = [dev(r, 100.0) for r in range(4)] + [dev(4, 10.0)]
    for d in devices:
        d["matmul_dtype"] = "bfloat16"
    found = slow_devices(devices)
    report = {
        "device_bench": {
            "seconds": 0.5,
            "passes": 2,
            "threshold": 0.2,
            "devices": devices,
            "slow": [s.as_dict() for s in found],
        }
    }
    console = Console(file=io.StringIO(), width=200)
    console.print(device_table(report))
    text = console.file.getvalue()
    assert "10.000 ✗" in text and text.count("✗") == 2  # the cell and the title's legend
    assert f"{GPU} (bfloat16)" in text and "best of 2; ✗ over 20% below the median" in text


def test_smoke_flags_size_skip_and_judge_the_benchmark():
    args = cli.build_parser().parse_args(["smoke", "-i", "x"])
    assert (args.no_device_bench, args.device_bench_s, args.device_bench_threshold) == (
        False,
        0.5,
        0.2,
    )
    args = cli.build_parser().parse_args(
        ["smoke", "-i", "x", "--no-device-bench", "--device-bench-s", "2",
         "--device-bench-threshold", "0.3"]
    )  # fmt: skip
    assert (args.no_device_bench, args.device_bench_s, args.device_bench_threshold) == (
        True,
        2.0,
        0.3,
    )
    for bad in (["--device-bench-s", "0"], ["--device-bench-threshold", "1.5"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["smoke", "-i", "x", *bad])
    job = smoke_job.parse_args(["--report", "r"])
    assert (job.device_bench_s, job.device_bench_scale, job.tcp_mb) == (0.5, 1.0, None)
    assert smoke_job.parse_args(["--report", "r", "--device-bench-s", "0"]).device_bench_s == 0


# --- the job's side: timing, raw TCP ---------------------------------------------------------


def test_timed_excludes_the_warm_up_and_runs_until_the_time_is_spent():
    calls = []
    rounds, elapsed = smoke_device.timed(lambda: calls.append(1), lambda: None, 0.01)
    assert elapsed >= 0.01 and rounds == len(calls) - 1


def test_tcp_send_and_receive_over_a_real_socket():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.settimeout(10)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    receiver = threading.Thread(
        target=smoke_device.tcp_receive, args=(listener,), kwargs={"nbytes": 3 << 20, "iters": 2}
    )
    receiver.start()
    try:
        gbps = smoke_device.tcp_send(listener.getsockname(), nbytes=3 << 20, iters=2, timeout=10)
    finally:
        receiver.join(10)
        listener.close()
    assert gbps > 0 and not receiver.is_alive()


class Group:
    """A process group of threads: barrier and all_gather_object, as torch.distributed."""

    def __init__(self, world: int):
        self.world = world
        self.barrier_ = threading.Barrier(world, timeout=30)
        self.slots: list = [None] * world
        self.local = threading.local()

    def member(self, rank: int) -> Group.Member:
        return Group.Member(self, rank)

    class Member:
        def __init__(self, group: Group, rank: int):
            self.group, self.rank = group, rank

        def get_rank(self) -> int:
            return self.rank

        def get_world_size(self) -> int:
            return self.group.world

        def barrier(self) -> None:
            self.group.barrier_.wait()

        def all_gather_object(self, out: list, obj) -> None:
            self.group.barrier_.wait()
            self.group.slots[self.rank] = obj
            self.group.barrier_.wait()
            out[:] = list(self.group.slots)
            self.group.barrier_.wait()


def tcp_pass_on_threads(world: int, leaders: list[int], **measure) -> dict[int, tuple]:
    """tcp_pass run by `world` ranks, each a thread named rank<N> of one Group, over
    loopback: rank -> what it returned."""
    group = Group(world)
    results: dict[int, tuple] = {}

    def run(rank: int) -> None:
        results[rank] = smoke_device.tcp_pass(
            group.member(rank), leaders=leaders, toward="127.0.0.1", **measure
        )

    threads = [threading.Thread(target=run, args=(r,), name=f"rank{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_tcp_pass_measures_every_direction_between_node_leaders():
    """Four ranks on three "nodes" (ranks 0, 2 and 3 lead them): every rank takes part in the
    barriers, each leader sends to and receives from each other leader."""
    results = tcp_pass_on_threads(4, [0, 2, 3], nbytes=1 << 20, iters=2, timeout=10)
    assert sorted(results) == [0, 1, 2, 3]
    matrix, errors = results[1]
    assert errors == [] and all(results[r] == results[1] for r in range(4))
    for i in range(3):
        for j in range(3):
            assert (matrix[i][j] is None) == (i == j), matrix
            assert i == j or matrix[i][j] > 0


def test_tcp_pass_reports_a_refused_connection_and_goes_on(monkeypatch):
    """Node 0 cannot reach node 1 (a firewall, say): that direction is None with both ends'
    errors (the receiver's accept times out), the other direction is measured."""
    original = smoke_device.tcp_send

    def refused(address, **kw):
        if threading.current_thread().name == "rank0":
            raise ConnectionRefusedError(111, "Connection refused")
        return original(address, **kw)

    monkeypatch.setattr(smoke_device, "tcp_send", refused)
    matrix, errors = tcp_pass_on_threads(2, [0, 1], nbytes=1 << 16, iters=1, timeout=2)[0]
    assert matrix[0][1] is None and matrix[1][0] and matrix[1][0] > 0
    assert any(e.startswith("0,1 send (127.0.0.1): ") and "refused" in e for e in errors), errors
    assert any(e.startswith("0,1 receive (127.0.0.1): ") for e in errors), errors


def test_tcp_pass_goes_on_when_a_leader_cannot_listen(monkeypatch):
    """Node 1 cannot open its listening socket: nobody sends to it, rank 0 reports why, the
    other directions are measured and no rank waits for the missing one."""
    original = smoke_device.listen

    def no_port(toward, timeout):
        if threading.current_thread().name == "rank1":
            return None, {"error": "listen on n2: [Errno 98] Address already in use"}
        return original(toward, timeout)

    monkeypatch.setattr(smoke_device, "listen", no_port)
    matrix, errors = tcp_pass_on_threads(3, [0, 1, 2], nbytes=1 << 16, iters=1, timeout=5)[2]
    assert errors == ["listen on n2: [Errno 98] Address already in use"]
    assert matrix[0][1] is None and matrix[2][1] is None
    assert all(matrix[i][j] for i, j in ((0, 2), (1, 0), (1, 2), (2, 0)))


def test_better_pass_keeps_each_ranks_better_figure():
    first = [dev(0, 10.0, 5.0), dev(1, 2.0, 9.0), {"rank": 2, "device": GPU, "error": "OOM"}]
    second = [dev(1, 8.0, 1.0), dev(0, 3.0, None), dev(2, 7.0, 7.0)]
    better = smoke_device.better_pass(first, second)
    assert [(d["rank"], d["matmul_tflops"], d["copy_gbps"]) for d in better] == [
        (0, 10.0, 5.0),
        (1, 8.0, 9.0),
        (2, 7.0, 7.0),
    ]
    assert "error" not in better[2]  # measured in the second pass
    assert smoke_device.better_pass(first, []) == first


def test_local_address_is_the_route_toward_the_master():
    assert smoke_device.local_address("127.0.0.1") == "127.0.0.1"


def test_the_threshold_error_names_the_flag():
    with pytest.raises(DsclusterError, match=r"0\.2 for 'more than 20 % below the median'"):
        slow_devices([], threshold=0)

"""scripts/bench_cpu.py, make bench's split of a local provision's CPU between the node
containers and the controller: each cgroup layout Docker may leave is read, and a container
whose counter is nowhere is unknown (the split is then not printed as if it were 0)."""

from __future__ import annotations

import pathlib
import types

import pytest

from .. import rolefiles


@pytest.fixture
def bench_cpu(tmp_path, monkeypatch):
    module = rolefiles.load_script("bench_cpu")
    monkeypatch.setattr(module, "CGROUP", tmp_path)
    return module


def write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(text)


def test_cgroup_v1_counter_is_nanoseconds(bench_cpu, tmp_path):
    write(tmp_path / "cpuacct/docker/abc/cpuacct.usage", "51250000000\n")
    assert bench_cpu.container_cpu_s("abc") == pytest.approx(51.25)


@pytest.mark.parametrize("where", ["system.slice/docker-abc.scope", "docker/abc"])
def test_cgroup_v2_usage_usec_with_either_driver(bench_cpu, tmp_path, where):
    write(tmp_path / where / "cpu.stat", "usage_usec 7500000\nuser_usec 5000000\n")
    assert bench_cpu.container_cpu_s("abc") == pytest.approx(7.5)


def test_container_without_a_counter_is_unknown(bench_cpu, tmp_path):
    write(tmp_path / "cpuacct/docker/other/cpuacct.usage", "1\n")
    write(tmp_path / "docker/abc/cpu.stat", "user_usec 5\n")  # no usage_usec line
    assert bench_cpu.container_cpu_s("abc") is None


def test_machine_busy_seconds_only_grow(bench_cpu):
    first = bench_cpu.machine_busy_s()
    sum(i * i for i in range(200_000))  # some CPU between the readings
    assert 0 < first <= bench_cpu.machine_busy_s()


def test_since_says_the_lanes_cpu_and_the_time_that_work_alone_needs(bench_cpu, monkeypatch):
    monkeypatch.setattr(bench_cpu, "machine_busy_s", lambda: 1300.0)
    monkeypatch.setattr(bench_cpu, "time", types.SimpleNamespace(time=lambda: 2000.0))
    line = bench_cpu.since(100.0, 1000.0, cores=2)  # 1200 CPU-seconds over 1000 s on 2 cores
    assert line == (
        "== lanes: 1200 CPU-seconds in 1000 s on 2 cores (60% busy); that work alone needs 600 s"
    )


def test_calibrate_takes_the_best_of_its_rounds_in_cpu_time(bench_cpu, monkeypatch):
    ticks = iter([0.0, 0.30, 1.0, 1.12, 2.0, 2.25])  # rounds of 300, 120 and 250 ms of CPU
    monkeypatch.setattr(bench_cpu, "time", types.SimpleNamespace(process_time=lambda: next(ticks)))
    line = bench_cpu.calibrate(rounds=3)
    assert line == (
        "== this machine: a fixed pure-Python workload in 120 ms of CPU (best of 3); "
        "CPU-seconds of runs compare in proportion to it"
    )


def test_calibrate_measures_real_work(bench_cpu, capsys):
    assert bench_cpu.main(["bench_cpu.py", "calibrate"]) == 0
    ms = int(capsys.readouterr().out.split(" in ")[1].split(" ms")[0])
    assert ms > 0
    assert bench_cpu.workload() == 5000


def test_calibrate_ms_is_the_figure_alone_for_the_bench_json(bench_cpu, capsys, monkeypatch):
    ticks = iter([0.0, 0.30, 1.0, 1.12, 2.0, 2.25, 3.0, 3.2, 4.0, 4.4])
    monkeypatch.setattr(bench_cpu, "time", types.SimpleNamespace(process_time=lambda: next(ticks)))
    assert bench_cpu.main(["bench_cpu.py", "calibrate-ms"]) == 0
    assert capsys.readouterr().out == "120\n"  # the best of the 5 rounds, a bare JSON number


def fake_docker(tmp_path: pathlib.Path, monkeypatch, script: str) -> pathlib.Path:
    """A `docker` first on PATH that runs `script` (sh) and records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/argv"\n{script}\n')
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return tmp_path / "argv"


def test_node_containers_of_one_cluster_or_of_all(bench_cpu, tmp_path, monkeypatch):
    argv = fake_docker(
        tmp_path, monkeypatch, "printf 'aaa dsc-e2e-n1 e2e\\nbbb dsc-e2eb-bk-n1 e2eb-bk\\n'"
    )
    found = bench_cpu.node_containers()
    assert found == [("aaa", "dsc-e2e-n1", "e2e"), ("bbb", "dsc-e2eb-bk-n1", "e2eb-bk")]
    assert f"--filter label={bench_cpu.LABEL} " in argv.read_text()
    bench_cpu.node_containers("e2e")
    assert f"--filter label={bench_cpu.LABEL}=e2e " in argv.read_text()


@pytest.mark.parametrize("script", ["echo 'Cannot connect' >&2; exit 1", "exit 127"])
def test_node_containers_are_none_where_docker_does_not_answer(
    bench_cpu, tmp_path, monkeypatch, script
):
    fake_docker(tmp_path, monkeypatch, script)
    assert bench_cpu.node_containers() == []
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no docker at all
    assert bench_cpu.node_containers("e2e") == []


def test_split_sums_the_clusters_nodes_and_leaves_the_rest_to_the_controller(
    bench_cpu, tmp_path, monkeypatch
):
    fake_docker(tmp_path, monkeypatch, "printf 'aaa dsc-x-n1 x\\nbbb dsc-x-n2 x\\n'")
    write(tmp_path / "docker" / "aaa" / "cpu.stat", "usage_usec 30000000\n")
    write(tmp_path / "docker" / "bbb" / "cpu.stat", "usage_usec 12500000\n")
    monkeypatch.setattr(bench_cpu, "machine_busy_s", lambda: 100.0)
    assert bench_cpu.split("x", 40.0) == {
        "machine_cpu_s": 60.0,
        "nodes_cpu_s": 42.5,
        "max_node_cpu_s": 30.0,
        "controller_cpu_s": 17.5,
    }
    (tmp_path / "docker" / "bbb" / "cpu.stat").unlink()  # one node's counter is nowhere
    assert bench_cpu.split("x", 40.0)["nodes_cpu_s"] is None

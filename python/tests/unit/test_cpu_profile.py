"""The e2e sessions' CPU by test (tests/e2e/cpu_profile.py): whose nodes count, a node
restarted in a test, and the summary make test's log shows."""

from __future__ import annotations

import pytest

from ..e2e import cpu_profile


def test_a_cluster_name_covers_the_clusters_named_after_it(monkeypatch):
    monkeypatch.setattr(cpu_profile, "CLUSTERS", ("e2eb", "pipcl"))
    assert cpu_profile.ours("e2eb") and cpu_profile.ours("e2eb-bk") and cpu_profile.ours("pipcl")
    # the first lane's cluster is not the second's, nor one that only begins alike
    assert (
        not cpu_profile.ours("e2e") and not cpu_profile.ours("e2ebx") and not cpu_profile.ours("")
    )


def test_nodes_count_what_they_used_during_the_test_a_restarted_one_since_its_start(monkeypatch):
    monkeypatch.setattr(cpu_profile, "CLUSTERS", ("e2e",))
    readings = iter([
        (10.0, {"a": 100.0, "b": 50.0, "gone": 7.0}),
        # a: +5; b restarted (its counter began again at 0): 2; new: made in the test, 3
        (14.5, {"a": 105.0, "b": 2.0, "new": 3.0}),
    ])  # fmt: skip
    current = {}

    def step():
        current["ctrl"], current["nodes"] = next(readings)

    monkeypatch.setattr(cpu_profile, "controller_s", lambda: current["ctrl"])
    monkeypatch.setattr(cpu_profile, "node_counters", lambda: current["nodes"])
    profile = cpu_profile.Profile()
    step()
    began = profile.start()
    step()
    profile.end("tests/e2e/test_x.py::test_one", began)
    (spent,) = profile.spent
    assert spent.controller_s == pytest.approx(4.5)
    assert spent.nodes_s == pytest.approx(5 + 2 + 3)
    assert spent.cpu_s == pytest.approx(14.5)


def test_the_summary_puts_the_costliest_first_with_the_totals(monkeypatch):
    monkeypatch.setattr(cpu_profile, "CLUSTERS", ("e2e",))
    profile = cpu_profile.Profile()
    assert profile.lines() == []  # nothing measured: nothing printed
    profile.spent = [
        cpu_profile.Spent(f"t{i}", wall_s=10.0, controller_s=float(i), nodes_s=1.0)
        for i in range(cpu_profile.SHOWN + 5)
    ]
    lines = profile.lines()
    total = sum(range(cpu_profile.SHOWN + 5)) + cpu_profile.SHOWN + 5
    assert lines[0].startswith(f"CPU-seconds of {cpu_profile.SHOWN + 5} tests (clusters e2e): ")
    assert f" {total} = controller " in lines[0]
    rows = lines[2:]
    assert len(rows) == cpu_profile.SHOWN
    assert rows[0].split()[-1] == f"t{cpu_profile.SHOWN + 4}" and rows[0].split()[0] == "20.0"
    assert [float(r.split()[0]) for r in rows] == sorted(
        (float(r.split()[0]) for r in rows), reverse=True
    )


def test_a_cluster_taken_down_in_the_teardown_counts_until_the_teardown(monkeypatch):
    monkeypatch.setattr(cpu_profile, "CLUSTERS", ("pipcl",))
    nodes = {"n1": 10.0, "n2": 20.0}
    monkeypatch.setattr(cpu_profile, "controller_s", lambda: 0.0)
    monkeypatch.setattr(cpu_profile, "node_counters", lambda: dict(nodes))
    profile = cpu_profile.Profile()
    began = profile.start()
    nodes.update(n1=40.0, n2=25.0)
    before_teardown = cpu_profile.node_counters()
    nodes.clear()  # local down in the module's teardown
    profile.end("tests/e2e/test_x.py::test_last", began, before_teardown)
    assert profile.spent[0].nodes_s == pytest.approx(30 + 5)

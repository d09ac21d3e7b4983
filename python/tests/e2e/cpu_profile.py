"""Where an end-to-end session's CPU goes, test by test (make test's docker lanes).

make test's lanes share two cores, so a test's wall time says more about the other lanes than
about the test (test_e2e_root_site: 35 s in a cold make test, 14 s alone). Its CPU does not:
the controller's part (this process and every child it waited for: dscluster, Ansible, ssh,
docker's client) from getrusage, and the nodes' part from the cgroup counters of the
containers of the session's own clusters. DSCLUSTER_TEST_CPU names those clusters
(comma-separated; a name also covers the clusters named after it: e2eb covers e2eb-bk);
unset, nothing is measured. The session ends with the tests that took the most, and the
totals: the figures to cut for a shorter make test (issue 16).

A node restarted during a test (docker stop/start) starts its counter again: its part is
then what it used since the start. A container removed in a test's teardown (a module's
cluster taken down after its last test) counts until the teardown began; one removed in the
test itself takes its count along.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import time

from .. import rolefiles

sys.path.insert(0, str(rolefiles.REPO / "scripts"))
from bench_cpu import container_cpu_s, node_containers

CLUSTERS = tuple(c for c in os.environ.get("DSCLUSTER_TEST_CPU", "").split(",") if c)
SHOWN = 15


@dataclasses.dataclass
class Spent:
    test: str
    wall_s: float
    controller_s: float
    nodes_s: float

    @property
    def cpu_s(self) -> float:
        return self.controller_s + self.nodes_s


def ours(cluster: str) -> bool:
    return any(cluster == c or cluster.startswith(c + "-") for c in CLUSTERS)


def node_counters() -> dict[str, float]:
    """Container id -> CPU-seconds, for the running containers of the session's clusters."""
    found = {}
    for cid, _, cluster in node_containers():
        if ours(cluster) and (cpu := container_cpu_s(cid)) is not None:
            found[cid] = cpu
    return found


def controller_s() -> float:
    used = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in used)


class Profile:
    def __init__(self) -> None:
        self.spent: list[Spent] = []

    def start(self) -> tuple[float, float, dict[str, float]]:
        return time.monotonic(), controller_s(), node_counters()

    def end(
        self,
        test: str,
        began: tuple[float, float, dict[str, float]],
        before_teardown: dict[str, float] | None = None,
    ) -> None:
        wall0, ctrl0, nodes0 = began
        now = node_counters()
        # gone in the teardown: what it had used when the teardown began
        last = {**(before_teardown or {}), **now}
        nodes = 0.0
        for cid, cpu in last.items():
            before = nodes0.get(cid, 0.0)
            nodes += cpu - before if cpu >= before else cpu  # restarted: its count since then
        self.spent.append(Spent(test, time.monotonic() - wall0, controller_s() - ctrl0, nodes))

    def lines(self) -> list[str]:
        if not self.spent:
            return []
        top = sorted(self.spent, key=lambda s: s.cpu_s, reverse=True)[:SHOWN]
        ctrl, nodes = sum(s.controller_s for s in self.spent), sum(s.nodes_s for s in self.spent)
        out = [
            f"CPU-seconds of {len(self.spent)} tests (clusters {', '.join(CLUSTERS)}): "
            f"{ctrl + nodes:.0f} = controller {ctrl:.0f} + nodes {nodes:.0f}; the most:",
            f"{'cpu':>7} {'ctrl':>6} {'nodes':>6} {'wall':>6}  test",
        ]
        out += [
            f"{s.cpu_s:7.1f} {s.controller_s:6.1f} {s.nodes_s:6.1f} {s.wall_s:6.1f}  {s.test}"
            for s in top
        ]
        return out

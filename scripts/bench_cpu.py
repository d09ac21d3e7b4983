#!/usr/bin/env python3
"""Where a local provision's CPU goes: the nodes' own work vs the controller's (make bench).

  bench_cpu.py machine             busy CPU-seconds of the whole machine so far (/proc/stat)
  bench_cpu.py split CLUSTER CPU0  JSON: the machine's busy CPU-seconds since the reading
                                   CPU0, the running node containers' of the local cluster
                                   CLUSTER since they started (their cgroups' counters), the
                                   largest node's, and the rest: the controller's
  bench_cpu.py since CPU0 T0       one line for make test's lanes: the machine's busy
                                   CPU-seconds since CPU0 (read at T0, epoch seconds), the
                                   wall time, and that CPU over the cores: the shortest the
                                   lanes could take however they were packed
  bench_cpu.py calibrate           one line: the CPU milliseconds a fixed pure-Python
                                   workload takes here (the best of 5), to compare the
                                   CPU-seconds of runs made on different hours
  bench_cpu.py calibrate-ms        the same figure alone (milliseconds), for make bench's JSON

On this machine the node containers share the controller's cores; on a real cluster each
node's own work (dpkg, the stack install, Ansible's modules) runs on its own CPUs and only
the controller's part (ansible-playbook and its workers, ssh) grows with the node count on
one machine. make bench prints both parts for the 4/8/16-node provisions.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

from dscluster.sources.local import LABEL

CGROUP = pathlib.Path("/sys/fs/cgroup")


def machine_busy_s() -> float:
    """user + nice + system + irq + softirq + steal of every CPU, in seconds."""
    fields = pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def container_cpu_s(cid: str) -> float | None:
    """A container's CPU-seconds from its cgroup: v1 (cpuacct, ns) or v2 (cpu.stat, µs),
    with the cgroupfs or the systemd driver's layout; None where none of them is there."""
    v1 = CGROUP / "cpuacct" / "docker" / cid / "cpuacct.usage"
    if v1.is_file():
        return int(v1.read_text()) / 1e9
    for v2 in (
        CGROUP / "system.slice" / f"docker-{cid}.scope" / "cpu.stat",
        CGROUP / "docker" / cid / "cpu.stat",
    ):
        if v2.is_file():
            for line in v2.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
    return None


def node_containers(cluster: str = "") -> list[tuple[str, str, str]]:
    """(full id, name, cluster) of the running node containers of the local cluster
    `cluster`, or of every local cluster when it is ""; none where docker does not answer
    (a measurement never stops the bench or a test)."""
    try:
        out = subprocess.run(
            ["docker", "ps", "--no-trunc", "--filter",
             f"label={LABEL}={cluster}" if cluster else f"label={LABEL}",
             "--format", f'{{{{.ID}}}} {{{{.Names}}}} {{{{.Label "{LABEL}"}}}}'],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        cid, name, label = [*line.split(maxsplit=2), "", ""][:3]
        if cid and name:
            found.append((cid, name, label))
    return found


def split(cluster: str, cpu0: float) -> dict:
    """Unknown (None) node and controller parts where a node's counter or docker is not
    there: a bench step never stops the bench."""
    machine = machine_busy_s() - cpu0
    per = {name: container_cpu_s(cid) for cid, name, _ in node_containers(cluster)}
    known = [v for v in per.values() if v is not None]
    nodes = round(sum(known), 1) if per and len(known) == len(per) else None
    return {
        "machine_cpu_s": round(machine, 1),
        "nodes_cpu_s": nodes,
        "max_node_cpu_s": round(max(known), 1) if known else None,
        "controller_cpu_s": None if nodes is None else round(machine - nodes, 1),
    }


def since(cpu0: float, t0: float, cores: int | None = None) -> str:
    """The lanes' CPU against their wall time: where the CPU over the cores is close to the
    wall time, only less work (not other packing) makes the suite shorter."""
    busy, wall, cores = machine_busy_s() - cpu0, time.time() - t0, cores or os.cpu_count() or 1
    return (
        f"== lanes: {busy:.0f} CPU-seconds in {wall:.0f} s on {cores} cores "
        f"({busy / max(wall * cores, 1e-9):.0%} busy); that work alone needs {busy / cores:.0f} s"
    )


def workload() -> int:
    """The fixed work calibrate times: dict updates, string formatting, a sort."""
    counts: dict[str, int] = {}
    for i in range(300_000):
        key = f"n{i % 5000}"
        counts[key] = counts.get(key, 0) + i * i
    return len(sorted(counts.items()))


def calibrate_ms(rounds: int = 5) -> int:
    """How fast this hour's cores are: the same work on a VM whose neighbours or clock changed
    takes more CPU, so a run's CPU-seconds alone cannot be compared with another hour's. The
    best of `rounds`, in this process's CPU time. Other processes' load still moves it on a VM
    (shared caches and cores: 79 ms idle, 159 ms right after a loaded bench step, 2026-11-29),
    so read it on a quiet machine: before and after make test's lanes, not during them."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        workload()
        best = min(best, time.process_time() - start)
    return round(best * 1000)


def calibrate(rounds: int = 5) -> str:
    return (
        f"== this machine: a fixed pure-Python workload in {calibrate_ms(rounds)} ms of CPU "
        f"(best of {rounds}); CPU-seconds of runs compare in proportion to it"
    )


def main(argv: list[str]) -> int:
    if argv[1:] == ["machine"]:
        print(round(machine_busy_s(), 2))
    elif argv[1:] == ["calibrate"]:
        print(calibrate())
    elif argv[1:] == ["calibrate-ms"]:
        print(calibrate_ms())
    elif len(argv) == 4 and argv[1] == "since":
        print(since(float(argv[2]), float(argv[3])))
    elif len(argv) == 4 and argv[1] == "split":
        print(json.dumps(split(argv[2], float(argv[3]))))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

#!/usr/bin/env python3
"""Where a local provision's CPU goes: the nodes' own work vs the controller's (make bench).

  bench_cpu.py machine        busy CPU-seconds of the whole machine so far (/proc/stat)
  bench_cpu.py nodes CLUSTER  JSON: CPU-seconds each running node container of the local
                              cluster CLUSTER used since it started (its cgroup's counter)

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

CGROUP = pathlib.Path("/sys/fs/cgroup")
LABEL = "dscluster.cluster"  # python/src/dscluster/sources/local.py


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


def nodes(cluster: str) -> dict:
    out = subprocess.run(
        ["docker", "ps", "--no-trunc", "--filter", f"label={LABEL}={cluster}",
         "--format", "{{.ID}} {{.Names}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    per = {}
    for line in out.splitlines():
        cid, name = line.split()
        per[name] = container_cpu_s(cid)
    known = [v for v in per.values() if v is not None]
    return {
        "nodes": len(per),
        "cpu_s": round(sum(known), 1) if per and len(known) == len(per) else None,
        "max_node_cpu_s": round(max(known), 1) if known else None,
    }


def main(argv: list[str]) -> int:
    if argv[1:] == ["machine"]:
        print(round(machine_busy_s(), 2))
    elif len(argv) == 3 and argv[1] == "nodes":
        print(json.dumps(nodes(argv[2])))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

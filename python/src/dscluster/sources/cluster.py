"""What every inventory source returns (one cluster description) and the one writer.

A source (local, aws, slurm, static) decides the cluster; `write` turns that description
into `inventories/<name>/hosts.yml` (plain YAML a person can edit: group `head` holds one
host, `workers` the others, then any groups the source adds) and the DeepSpeed `hostfile`
(`host slots=N`, head first), both rendered before either is written, each written
atomically; then the cluster's known_hosts where the source learnt host keys.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from ..hostfile import render_hostfile
from ..inventory import write_hosts_yml
from ..util import atomic_write


@dataclasses.dataclass(frozen=True)
class Node:
    name: str  # the inventory host name (names.HOSTNAME_RE)
    slots: int  # hostfile slots (expected; the roles detect the real count)
    vars: dict[str, Any] | None = None  # host vars, in the order they are written


@dataclasses.dataclass(frozen=True)
class Cluster:
    """One cluster as a source describes it, head first."""

    name: str
    nodes: list[Node]  # nodes[0] is the head
    vars: dict[str, Any]  # all.vars, in the order they are written
    header: str  # the comment block on top of hosts.yml
    groups: dict[str, Any] = dataclasses.field(default_factory=dict)  # more children
    hostfile: bool = True  # write a hostfile of the expected slots
    known_hosts: pathlib.Path | None = None  # where the cluster's host keys live
    known_hosts_text: str | None = None  # written there after the inventory, when given

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)

    def data(self) -> dict[str, Any]:
        """The hosts.yml document."""
        head, workers = self.nodes[0], self.nodes[1:]
        return {
            "all": {
                "vars": self.vars,
                "children": {
                    "head": {"hosts": {head.name: head.vars}},
                    "workers": {"hosts": {n.name: n.vars for n in workers}},
                    **self.groups,
                },
            }
        }


@dataclasses.dataclass(frozen=True)
class Written:
    hosts_yml: pathlib.Path
    hostfile: pathlib.Path | None


def write(cluster: Cluster, out: pathlib.Path) -> Written:
    """Render hosts.yml and hostfile, then write both atomically (nothing on any error)."""
    hostfile_text = (
        render_hostfile((n.name, n.slots) for n in cluster.nodes) if cluster.hostfile else None
    )
    data = cluster.data()
    hosts_yml = write_hosts_yml(out, data, cluster.header)
    hostfile = None
    if hostfile_text is not None:
        hostfile = out / "hostfile"
        atomic_write(hostfile, hostfile_text)
    if cluster.known_hosts is not None and cluster.known_hosts_text is not None:
        atomic_write(cluster.known_hosts, cluster.known_hosts_text, mode=0o600)
    return Written(hosts_yml, hostfile)

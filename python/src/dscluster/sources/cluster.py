"""What every inventory source returns (one cluster description) and the one writer.

A source (local, aws, slurm, static) decides the cluster; `write` turns that description
into `inventories/<name>/hosts.yml` (plain YAML a person can edit: group `head` holds one
host, `workers` the others, then any groups the source adds) and the DeepSpeed `hostfile`
(`host slots=N`, head first) and the cluster's known_hosts where the source learnt host
keys: all rendered first, then written as one transaction (util.write_files).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import yaml

from ..hostfile import render_hostfile
from ..util import write_files


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
    out: pathlib.Path | None = None  # the inventory directory the source chose
    found: Any = None  # what the source learnt beyond the inventory, for its command's summary

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


def render_hosts_yml(data: dict[str, Any], header: str) -> str:
    """hosts.yml as inventory.write_hosts_yml writes it: the header, then plain YAML."""
    return header.rstrip() + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def write(cluster: Cluster, out: pathlib.Path | None = None) -> Written:
    """Render hosts.yml, hostfile and known_hosts into `out` (default: cluster.out), then
    write them as one transaction (util.write_files): on any error every file that was there
    is unchanged."""
    out = out if out is not None else cluster.out
    if out is None:
        raise ValueError(f"no inventory directory for cluster {cluster.name}")
    hosts_yml = out / "hosts.yml"
    files: dict[pathlib.Path, str] = {hosts_yml: render_hosts_yml(cluster.data(), cluster.header)}
    modes = {}
    hostfile = None
    if cluster.hostfile:
        hostfile = out / "hostfile"
        files[hostfile] = render_hostfile((n.name, n.slots) for n in cluster.nodes)
    if cluster.known_hosts is not None and cluster.known_hosts_text is not None:
        files[cluster.known_hosts] = cluster.known_hosts_text
        modes[cluster.known_hosts] = 0o600
    write_files(files, modes=modes)
    return Written(hosts_yml, hostfile)

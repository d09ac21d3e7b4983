"""Inventory sources behind one route (as skypilot's sky/provision routes one interface to
per-cloud modules).

`describe(kind, **options)` calls the source's describe function (SOURCES); each decides one
cluster and returns it as a `cluster.Cluster` (name, head first, nodes with their slots and
vars, group vars, extra groups, known_hosts, `out`: the inventory directory, and `found`:
what the source learnt beyond the inventory, for the command's summary). `write`
(cluster.write) is the one writer of `inventories/<name>/hosts.yml` + `hostfile`. Naming
rules: names.py.

    local   local.start                     starts the node containers on this machine
    aws     aws.discover.describe_cluster   running EC2 instances of a cluster; aws/ is laid
                                            out like sky/provision/<cloud>/ (session, config,
                                            discover, instance for `aws up/down`)
    slurm   slurm.describe_allocation       a Slurm allocation or node list
    static  static.describe_hosts           a plain host list

Sources are imported only when called, so that low-level modules (hostfile) can import
names.py without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cluster import Cluster, Written

# kind -> "module:function" under this package; the function returns a cluster.Cluster.
SOURCES = {
    "local": "local:start",
    "aws": "aws.discover:describe_cluster",
    "slurm": "slurm:describe_allocation",
    "static": "static:describe_hosts",
}


def describe(kind: str, **options: Any) -> Cluster:
    """The cluster the source `kind` describes from `options` (its describe function's
    keywords); nothing is written."""
    module, _, function = SOURCES[kind].partition(":")
    described: Cluster = getattr(importlib.import_module(f"{__name__}.{module}"), function)(
        **options
    )
    return described


def write(cluster: Cluster) -> Written:
    """hosts.yml, hostfile and known_hosts of a described cluster, into cluster.out."""
    from .cluster import write as write_cluster  # noqa: PLC0415

    return write_cluster(cluster)

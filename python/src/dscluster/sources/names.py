"""The naming rules every source follows, in one place.

- a host name (inventory host, hostfile line, pdsh list): HOSTNAME_RE;
- a cluster name that becomes Docker objects or an EC2 tag (local, aws): CLUSTER_NAME_RE;
- an inventory name, a directory under inventories/ (static, slurm): INVENTORY_NAME_RE.
"""

from __future__ import annotations

import re

from ..errors import DsclusterError

HOSTNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
CLUSTER_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
INVENTORY_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


def check_cluster_name(name: str) -> None:
    if not CLUSTER_NAME_RE.match(name):
        raise DsclusterError(
            f"cluster name {name!r} is not usable; use lowercase letters, digits and '-', "
            "starting with a letter, at most 31 characters"
        )


def check_inventory_name(name: str) -> None:
    if not INVENTORY_NAME_RE.match(name):
        raise DsclusterError(
            f"inventory name {name!r} is not usable; use lowercase letters, digits, '-' and '_', "
            "starting with a letter"
        )

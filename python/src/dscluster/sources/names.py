"""The naming rules every source follows, in one place.

- a host name (inventory host, hostfile line, pdsh list): HOSTNAME_RE, not a reserved name;
- a cluster name that becomes Docker objects or an EC2 tag (local, aws): CLUSTER_NAME_RE;
- an inventory name, a directory under inventories/ (static, slurm): INVENTORY_NAME_RE.

Every rule is a full-string match (`fullmatch`): a regex `$` also matches before a final
newline, so `re.match('^x$', 'x\\n')` would let a name with a newline through.
"""

from __future__ import annotations

import re

from ..errors import DsclusterError

HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
CLUSTER_NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,30}")
INVENTORY_NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,62}")
# Ansible's own group names and dscluster's groups: a host or an inventory called so would be
# read as the group (`all` in a pdsh list or an Ansible --limit means every host).
RESERVED_NAMES = frozenset({"all", "ungrouped", "head", "workers", "storage", "localhost"})


def _check(name: object, regex: re.Pattern[str], what: str, refusal: str) -> None:
    """One naming rule: a full match of regex, then not a reserved name."""
    if not isinstance(name, str) or not regex.fullmatch(name):
        raise DsclusterError(f"{what} {name!r} {refusal}")
    if name.lower() in RESERVED_NAMES:
        raise DsclusterError(
            f"{what} {name!r} is reserved (an Ansible or dscluster group name); pick another, "
            "e.g. demo"
        )


def check_cluster_name(name: str) -> None:
    _check(
        name,
        CLUSTER_NAME_RE,
        "cluster name",
        "is not usable; use lowercase letters, digits and '-', starting with a letter, at "
        "most 31 characters (e.g. demo)",
    )


def check_inventory_name(name: str) -> None:
    _check(
        name,
        INVENTORY_NAME_RE,
        "inventory name",
        "is not usable; use lowercase letters, digits, '-' and '_', starting with a letter "
        "(e.g. demo)",
    )


def check_host_name(name: str) -> None:
    _check(
        name,
        HOSTNAME_RE,
        "host name",
        "cannot go in a DeepSpeed hostfile or a pdsh list; use letters, digits, '.', '_' or "
        "'-', starting with a letter or digit (keep an address in ansible_host)",
    )

"""`dscluster inventory static`: an inventory from a plain host list you already have.

    dscluster inventory static --hosts gpu-01,gpu-02:4,cpu[1-8] --head gpu-01 --user ubuntu

writes `inventories/<name>/hosts.yml` (plain YAML a person can edit; group `head` holds the
first host or --head, group `workers` the others) and `inventories/<name>/hostfile`
(DeepSpeed's `host slots=N`, head first). A host is `name`, `name:slots` or a Slurm-style
range `node[01-16]` (expanded with python-hostlist); `ansible_host` is the name itself, so
it must resolve from the controller.

The other static route needs no command at all: copy `inventories/sample/` to
`inventories/<name>/`, write the hosts into its `hosts.yml` by hand (head + workers, with
`ansible_host` addresses), and run `make provision INV=<name>`.

Host keys are always checked: ansible_ssh_common_args carries `StrictHostKeyChecking=yes`,
and `--known-hosts FILE` points `UserKnownHostsFile` at a known_hosts you trust for these
machines (your admin's); nothing here scans or trusts keys on first use.

`ClusterSpec` (a host list with slots) and `describe` are shared with the Slurm source.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import hostlist

from ..errors import DsclusterError
from ..hostfile import render_hostfile
from ..paths import inventory_dir
from .cluster import Cluster, Node, write
from .names import check_inventory_name

SLOTS_SUFFIX_RE = re.compile(r"^(?P<hosts>.+):(?P<slots>[0-9]+)$")


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """Everything an inventory source decided, before anything is written."""

    name: str
    source: str  # "static" | "slurm"
    entries: list[tuple[str, int]]  # (host, slots), head first
    all_vars: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Also write dscluster_cpu_slots per host (slots that are not a GPU count).
    cpu_slots: bool = False
    ansible_host: bool = False  # write ansible_host: <name> per host


def check_hosts(entries: Sequence[tuple[str, int]]) -> None:
    """Names usable in a hostfile / pdsh list, each once, each with at least one slot: the
    hostfile's own rules (render_hostfile), applied before anything is written."""
    if not entries:
        raise DsclusterError("the host list is empty; name at least one host")
    render_hostfile(entries)


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: `a[1,3],b` -> [`a[1,3]`, `b`]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise DsclusterError(f"host list {text!r} has an unmatched ']'; fix the brackets")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise DsclusterError(f"host list {text!r} has an unclosed '['; fix the brackets")
    parts.append(text[start:])
    return [p.strip() for p in parts]


def expand(pattern: str) -> list[str]:
    """One host or range (`node[01-04]`), expanded by python-hostlist, duplicates kept."""
    try:
        return list(hostlist.expand_hostlist(pattern, allow_duplicates=True))
    except hostlist.BadHostlist as exc:
        raise DsclusterError(
            f"cannot expand host list {pattern!r} ({exc}); write hosts as name, name:slots or "
            "prefix[01-16]"
        ) from exc


def parse_hosts(text: str, default_slots: int = 1) -> list[tuple[str, int]]:
    """`a,b:4,node[1-3]:2` -> [(a, default), (b, 4), (node1, 2), ...]; validated."""
    if default_slots < 1:
        raise DsclusterError(f"--slots {default_slots} is out of range; use 1 or more")
    entries: list[tuple[str, int]] = []
    for part in split_top_level(text or ""):
        if not part:
            raise DsclusterError(
                f"host list {text!r} has an empty entry; separate hosts with single commas"
            )
        pattern, slots = part, default_slots
        if m := SLOTS_SUFFIX_RE.match(part):
            pattern, slots = m["hosts"], int(m["slots"])
        entries.extend((host, slots) for host in expand(pattern))
    check_hosts(entries)
    return entries


def order_head(entries: list[tuple[str, int]], head: str | None) -> list[tuple[str, int]]:
    """Put --head first (the others keep their order); default: the first host."""
    if head is None:
        return entries
    hosts = [h for h, _ in entries]
    if head not in hosts:
        raise DsclusterError(
            f"--head {head} is not in the host list ({_short(hosts)}); pass one of the listed hosts"
        )
    i = hosts.index(head)
    return [entries[i], *entries[:i], *entries[i + 1 :]]


def _short(hosts: Sequence[str]) -> str:
    return hostlist.collect_hostlist(list(hosts)) if len(hosts) > 3 else ", ".join(hosts)


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """How Ansible logs in: --user, --key-file, --known-hosts."""

    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None

    def vars(self) -> dict[str, Any]:
        return ssh_vars(self.user, self.key_file, self.known_hosts)


def ssh_vars(
    user: str | None = None, key_file: str | None = None, known_hosts: str | None = None
) -> dict[str, Any]:
    """Connection variables: host key checking always on, known_hosts where given."""
    result: dict[str, Any] = {}
    if user:
        result["ansible_user"] = user
    if key_file:
        result["ansible_ssh_private_key_file"] = str(pathlib.Path(key_file).expanduser())
    args = "-o StrictHostKeyChecking=yes"
    if known_hosts:
        path = pathlib.Path(known_hosts).expanduser()
        if not path.is_file():
            raise DsclusterError(
                f"--known-hosts {known_hosts} is not a file; point it at a known_hosts that "
                "holds these machines' host keys"
            )
        args = f"-o UserKnownHostsFile={path.resolve()} {args}"
    result["ansible_ssh_common_args"] = args
    return result


def describe(spec: ClusterSpec, header: str = "") -> Cluster:
    """The cluster description: all.vars, head (one host), workers (the rest)."""

    def host_vars(host: str, slots: int) -> dict[str, Any]:
        hv: dict[str, Any] = {}
        if spec.ansible_host:
            hv["ansible_host"] = host
        hv["dscluster_expected_slots"] = slots
        if spec.cpu_slots:
            hv["dscluster_cpu_slots"] = slots
        return hv

    check_hosts(spec.entries)
    return Cluster(
        name=spec.name,
        nodes=[Node(h, s, host_vars(h, s)) for h, s in spec.entries],
        vars={
            "dscluster_cluster_name": spec.name,
            "dscluster_source": spec.source,
            **spec.all_vars,
        },
        header=header,
    )


def inventory_data(spec: ClusterSpec) -> dict[str, Any]:
    """The hosts.yml mapping: all.vars, head (one host), workers (the rest)."""
    return describe(spec).data()


def default_out(name: str) -> pathlib.Path:
    return inventory_dir(name)


def write_inventory(
    hosts: str,
    *,
    head: str | None,
    slots: int,
    name: str,
    out: pathlib.Path | None,
    ssh: SshOptions,
) -> tuple[pathlib.Path, pathlib.Path, list[tuple[str, int]]]:
    """`dscluster inventory static`: (hosts.yml, hostfile, [(host, slots)], head first)."""
    check_inventory_name(name)
    entries = order_head(parse_hosts(hosts, slots), head)
    spec = ClusterSpec(
        name=name,
        source="static",
        entries=entries,
        all_vars=ssh.vars(),
        cpu_slots=True,
        ansible_host=True,
    )
    target = out or default_out(name)
    header = (
        "---\n"
        f"# Written by `dscluster inventory static --hosts {hosts}`: {len(entries)} hosts,\n"
        f"# head {entries[0][0]}. Edit freely; inventories/sample/ documents every variable.\n"
        "# Host keys are checked (StrictHostKeyChecking=yes): the controller's known_hosts (or\n"
        "# --known-hosts FILE) must already hold them.\n"
    )
    written = write(describe(spec, header), target)
    assert written.hostfile is not None
    return written.hosts_yml, written.hostfile, entries

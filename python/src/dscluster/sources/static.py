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

`describe_hosts` is this source in sources.describe; `ClusterSpec` (a host list with slots)
and `describe` are shared with the Slurm source.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import hostlist

from ..errors import DsclusterError
from ..hostfile import IPV6_RULE, SLOTS_RULE, render_hostfile
from ..paths import inventory_dir
from ..text import show
from ..validate import MAX_NODES, MAX_SLOTS, check_out_dir
from .cluster import Cluster, Node
from .names import check_host_name, check_inventory_name

# What a bracket of a host or node list may hold: numbers and low-high ranges, comma-separated.
RANGE_ITEM_RE = re.compile(r"(?P<lo>[0-9]+)(?:-(?P<hi>[0-9]+))?")
NAME_CHARS_RE = re.compile(r"[A-Za-z0-9._-]*")


def _form(what: str) -> str:
    if what == "node list":
        return "Slurm's form, e.g. gpu-[001-004,010],cpu7"
    return "name, name:slots or prefix[01-16]"


PATTERN_RE = re.compile(r"(?:[^\[\]]*\[[^\[\]]*\])*[^\[\]]*")
MAX_DIGITS = 18  # in one number of a range: more is no host name


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
    """Names usable in a hostfile / pdsh list (not reserved), each once, each with 1..1024
    slots: the hostfile's own rules (render_hostfile), applied before anything is written."""
    if not entries:
        raise DsclusterError("the host list is empty; name at least one host")
    render_hostfile(entries)
    for host, _ in entries:
        check_host_name(host)


def check_one_line(text: object, what: str) -> str:
    """A host or node list must be one line of printable text."""
    if not isinstance(text, str) or not text.strip():
        raise DsclusterError(f"the {what} is empty; name at least one host, e.g. a,b:4,node[01-16]")
    if not text.isprintable():
        raise DsclusterError(
            f"{what} {show(text)} is not one line (a newline or control character); give "
            "hosts comma-separated on one line, e.g. a,b:4,node[01-16]"
        )
    return text


def split_top_level(text: str, what: str = "host list") -> list[str]:
    """Split on commas outside brackets: `a[1,3],b` -> [`a[1,3]`, `b`]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise DsclusterError(
                    f"cannot expand {what} {show(text)}: it has a '[' inside brackets; write "
                    "ranges as prefix[01-16] or prefix[1,3,5-8]"
                )
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise DsclusterError(
                    f"cannot expand {what} {show(text)}: it has an unmatched ']'; fix the "
                    f"brackets ({_form(what)})"
                )
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise DsclusterError(
            f"cannot expand {what} {show(text)}: it has an unclosed '['; fix the brackets "
            f"({_form(what)})"
        )
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _bracket_size(pattern: str, body: str, what: str) -> int:
    size = 0
    for item in body.split(","):
        m = RANGE_ITEM_RE.fullmatch(item)
        if not m:
            raise DsclusterError(
                f"cannot expand {what} {show(pattern)} (bad range [{body}]); write ranges as "
                "prefix[01-16] or prefix[1,3,5-8]"
            )
        if max(len(m["lo"]), len(m["hi"] or "")) > MAX_DIGITS:
            raise DsclusterError(
                f"cannot expand {what} {show(pattern)} (a number in [{body}] has more than "
                f"{MAX_DIGITS} digits); write ranges as prefix[01-16]"
            )
        lo, hi = int(m["lo"]), int(m["hi"] or m["lo"])
        if hi < lo:
            raise DsclusterError(
                f"cannot expand {what} {show(pattern)} (range {item} runs backwards); write it "
                f"low-high, e.g. [{m['hi']}-{m['lo']}]"
            )
        size += hi - lo + 1
    return size


def pattern_size(pattern: str, what: str = "host list") -> int:
    """How many names `prefix[1-3,7]mid[01-02]` stands for, without expanding it; refused
    when it is not that form (names of [A-Za-z0-9._-], brackets of numbers and ranges)."""
    if not PATTERN_RE.fullmatch(pattern):
        raise DsclusterError(
            f"cannot expand {what} {show(pattern)} (unbalanced or nested brackets); write hosts "
            f"as {_form(what)}"
        )
    size = 1
    for i, piece in enumerate(re.split(r"[\[\]]", pattern)):
        if i % 2 == 0:
            if not NAME_CHARS_RE.fullmatch(piece):
                raise DsclusterError(
                    f"host name {show(pattern)} cannot go in a DeepSpeed hostfile or a pdsh "
                    "list; use letters, digits, '.', '_' or '-' (keep an address in ansible_host)"
                )
        else:
            size *= _bracket_size(pattern, piece, what)
        size = min(size, MAX_NODES + 1)
    return size


def expand_list(parts: Sequence[str], text: str, what: str = "host list") -> list[list[str]]:
    """Each pattern expanded (python-hostlist), duplicates kept; refused before expanding
    when the whole list names more than MAX_NODES hosts."""
    if sum(pattern_size(p, what) for p in parts) > MAX_NODES:
        raise DsclusterError(
            f"{what} {show(text)} names more than {MAX_NODES} hosts, the most one inventory "
            "holds; list fewer hosts"
        )
    return [expand(p, what) for p in parts]


def expand(pattern: str, what: str = "host list") -> list[str]:
    """One host or range (`node[01-04]`), expanded by python-hostlist, duplicates kept."""
    pattern_size(pattern, what)
    try:
        return list(hostlist.expand_hostlist(pattern, allow_duplicates=True))
    except hostlist.BadHostlist as exc:
        raise DsclusterError(
            f"cannot expand {what} {show(pattern)} ({exc}); write hosts as {_form(what)}"
        ) from exc


def split_slots(part: str, default_slots: int) -> tuple[str, int]:
    """`name:4` -> (name, 4); `name` -> (name, default). IPv6 literals refused."""
    if part.count(":") >= 2 or (part.startswith("[") and ":" in part):
        raise DsclusterError(f"{show(part)} is an IPv6 literal; {IPV6_RULE}")
    pattern, sep, slots_text = part.rpartition(":")
    if not sep:
        return part, default_slots
    if not re.fullmatch(r"[0-9]{1,5}", slots_text) or not 1 <= int(slots_text) <= MAX_SLOTS:
        raise DsclusterError(
            f"host list entry {show(part)} has slots={slots_text}; {SLOTS_RULE}, "
            f"e.g. {pattern or 'gpu-01'}:4"
        )
    if not pattern:
        raise DsclusterError(f"host list entry {show(part)} has no host name; write name:slots")
    return pattern, int(slots_text)


def parse_hosts(text: str, default_slots: int = 1) -> list[tuple[str, int]]:
    """`a,b:4,node[1-3]:2` -> [(a, default), (b, 4), (node1, 2), ...]; validated."""
    if not isinstance(default_slots, int) or not 1 <= default_slots <= MAX_SLOTS:
        raise DsclusterError(
            f"--slots {default_slots} is out of range; use 1 or more (at most {MAX_SLOTS})"
        )
    if text == "":
        raise DsclusterError(f"host list {text!r} has an empty entry; name at least one host")
    check_one_line(text, "host list")
    patterns: list[str] = []
    slots: list[int] = []
    for part in split_top_level(text):
        if not part:
            raise DsclusterError(
                f"host list {show(text)} has an empty entry; separate hosts with single commas"
            )
        pattern, count = split_slots(part, default_slots)
        patterns.append(pattern)
        slots.append(count)
    entries = [
        (host, count)
        for hosts, count in zip(expand_list(patterns, text), slots, strict=True)
        for host in hosts
    ]
    check_hosts(entries)
    return entries


def order_head(entries: list[tuple[str, int]], head: str | None) -> list[tuple[str, int]]:
    """Put --head first (the others keep their order); default: the first host."""
    if head is None:
        return entries
    hosts = [h for h, _ in entries]
    if head not in hosts:
        head = head if head.isprintable() else show(head)
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


USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def _existing_file(text: str, flag: str, what: str) -> pathlib.Path:
    if not text.strip() or not text.isprintable():
        raise DsclusterError(f"{flag} {show(text)} is not a path; give the {what} file")
    path = pathlib.Path(text).expanduser()
    if not path.is_file():
        raise DsclusterError(f"{flag} {text} is not a file; point it at the {what} (it must exist)")
    return path


def ssh_vars(
    user: str | None = None, key_file: str | None = None, known_hosts: str | None = None
) -> dict[str, Any]:
    """Connection variables: host key checking always on, known_hosts where given; the
    user a plain login name, the key and known_hosts files that exist."""
    result: dict[str, Any] = {}
    if user is not None:
        if not USER_RE.fullmatch(user):
            raise DsclusterError(
                f"--user {show(user)} is not a login name; use letters, digits, '_', '.' or "
                "'-', starting with a letter or '_' (e.g. ubuntu)"
            )
        result["ansible_user"] = user
    if key_file is not None:
        path = _existing_file(key_file, "--key-file", "SSH private key")
        result["ansible_ssh_private_key_file"] = str(path)
    args = "-o StrictHostKeyChecking=yes"
    if known_hosts is not None:
        path = _existing_file(
            known_hosts, "--known-hosts", "known_hosts that holds these machines' host keys"
        )
        if " " in str(path.resolve()):
            raise DsclusterError(
                f"--known-hosts {known_hosts}: the path has a space, which ssh's "
                "UserKnownHostsFile splits; move the file to a path without spaces"
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


def describe_hosts(
    hosts: str,
    *,
    head: str | None,
    slots: int,
    name: str,
    out: pathlib.Path | None,
    ssh: SshOptions,
) -> Cluster:
    """This source in the route (sources.describe): the host list as a Cluster for
    inventories/<name> (or `out`), with found = [(host, slots)], head first."""
    check_inventory_name(name)
    entries = order_head(parse_hosts(hosts, slots), head)
    target = check_out_dir(out or default_out(name))
    spec = ClusterSpec(
        name=name,
        source="static",
        entries=entries,
        all_vars=ssh.vars(),
        cpu_slots=True,
        ansible_host=True,
    )
    header = (
        "---\n"
        f"# Written by `dscluster inventory static --hosts {hosts}`: {len(entries)} hosts,\n"
        f"# head {entries[0][0]}. Edit freely; inventories/sample/ documents every variable.\n"
        "# Host keys are checked (StrictHostKeyChecking=yes): the controller's known_hosts (or\n"
        "# --known-hosts FILE) must already hold them.\n"
    )
    return dataclasses.replace(describe(spec, header), out=target, found=entries)

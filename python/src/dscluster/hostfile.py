"""The DeepSpeed hostfile: `host slots=N` lines, rendered and read as DeepSpeed does.

Rules come from DeepSpeed's launcher: hostfile lines must match `^(\\S+)\\s+slots=(\\d+)`,
duplicates are refused and the first host is the master. The host-name and slots rules here
are also the ones the inventory sources (sources/static.py, sources/slurm.py) apply.
launch_files.py derives the hostfile of an inventory from its recorded facts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .errors import DsclusterError
from .sources.names import HOSTNAME_RE
from .text import readlines, show
from .validate import MAX_NODES, MAX_SLOTS

# One line of a hostfile as dscluster accepts it: DeepSpeed's `^(\S+)\s+slots=(\d+)` with
# nothing after the count (DeepSpeed would silently read `slots=2x` as 2).
HOSTFILE_LINE_RE = re.compile(r"(?P<host>\S+)\s+slots=(?P<slots>[0-9]+)")
SLOTS_RULE = f"slots must be a whole number 1-{MAX_SLOTS}"
IPV6_RULE = (
    "IPv6 literals cannot go in a hostfile; name the host and put the address in ansible_host"
)


def host_name_problem(host: object) -> str | None:
    """Why `host` cannot be a hostfile / pdsh host name, or None when it can."""
    if isinstance(host, str) and host.count(":") >= 2:
        return f"{show(host)} is an IPv6 literal; {IPV6_RULE}"
    if not isinstance(host, str) or not HOSTNAME_RE.fullmatch(host):
        return (
            f"host name {show(host)} cannot go in a DeepSpeed hostfile or a pdsh -w list; "
            "rename it in the inventory (letters, digits, '.', '_', '-', starting with a "
            "letter or digit)"
        )
    return None


def check_slots(host: str, slots: object) -> int:
    """Slots of one host: a whole number 1..MAX_SLOTS (validate.MAX_SLOTS)."""
    if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_SLOTS:
        raise DsclusterError(
            f"host {host} has slots={slots}; {SLOTS_RULE} (set dscluster_cpu_slots 1-"
            f"{MAX_SLOTS} for CPU nodes, or check its accelerators)"
        )
    return slots


def render_hostfile(entries: Iterable[tuple[str, int]]) -> str:
    """`host slots=N` lines, in the given order (head first); validated: every line
    matches DeepSpeed's `^(\\S+)\\s+slots=(\\d+)`, no host twice, slots 1..MAX_SLOTS."""
    entries = list(entries)
    if not entries:
        raise DsclusterError("the cluster has no hosts; add hosts to the inventory")
    if len(entries) > MAX_NODES:
        raise DsclusterError(
            f"the cluster has {len(entries)} hosts; at most {MAX_NODES} fit one hostfile"
        )
    seen: set[str] = set()
    lines = []
    for host, slots in entries:
        if problem := host_name_problem(host):
            raise DsclusterError(problem)
        if host in seen:
            raise DsclusterError(
                f"host {host} appears twice; list every host once in the inventory"
            )
        check_slots(host, slots)
        seen.add(host)
        lines.append(f"{host} slots={slots}")
    return "\n".join(lines) + "\n"


def parse_hostfile(text: str, source: str) -> list[tuple[str, int]]:
    """A hostfile (perhaps edited by hand) as DeepSpeed reads it: `host slots=N` per line,
    blank lines and `#` comments skipped; anything DeepSpeed would refuse, or read other
    than it looks (`slots=2x`), is refused with the file and line."""
    fix = "write it as 'host slots=N' or rewrite it with 'dscluster hostfile'"
    entries: list[tuple[str, int]] = []
    seen: set[str] = set()
    for number, raw in enumerate(readlines(text), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        m = HOSTFILE_LINE_RE.fullmatch(line)
        if not m:
            raise DsclusterError(
                f"{where}: {show(line)} is not 'host slots=N' ({SLOTS_RULE}); {fix}"
            )
        host, digits = m["host"], m["slots"].lstrip("0") or "0"
        slots = int(digits) if len(digits) <= len(str(MAX_SLOTS)) else MAX_SLOTS + 1
        if problem := host_name_problem(host):
            raise DsclusterError(f"{where}: {problem}")
        if not 1 <= slots <= MAX_SLOTS:
            raise DsclusterError(f"{where}: {show(line)}: {SLOTS_RULE}; {fix}")
        if host in seen:
            raise DsclusterError(f"{where}: host {host} appears twice; list it once")
        seen.add(host)
        entries.append((host, slots))
    if not entries:
        raise DsclusterError(f"{source} lists no hosts; {fix}")
    return entries

"""`dscluster provision`: run a playbook over the inventory, then write the launch files.

A node that fails or cannot be reached does not stop the others: the playbooks leave it
behind and go on. The run then ends non-zero naming that node, and the hostfile and
`.deepspeed_env` stay exactly as they were, unless `--allow-degraded`: then they are written
without the failed nodes, a warning names them, and `inventories/<name>/degraded.json`
keeps them out of later hostfiles (hostfile, smoke, launch) until a provision succeeds on them.
"""

from __future__ import annotations

import fnmatch
import functools
import pathlib
import re
from collections.abc import Iterator
from typing import Any

import yaml
from rich.console import Console

from . import paths
from .errors import DsclusterError
from .inventory import Inventory
from .util import print_warnings

# The playbook that provisions a node completely: only a run of it without --tags that
# succeeds on a node takes that node out of the degraded record.
FULL_PLAYBOOK = "site.yml"


PLAYBOOK_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\.ya?ml")
# Tags Ansible itself gives meaning to.
SPECIAL_TAGS = frozenset({"all", "always", "never", "tagged", "untagged"})


def playbooks() -> list[str]:
    return sorted(p.name for p in (paths.collection_root() / "playbooks").glob("*.y*ml"))


def check_playbook(name: str) -> None:
    """--playbook: the name of one of the collection's playbooks, nothing else."""
    known = playbooks()
    if not PLAYBOOK_NAME_RE.fullmatch(name) or name not in known:
        raise DsclusterError(
            f"--playbook {name!r} is not one of the collection's playbooks; use one of "
            f"{', '.join(known)} (run your own playbook with ansible-playbook)"
        )


def _tags_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "tags":
                values = [value] if isinstance(value, str) else value
                for tag in values if isinstance(values, list) else []:
                    yield from (t.strip() for t in str(tag).split(","))
            else:
                yield from _tags_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from _tags_in(item)


@functools.cache
def known_tags() -> frozenset[str]:
    """Every tag written in the collection's playbooks and role tasks."""
    root = paths.collection_root()
    tags: set[str] = set()
    files = [*root.glob("playbooks/*.y*ml"), *root.glob("roles/*/tasks/*.y*ml")]
    for path in files:
        try:
            tags.update(_tags_in(yaml.safe_load(path.read_text(encoding="utf-8"))))
        except (OSError, yaml.YAMLError):
            continue
    return frozenset(t for t in tags if t and "{{" not in t)


def check_tags(text: str) -> None:
    """--tags: each tag one the playbooks know (a typo would run nothing, successfully)."""
    tags = [t.strip() for t in text.split(",")]
    known = known_tags()
    for tag in tags:
        if not tag:
            raise DsclusterError(
                f"--tags {text!r} has an empty tag; give tags separated by commas, e.g. "
                "--tags base,pdsh"
            )
        if tag not in known and tag not in SPECIAL_TAGS:
            raise DsclusterError(
                f"--tags {tag!r} is no tag of the playbooks; use one or more of "
                f"{', '.join(sorted(known))} (comma-separated)"
            )


def _matches(word: str, names: set[str]) -> bool:
    """Whether one word of an Ansible host pattern names something in the inventory."""
    if word.startswith("~"):
        try:
            regex = re.compile(word[1:])
        except re.error:
            return False
        return any(regex.search(n) for n in names)
    if "[" in word:  # group[0:2]: the group must exist; Ansible checks the slice
        return word.split("[", 1)[0] in names
    return any(fnmatch.fnmatchcase(n, word) for n in names)


def check_limit(pattern: str, inv: Inventory) -> None:
    """--limit: every host or group name, wildcard or regex in the pattern matches something
    in the inventory (Ansible would otherwise run on nothing, or on the wrong hosts)."""
    if not pattern.strip() or "\n" in pattern:
        raise DsclusterError(f"--limit {pattern!r} is empty; give hosts or groups, e.g. n1,n2")
    names = set(inv.groups.get("all", [])) | set(inv.groups)
    words = pattern.split(",") if "," in pattern else re.split(r":(?![^\[]*\])", pattern)
    for raw in words:
        word = raw.strip().lstrip("!&")
        if not word or word.startswith("@"):
            continue  # a retry file: Ansible reads it
        if not _matches(word, names):
            hosts = ", ".join(inv.hosts)
            raise DsclusterError(
                f"--limit {word!r} matches no host or group of {inv.source}; use one of {hosts} "
                f"or a group ({', '.join(sorted(g for g in inv.groups if g != 'ungrouped'))})"
            )


def failed_nodes(result, hosts: list[str]) -> dict[str, str]:
    """Inventory host -> why, for every host the run failed on or could not reach."""
    why: dict[str, str] = {}
    for host, task, msg in result.failures:
        if host in hosts and host not in why:
            unreachable = result.hosts.get(host) and result.hosts[host].unreachable
            kind = "unreachable" if unreachable else "failed"
            why[host] = f"{kind} at '{task}': {msg[:160]}"
    for host in result.failed_hosts:
        if host in hosts:
            why.setdefault(host, "failed")
    return why


def succeeded_nodes(
    playbook: str, tags: str | None, result, hosts: list[str], failed: dict[str, str]
) -> list[str]:
    """Hosts a full run (site.yml, no --tags) reached and finished without a failure."""
    if playbook != FULL_PLAYBOOK or tags:
        return []
    return [
        h
        for h in hosts
        if h not in failed and h in result.hosts and (result.hosts[h].ok or result.hosts[h].changed)
    ]


def provision(
    inventory: str | pathlib.Path | Inventory,
    *,
    playbook: str = FULL_PLAYBOOK,
    limit: str | None = None,
    tags: str | None = None,
    timeout: int | None = None,
    allow_degraded: bool = False,
    out: Console,
    err: Console,
) -> int:
    """Run `playbook`, then write the launch files (see the module docstring); the exit code."""
    from .hostfile import (  # noqa: PLC0415
        check_degraded,
        read_degraded,
        update_degraded,
        utc_now,
        write_degraded,
        write_launch_files,
    )
    from .inventory import load  # noqa: PLC0415
    from .runner import raise_for_failures, run_playbook, summary_table  # noqa: PLC0415

    inv = inventory if isinstance(inventory, Inventory) else load(inventory)
    hosts = inv.hosts
    previous = read_degraded(inv)
    result = run_playbook(playbook, inv, limit=limit, tags=tags, timeout=timeout, console=err)
    out.print(summary_table(result, f"{playbook} on {len(hosts)} hosts"))
    failed = failed_nodes(result, hosts)
    # A failure no host owns (a timeout, a broken playbook) cannot be degraded around.
    unowned = [f for f in result.failures if f[0] not in hosts]
    what = f"provisioning ({playbook})"
    if failed and allow_degraded and not unowned:
        record = update_degraded(
            previous,
            failed=failed,
            succeeded=succeeded_nodes(playbook, tags, result, hosts, failed),
            now=utc_now(),
        )
        check_degraded(hosts, inv.head, record)
        files = write_launch_files(inv, excluded=record)
        write_degraded(inv, record)
        out.print(
            f"provisioned {len(hosts) - len(failed)} of {len(hosts)} hosts, "
            f"{result.changed_total} changes"
        )
        _say_written(out, files)
        print_warnings(err, files.warnings)
        return 0
    if failed or result.rc != 0:
        try:
            raise_for_failures(result, what)
        except DsclusterError as exc:
            raise DsclusterError(
                f"{exc}; hostfile and .deepspeed_env left unchanged (fix the node(s) and run "
                "again, or pass --allow-degraded to go on without failed nodes)"
            ) from None
    out.print(f"provisioned {len(hosts)} hosts, {result.changed_total} changes")
    record = update_degraded(
        previous,
        failed={},
        succeeded=succeeded_nodes(playbook, tags, result, hosts, {}),
        now=utc_now(),
    )
    try:
        files = write_launch_files(inv, excluded=record)
    except DsclusterError as exc:
        if playbook == FULL_PLAYBOOK and not tags and not limit:
            raise
        # A partial run (one playbook, some tags or hosts) may not have recorded facts yet.
        print_warnings(err, [f"hostfile and .deepspeed_env not rewritten: {exc}"])
        return 0
    write_degraded(inv, record)
    back = [h for h in previous if h not in record]
    if back:
        out.print(f"degraded record cleared: {', '.join(back)} back in the hostfile")
    _say_written(out, files)
    print_warnings(err, files.warnings)
    return 0


def _say_written(out: Console, files) -> None:
    out.print(
        f"wrote {files.hostfile} ({files.world_size} slots on {len(files.facts)} hosts)",
        markup=False,
        highlight=False,
    )
    out.print(f"wrote {files.env_file}", markup=False, highlight=False)

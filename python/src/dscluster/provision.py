"""`dscluster provision`: run a playbook over the inventory, then write the launch files.

A node that fails or cannot be reached does not stop the others: the playbooks leave it
behind and go on. The run then ends non-zero naming that node, and the hostfile and
`.deepspeed_env` stay exactly as they were, unless `--allow-degraded`: then they are written
without the failed nodes, a warning names them, and `inventories/<name>/degraded.json`
keeps them out of later hostfiles (hostfile, smoke, launch) until a provision succeeds on them.

`--add HOST[,HOST...]` grows the cluster by those nodes, or repairs them (a node re-created
under its old name): the new nodes get the whole site.yml, the others only the tasks tagged
`cluster_files` (the files whose content depends on the set of hosts: /etc/hosts,
known_hosts, the NFS exports, slurm.conf). See `add_plan` for the runs and their order.
"""

from __future__ import annotations

import dataclasses
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
# The tag of every task that writes a file whose content depends on the set of hosts
# (and of the tasks that read what those files need from every host).
CLUSTER_FILES_TAG = "cluster_files"


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


def check_add(text: str, inv: Inventory, *, playbook: str, limit: str | None, tags: str | None):
    """--add: inventory hosts (names, not patterns), not the head, alone with site.yml; the
    hosts to add, in inventory order."""
    if limit is not None or tags is not None:
        flag = "--limit" if limit is not None else "--tags"
        raise DsclusterError(
            f"--add cannot be combined with {flag}: --add picks the hosts and tags itself (the "
            "whole site.yml on the added hosts, the cluster_files tag on the others); drop "
            f"{flag}"
        )
    if playbook != FULL_PLAYBOOK:
        raise DsclusterError(
            f"--add runs {FULL_PLAYBOOK}, not --playbook {playbook!r}: a node is added by the "
            f"whole site; drop --playbook"
        )
    names = [n.strip() for n in text.split(",")]
    if not text.strip() or not all(names):
        raise DsclusterError(
            f"--add {text!r} has an empty host name; give inventory hosts separated by commas, "
            "e.g. --add n3,n4"
        )
    hosts = inv.hosts
    for name in names:
        if name not in hosts:
            raise DsclusterError(
                f"--add {name!r} is no host of {inv.source}; add it to the inventory first "
                f"(dscluster local up --nodes N, or hosts.yml), then use one of {', '.join(hosts)}"
            )
    if inv.head in names:
        raise DsclusterError(
            f"--add {inv.head!r} is the head: every node depends on it (NFS server, Slurm "
            "controller, launch files), so it cannot be added alone; run dscluster provision "
            "without --add to converge the whole cluster"
        )
    return [h for h in hosts if h in names]


@dataclasses.dataclass(frozen=True)
class Run:
    """One ansible-playbook run of a provision."""

    playbook: str
    limit: str | None = None
    tags: str | None = None
    extravars: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Hosts this run leaves fully provisioned when it succeeds on them ([] = none; None = every
    # host it reached: a whole site.yml without tags).
    provisions: tuple[str, ...] | None = ()

    def title(self) -> str:
        words = [self.playbook]
        words += [f"--tags {self.tags}"] if self.tags else []
        words += [f"--limit {self.limit}"] if self.limit else []
        words += [f"-e {k}={v!r}" for k, v in sorted(self.extravars.items())]
        return " ".join(words)


def normal_plan(playbook: str, limit: str | None, tags: str | None) -> list[Run]:
    """A provision without --add: the one run asked for."""
    full = playbook == FULL_PLAYBOOK and not tags
    return [Run(playbook, limit, tags, provisions=None if full else ())]


def slurm_enabled(inv: Inventory) -> bool:
    """dscluster_slurm (a boolean: the inventory rules refuse anything else)."""
    return inv.var(inv.head, "dscluster_slurm", False) is True


def add_plan(inv: Inventory, new: list[str]) -> list[Run]:
    """The runs of `provision --add`, in order:

    1. site.yml --tags cluster_files on every host: the nodes already there learn the new
       ones (their address in /etc/hosts, their host key in known_hosts, an export to them).
       Every host is in the play so every host's facts are gathered; on the new ones these
       tasks write what the full run writes anyway. Slurm is held back
       (dscluster_slurm=false): slurm.conf needs the new nodes' recorded facts.
    2. site.yml --limit NEW: the new nodes completely. Its checks reach the old nodes (pdsh
       from the head, the NFS mount), which know the new ones since run 1.
    3. only with dscluster_slurm: slurm.yml on every host (its checks need the whole
       cluster in the play): slurm.conf rewritten everywhere, Slurm installed on the new.
    """
    if set(new) >= set(inv.hosts):
        return normal_plan(FULL_PLAYBOOK, None, None)
    slurm = slurm_enabled(inv)
    hold = {"dscluster_slurm": False} if slurm else {}
    runs = [
        Run(FULL_PLAYBOOK, tags=CLUSTER_FILES_TAG, extravars=hold),
        Run(FULL_PLAYBOOK, limit=",".join(new), extravars=hold, provisions=tuple(new)),
    ]
    if slurm:
        runs.append(Run("slurm.yml"))
    return runs


def merge_results(results: list):
    """One PlaybookResult for several runs: per-host counts summed, failures in order."""
    from .runner import HostSummary, PlaybookResult  # noqa: PLC0415

    hosts: dict[str, HostSummary] = {}
    for result in results:
        for host, s in result.hosts.items():
            total = hosts.setdefault(host, HostSummary())
            for field in dataclasses.fields(HostSummary):
                setattr(total, field.name, getattr(total, field.name) + getattr(s, field.name))
    bad = [r for r in results if r.rc != 0]
    return PlaybookResult(
        status=bad[0].status if bad else "successful",
        rc=bad[0].rc if bad else 0,
        hosts=hosts,
        failures=[f for r in results for f in r.failures],
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
    plan: list[Run], results: list, hosts: list[str], failed: dict[str, str]
) -> list[str]:
    """Hosts a run that provisions them (whole site.yml) reached and finished without a
    failure in any run of the plan."""
    done: list[str] = []
    for run, result in zip(plan, results, strict=False):
        wanted = hosts if run.provisions is None else run.provisions
        done += [
            h
            for h in wanted
            if h not in failed
            and h not in done
            and h in result.hosts
            and (result.hosts[h].ok or result.hosts[h].changed)
        ]
    return [h for h in hosts if h in done]


def run_plan(
    plan: list[Run], inv: Inventory, *, allow_degraded: bool, timeout: int | None, out, err
) -> list:
    """Each run in turn, its summary printed; stops after a failed run, unless
    --allow-degraded and every failure is a host's: then the next runs leave those out."""
    from .runner import run_playbook, summary_table  # noqa: PLC0415

    results: list = []
    failed: set[str] = set()
    for run in plan:
        limit = run.limit
        if failed:
            left = [h for h in (limit.split(",") if limit else inv.hosts) if h not in failed]
            if not left:
                break
            limit = ",".join(left)
        result = run_playbook(
            run.playbook,
            inv,
            extravars=run.extravars or None,
            limit=limit,
            tags=run.tags,
            timeout=timeout,
            console=err,
        )
        results.append(result)
        title = run.title() if len(plan) > 1 else run.playbook
        out.print(summary_table(result, f"{title} on {len(inv.hosts)} hosts"))
        owned = all(f[0] in inv.hosts for f in result.failures)
        if result.rc != 0 or result.failures:
            if not (allow_degraded and owned):
                break
            failed |= set(failed_nodes(result, inv.hosts))
    return results


def _inventory(inventory: str | pathlib.Path | Inventory) -> Inventory:
    from .inventory import load  # noqa: PLC0415

    return inventory if isinstance(inventory, Inventory) else load(inventory)


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
    return execute(
        _inventory(inventory),
        normal_plan(playbook, limit, tags),
        what=f"provisioning ({playbook})",
        # A partial run (one playbook, some tags or hosts) may not have recorded facts yet.
        partial=not (playbook == FULL_PLAYBOOK and not tags and not limit),
        options={"timeout": timeout, "allow_degraded": allow_degraded},
        out=out,
        err=err,
    )


def provision_add(
    inventory: str | pathlib.Path | Inventory,
    hosts: list[str],
    *,
    timeout: int | None = None,
    allow_degraded: bool = False,
    out: Console,
    err: Console,
) -> int:
    """`provision --add HOSTS`: the runs of `add_plan`, then the launch files as after a
    whole provision."""
    inv = _inventory(inventory)
    return execute(
        inv,
        add_plan(inv, hosts),
        what=f"provisioning (--add {','.join(hosts)})",
        partial=False,
        options={"timeout": timeout, "allow_degraded": allow_degraded},
        out=out,
        err=err,
    )


def execute(
    inv: Inventory,
    plan: list[Run],
    *,
    what: str,
    partial: bool,
    options: dict[str, Any],
    out: Console,
    err: Console,
) -> int:
    """Run the plan, then write the launch files and the degraded record; the exit code."""
    from .degraded import (  # noqa: PLC0415
        check_degraded,
        read_degraded,
        update_degraded,
        utc_now,
        write_degraded,
    )
    from .launch_files import write_launch_files  # noqa: PLC0415
    from .runner import raise_for_failures  # noqa: PLC0415

    hosts = inv.hosts
    allow_degraded = bool(options.get("allow_degraded"))
    previous = read_degraded(inv)
    results = run_plan(
        plan, inv, allow_degraded=allow_degraded, timeout=options.get("timeout"), out=out, err=err
    )
    result = merge_results(results)
    failed = failed_nodes(result, hosts)
    # A failure no host owns (a timeout, a broken playbook) cannot be degraded around.
    unowned = [f for f in result.failures if f[0] not in hosts]
    if failed and allow_degraded and not unowned:
        record = update_degraded(
            previous,
            failed=failed,
            succeeded=succeeded_nodes(plan, results, hosts, failed),
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
        succeeded=succeeded_nodes(plan, results, hosts, {}),
        now=utc_now(),
    )
    try:
        files = write_launch_files(inv, excluded=record)
    except DsclusterError as exc:
        if not partial:
            raise
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

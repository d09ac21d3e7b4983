"""DeepSpeed hostfile and `.deepspeed_env`, derived from the inventory + recorded facts.

Pure rendering and validation here; `write_launch_files` is the one place that does I/O.
Rules come from DeepSpeed's launcher: hostfile lines must match `^(\\S+)\\s+slots=(\\d+)`,
duplicates are refused and the first host is the master; `.deepspeed_env` lines are split
once on `=`, keys stripped, values stripped and wrapped in double quotes when they hold a
character outside `[\\w@%+=:,./-]` before being pasted into a pdsh command line.

The communication environment (NCCL / HCCL / libfabric / gloo) comes from each node's
`nccl_env` fact (roles/nccl_env). The pdsh launcher exports one `.deepspeed_env` to every node,
so only keys whose value is the same on every node go there. A differing `NCCL_*` key is left
to each node's /etc/nccl.conf, which NCCL reads itself; any other differing key (GLOO_*,
HCCL_*, FI_*) is left out and reported as a warning.

A provision run with `--allow-degraded` records the nodes it failed on in
`inventories/<name>/degraded.json`; every hostfile written afterwards leaves them out (and
says so in a warning) until a provision that succeeds on them clears the record.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import DsclusterError
from .inventory import Inventory
from .sources.names import HOSTNAME_RE
from .storage import inventory_paths
from .util import atomic_write, write_files

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# DeepSpeed's MultiNodeRunner.add_export quotes values with any other character in "...",
# where the remote shell then expands $, `, \ and " — so those values would arrive changed.
ENV_SAFE_VALUE_RE = re.compile(r"^[\w@%+=:,./-]*$")
ENV_MANGLED_CHARS = set('$`"\\!\n\r')
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What the roles recorded about one node (one JSON file per host)."""

    host: str
    accelerator: str
    accelerator_count: int
    cpu_slots: int
    interface: str
    address: str
    venv: str
    torch_extensions_dir: str
    cpus: int
    versions: Mapping[str, Any]
    # The node's nccl_env fact ({"profile", "env", "socket_ifname"}); {} on older facts.
    nccl_env: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Accelerator model names (nvidia-smi / hl-smi / lspci), () when none were recorded.
    models: tuple[str, ...] = ()

    @property
    def slots(self) -> int:
        return self.accelerator_count if self.accelerator != "cpu" else self.cpu_slots

    @classmethod
    def from_json(cls, host: str, data: Mapping[str, Any]) -> NodeFacts:
        try:
            acc = data["accelerators"]
            nccl_env = data.get("nccl_env") or {}
            if not isinstance(nccl_env, Mapping) or not isinstance(
                nccl_env.get("env", {}), Mapping
            ):
                raise TypeError(f"nccl_env is {nccl_env!r}, not a mapping with an env mapping")
            return cls(
                host=host,
                accelerator=str(acc["kind"]),
                accelerator_count=int(acc["count"]),
                cpu_slots=int(data.get("cpu_slots", 1)),
                interface=str(data.get("interface", "")),
                address=str(data.get("address", "")),
                venv=str(data["versions"]["venv"]),
                torch_extensions_dir=str(data["versions"]["torch_extensions_dir"]),
                cpus=int(acc.get("cpus", 1)),
                versions=dict(data.get("versions", {})),
                nccl_env=dict(nccl_env),
                models=tuple(
                    str(m)
                    for m in (acc.get("nvidia") or {}).get("models")
                    or (acc.get("habana") or {}).get("models")
                    or ()
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DsclusterError(
                f"recorded facts of {host} are incomplete ({exc}); run 'dscluster provision' again"
            ) from exc


def load_facts(inv: Inventory, exclude: Iterable[str] = ()) -> list[NodeFacts]:
    """Recorded facts for every inventory host but `exclude`, head first; a host without
    facts is an error."""
    facts_dir = inv.directory / "facts"
    result = []
    missing = []
    skip = set(exclude)
    for host in inv.hosts:
        if host in skip:
            continue
        path = facts_dir / f"{host}.json"
        if not path.is_file():
            missing.append(host)
            continue
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise DsclusterError(
                f"{path} is not valid JSON ({exc}); run 'dscluster provision'"
            ) from exc
        result.append(NodeFacts.from_json(host, data))
    if missing:
        raise DsclusterError(
            f"no recorded facts for {', '.join(missing)} in {facts_dir}; run "
            f"'dscluster provision -i {inv.source}' so the roles record them"
        )
    return result


def render_hostfile(entries: Iterable[tuple[str, int]]) -> str:
    """`host slots=N` lines, in the given order (head first); validated."""
    entries = list(entries)
    if not entries:
        raise DsclusterError("the cluster has no hosts; add hosts to the inventory")
    seen: set[str] = set()
    lines = []
    for host, slots in entries:
        if not HOSTNAME_RE.fullmatch(host):
            raise DsclusterError(
                f"host name {host!r} cannot go in a DeepSpeed hostfile or a pdsh -w list; "
                "rename it in the inventory (letters, digits, '.', '_', '-')"
            )
        if host in seen:
            raise DsclusterError(
                f"host {host} appears twice; list every host once in the inventory"
            )
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise DsclusterError(
                f"host {host} has slots={slots}; a node needs at least one slot (set "
                "dscluster_cpu_slots >= 1 for CPU nodes, or check its accelerators)"
            )
        seen.add(host)
        lines.append(f"{host} slots={slots}")
    return "\n".join(lines) + "\n"


def check_env_value(key: str, value: str) -> None:
    if not ENV_KEY_RE.match(key):
        raise DsclusterError(f".deepspeed_env key {key!r} is not a shell variable name; rename it")
    if value == "" or value != value.strip():
        raise DsclusterError(
            f".deepspeed_env value of {key} is empty or has surrounding blanks, "
            "which DeepSpeed strips; fix it"
        )
    bad = sorted(set(value) & ENV_MANGLED_CHARS)
    if bad:
        raise DsclusterError(
            f".deepspeed_env value of {key} contains {''.join(bad)!r}, which DeepSpeed's pdsh "
            "launcher would expand or mangle; remove those characters"
        )


def render_env(env: Mapping[str, str]) -> str:
    """Exactly `KEY=VALUE` lines: no comments, blanks, quotes or `export`."""
    if not env:
        raise DsclusterError(".deepspeed_env would be empty; it needs at least PATH")
    lines = []
    for key, value in env.items():
        check_env_value(key, value)
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def parse_env_file(text: str, source: str) -> dict[str, str]:
    """A `.deepspeed_env` as DeepSpeed reads it: `KEY=VALUE` per line, split once on `=`,
    key and value stripped; anything else is refused with the line number."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if "=" not in line:
            raise DsclusterError(
                f"{source} line {number} is not KEY=VALUE (DeepSpeed would fail on it); fix it "
                "or rewrite it with 'dscluster hostfile'"
            )
        key, value = line.split("=", 1)
        key, value = key.strip(), value.strip()
        check_env_value(key, value)
        env[key] = value
    return env


def _one_path(facts: list[NodeFacts], field: str, variable: str) -> str:
    """A path every node recorded alike; the pdsh launcher exports one value to all."""
    paths = {getattr(f, field) for f in facts}
    if len(paths) != 1:
        raise DsclusterError(
            f"nodes record different {field} paths ({', '.join(sorted(paths))}); the pdsh "
            f"launcher needs one path on every node: set {variable} once for the whole inventory"
        )
    return paths.pop()


def _fabric_env(facts: list[NodeFacts]) -> tuple[dict[str, str], list[str]]:
    """The nccl_env keys every node shares, and a warning per other key left out."""
    env: dict[str, str] = {}
    warnings: list[str] = []
    without = [f.host for f in facts if not f.nccl_env]
    if without:
        warnings.append(
            f"no nccl_env fact for {', '.join(without)}: NCCL/gloo settings are exported only "
            "where every node agrees; run 'dscluster provision' so the nccl_env role records it"
        )
    per_node = {
        f.host: {str(k): str(v) for k, v in f.nccl_env.get("env", {}).items()} for f in facts
    }
    for key in sorted({k for node_env in per_node.values() for k in node_env}):
        values = {host: node_env.get(key) for host, node_env in per_node.items()}
        distinct = set(values.values())
        if len(distinct) == 1 and None not in distinct:
            env[key] = str(distinct.pop())
        elif not key.startswith("NCCL_"):
            # NCCL_* keys are in each node's /etc/nccl.conf already; nothing to report.
            shown = ", ".join(
                f"{h}: {v if v is not None else '(unset)'}" for h, v in values.items()
            )
            warnings.append(
                f"{key} differs between nodes ({shown}); left out of .deepspeed_env because the "
                "pdsh launcher exports one value to every node, so each node uses its own default"
            )
    return env, warnings


def derive_launch_env(
    facts: list[NodeFacts], extra: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The launcher environment every rank gets, from the recorded facts, and warnings."""
    venv = _one_path(facts, "venv", "ml_stack_venv")
    env = {
        "PATH": f"{venv}/bin:{SYSTEM_PATH}",
        "TORCH_EXTENSIONS_DIR": _one_path(
            facts, "torch_extensions_dir", "ml_stack_torch_extensions_dir"
        ),
        "PYTHONUNBUFFERED": "1",
    }
    warnings: list[str] = []
    if any(f.nccl_env for f in facts):
        fabric, warnings = _fabric_env(facts)
        env.update(fabric)
    else:
        # Facts from before the nccl_env role: pin the interface the nodes reach each other on
        # when every node names it alike (gloo and NCCL pick "the first" one by themselves).
        ifaces = {f.interface for f in facts}
        if len(ifaces) == 1 and "" not in ifaces:
            iface = ifaces.pop()
            env["GLOO_SOCKET_IFNAME"] = iface
            env["NCCL_SOCKET_IFNAME"] = iface
    kinds = {f.accelerator for f in facts}
    if kinds == {"cpu"}:
        threads = min(max(1, f.cpus // max(1, f.slots)) for f in facts)
        env["OMP_NUM_THREADS"] = str(threads)
    if extra:
        env.update(extra)
    return env, warnings


def derive_env(facts: list[NodeFacts], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher environment every rank gets (see derive_launch_env for the warnings)."""
    return derive_launch_env(facts, extra)[0]


@dataclasses.dataclass(frozen=True)
class LaunchFiles:
    hostfile: pathlib.Path
    env_file: pathlib.Path
    facts: list[NodeFacts]
    # One line each: environment keys left out of .deepspeed_env because nodes differ.
    warnings: list[str] = dataclasses.field(default_factory=list)
    # What goes into (or went into) the two files.
    hostfile_text: str = ""
    env_text: str = ""

    def write(self) -> None:
        """Both files as one transaction (util.write_files)."""
        write_files({self.hostfile: self.hostfile_text, self.env_file: self.env_text})

    @property
    def world_size(self) -> int:
        return sum(f.slots for f in self.facts)


# --- degraded clusters: nodes a provision run left out (--allow-degraded) ---------------------

DEGRADED_FILE = "degraded.json"


def degraded_path(inv: Inventory) -> pathlib.Path:
    return inv.directory / DEGRADED_FILE


def read_degraded(inv: Inventory) -> dict[str, dict[str, str]]:
    """host -> {"reason", "since"} of the nodes left out of the launch files; {} when none."""
    path = degraded_path(inv)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        excluded = data["excluded"]
        if not isinstance(excluded, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("reason"), str) for v in excluded.values()
        ):
            raise TypeError("'excluded' is not a mapping of host -> {reason, since}")
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DsclusterError(
            f"{path} is not a degraded-nodes record ({exc}); delete it and run "
            "'dscluster provision' again"
        ) from exc
    return {str(host): {str(k): str(v) for k, v in why.items()} for host, why in excluded.items()}


def update_degraded(
    previous: Mapping[str, Mapping[str, str]],
    *,
    failed: Mapping[str, str],
    succeeded: Iterable[str],
    now: str,
) -> dict[str, dict[str, str]]:
    """Pure: the record after a provision run. Nodes that failed now are (re)recorded with
    the reason; nodes it succeeded on leave the record; the others stay as they were."""
    result = {h: dict(v) for h, v in previous.items()}
    for host in succeeded:
        result.pop(host, None)
    for host, reason in failed.items():
        since = result.get(host, {}).get("since", now)
        result[host] = {"reason": reason, "since": since}
    return result


def check_degraded(hosts: Sequence[str], head: str, excluded: Mapping[str, object]) -> None:
    """A degraded cluster still needs its head (it launches every job) and one node."""
    if head in excluded:
        raise DsclusterError(
            f"the head {head} failed ({_reason(excluded[head])}); jobs are launched from it, so "
            "it cannot be left out: fix it and run 'dscluster provision' again"
        )
    if not [h for h in hosts if h not in excluded]:
        raise DsclusterError("every node failed; fix them and run 'dscluster provision' again")


def _reason(why: object) -> str:
    return str(why.get("reason", "")) if isinstance(why, Mapping) else str(why)


def degraded_warning(inv: Inventory, excluded: Mapping[str, object]) -> str:
    """The one warning line naming the nodes left out and how to bring them back."""
    who = "; ".join(f"{host}: {_reason(why)}" for host, why in excluded.items())
    return (
        f"degraded cluster: {', '.join(excluded)} left out of the hostfile and .deepspeed_env "
        f"({who}); recorded in {degraded_path(inv)}; bring the node(s) back and run "
        f"'dscluster provision -i {inv.source}' to include them again"
    )


def write_degraded(inv: Inventory, excluded: Mapping[str, Mapping[str, str]]) -> None:
    """Record the excluded nodes atomically; an empty record removes the file."""
    path = degraded_path(inv)
    if not excluded:
        path.unlink(missing_ok=True)
        return
    data = {
        "excluded": {h: dict(v) for h, v in excluded.items()},
        "note": "nodes left out of hostfile and .deepspeed_env by "
        "'dscluster provision --allow-degraded'; a full provision (site.yml, no --tags) "
        "that succeeds on them clears them",
    }
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_launch_files(
    inv: Inventory,
    extra_env: Mapping[str, str] | None = None,
    *,
    excluded: Mapping[str, object] | None = None,
) -> LaunchFiles:
    """Derive and write `hostfile` and `.deepspeed_env` beside the inventory, atomically.

    Nodes recorded in degraded.json (or `excluded`, which replaces that record) are left out,
    with a warning naming them. Both files are rendered and validated before either is
    written, then written as one transaction: on any error nothing changes.
    """
    files = render_launch_files(inv, extra_env, excluded=excluded)
    files.write()
    return files


def render_launch_files(
    inv: Inventory,
    extra_env: Mapping[str, str] | None = None,
    *,
    excluded: Mapping[str, object] | None = None,
) -> LaunchFiles:
    """What write_launch_files writes, rendered and validated, nothing written."""
    if excluded is None:
        excluded = read_degraded(inv)
    excluded = {h: why for h, why in excluded.items() if h in inv.hosts}
    if excluded:
        check_degraded(inv.hosts, inv.head, excluded)
    facts = load_facts(inv, exclude=excluded)
    hostfile_text = render_hostfile((f.host, f.slots) for f in facts)
    # Where a job keeps checkpoints and NVMe swap files (the inventory's path set); a job
    # reads them from its environment. dscluster_extra_env may override them.
    paths = inventory_paths(inv)
    extra = {
        "DSCLUSTER_CHECKPOINT_DIR": paths.checkpoint_dir,
        "DSCLUSTER_SCRATCH_DIR": paths.scratch_dir,
        "DSCLUSTER_SHARED_STORAGE": paths.kind,
    }
    extra.update(inv.var(inv.head, "dscluster_extra_env", {}) or {})
    extra.update(extra_env or {})
    env, warnings = derive_launch_env(facts, extra)
    env_text = render_env(env)
    if excluded:
        warnings = [degraded_warning(inv, excluded), *warnings]
    return LaunchFiles(
        hostfile=inv.directory / "hostfile",
        env_file=inv.directory / ".deepspeed_env",
        facts=facts,
        warnings=warnings,
        hostfile_text=hostfile_text,
        env_text=env_text,
    )

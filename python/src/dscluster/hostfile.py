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

import collections
import dataclasses
import datetime as dt
import json
import math
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import DsclusterError
from .inventory import Inventory
from .sources.names import HOSTNAME_RE
from .storage import inventory_paths
from .util import atomic_write, write_files
from .validate import MAX_SLOTS, read_text

ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# DeepSpeed's MultiNodeRunner.add_export quotes values with any other character in "...",
# where the remote shell then expands $, `, \ and " — so those values would arrive changed.
ENV_SAFE_VALUE_RE = re.compile(r"^[\w@%+=:,./-]*$")
ENV_MANGLED_CHARS = set('$`"\\!\n\r')
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# One line of a hostfile as dscluster accepts it: DeepSpeed's `^(\S+)\s+slots=(\d+)` with
# nothing after the count (DeepSpeed would silently read `slots=2x` as 2).
HOSTFILE_LINE_RE = re.compile(r"(?P<host>\S+)\s+slots=(?P<slots>[0-9]+)")
# The most hosts one inventory / hostfile / Slurm node or count list may name, checked
# before a list is expanded. Above validate.MAX_HOSTS (4096): a Slurm allocation of 10,000
# nodes is a list dscluster expands (tests/unit/test_slurm.py); 2(x99999999999) is not.
MAX_HOSTS = 16_384
SLOTS_RULE = f"slots must be a whole number 1-{MAX_SLOTS}"
IPV6_RULE = (
    "IPv6 literals cannot go in a hostfile; name the host and put the address in ansible_host"
)


def show(value: object, limit: int = 80) -> str:
    """A value for a one-line message: repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'"


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


class _FactsError(Exception):
    """One problem in a facts file, as `<dotted key> <problem>`."""


def _get(data: Mapping[str, Any], dotted: str, default: Any = dataclasses.MISSING) -> Any:
    node: Any = data
    for i, key in enumerate(dotted.split(".")):
        where = ".".join(dotted.split(".")[:i]) or "the file"
        if not isinstance(node, Mapping):
            raise _FactsError(f"{where} is a {type(node).__name__}, not a mapping")
        if key not in node or node[key] is None:
            if default is not dataclasses.MISSING:
                return default
            raise _FactsError(f"{dotted} is missing")
        node = node[key]
    return node


def _count(data: Mapping[str, Any], dotted: str, default: Any = dataclasses.MISSING) -> int:
    """A whole number >= 0 (an int, or digits as Ansible's templates sometimes write them)."""
    value = _get(data, dotted, default)
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()):
        return int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _FactsError(f"{dotted} is {show(value)}, not a whole number >= 0")
    return value


def _text(data: Mapping[str, Any], dotted: str, default: Any = dataclasses.MISSING) -> str:
    value = _get(data, dotted, default)
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise _FactsError(f"{dotted} is {show(value)}, not text")
    return str(value)


def _mapping(data: Mapping[str, Any], dotted: str) -> dict[str, Any]:
    value = _get(data, dotted, {})
    if not isinstance(value, Mapping):
        raise _FactsError(f"{dotted} is {show(value)}, not a mapping")
    return dict(value)


def _models(acc: Mapping[str, Any]) -> tuple[str, ...]:
    for vendor in ("nvidia", "habana"):
        models = _get(acc, f"{vendor}.models", None)
        if models:
            if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
                raise _FactsError(f"accelerators.{vendor}.models is {show(models)}, not a list")
            return tuple(models)
    return ()


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
    # PYTHONPYCACHEPREFIX of the ranks (ml_stack_pycache_dir); "" when not recorded (facts from
    # before it, or ml_stack_pycache_dir "").
    pycache_dir: str = ""
    # The kernel's boot id (accelerators.boot_id): nodes that report the same one are
    # containers of one machine, sharing its cores; "" on facts from before it.
    boot_id: str = ""

    @property
    def slots(self) -> int:
        return self.accelerator_count if self.accelerator != "cpu" else self.cpu_slots

    @classmethod
    def from_json(cls, host: str, data: Any, source: str = "") -> NodeFacts:
        """Facts of `host` from its JSON document; any wrong shape or type is one
        DsclusterError naming the key (and `source`, the file)."""
        try:
            if not isinstance(data, Mapping):
                raise _FactsError(f"the file holds a {type(data).__name__}, not a mapping")
            nccl_env = _mapping(data, "nccl_env")
            if not isinstance(nccl_env.get("env", {}), Mapping):
                raise _FactsError(
                    f"nccl_env is {show(nccl_env)}, not a mapping with an env mapping"
                )
            acc = _mapping(data, "accelerators")
            return cls(
                host=host,
                accelerator=_text(data, "accelerators.kind"),
                accelerator_count=_count(data, "accelerators.count"),
                cpu_slots=_count(data, "cpu_slots", 1),
                interface=_text(data, "interface", ""),
                address=_text(data, "address", ""),
                venv=_text(data, "versions.venv"),
                torch_extensions_dir=_text(data, "versions.torch_extensions_dir"),
                cpus=_count(data, "accelerators.cpus", 1),
                versions=_mapping(data, "versions"),
                nccl_env=nccl_env,
                models=_models(acc),
                pycache_dir=_text(data, "versions.pycache_dir", ""),
                boot_id=_text(data, "accelerators.boot_id", ""),
            )
        except _FactsError as exc:
            where = f"{source}: " if source else ""
            raise DsclusterError(
                f"recorded facts of {host} are incomplete ({where}{exc}); run "
                "'dscluster provision' again to record them"
            ) from None


def read_facts_file(path: pathlib.Path, host: str) -> NodeFacts:
    """One facts file: UTF-8 JSON holding a mapping of the recorded facts."""
    text = read_text(path, "recorded facts file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DsclusterError(
            f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}); run "
            "'dscluster provision' to record it again"
        ) from None
    except (ValueError, RecursionError):  # a number of thousands of digits, deep nesting
        raise DsclusterError(
            f"{path} is not recorded facts (a huge number or deep nesting); run "
            "'dscluster provision' again"
        ) from None
    return NodeFacts.from_json(host, data, str(path))


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
        result.append(read_facts_file(path, host))
    if missing:
        raise DsclusterError(
            f"no recorded facts for {', '.join(missing)} in {facts_dir}; run "
            f"'dscluster provision -i {inv.source}' so the roles record them"
        )
    return result


def render_hostfile(entries: Iterable[tuple[str, int]]) -> str:
    """`host slots=N` lines, in the given order (head first); validated: every line
    matches DeepSpeed's `^(\\S+)\\s+slots=(\\d+)`, no host twice, slots 1..MAX_SLOTS."""
    entries = list(entries)
    if not entries:
        raise DsclusterError("the cluster has no hosts; add hosts to the inventory")
    if len(entries) > MAX_HOSTS:
        raise DsclusterError(
            f"the cluster has {len(entries)} hosts; at most {MAX_HOSTS} fit one hostfile"
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


def _lines(text: str) -> list[str]:
    """Lines as DeepSpeed reads a file (readlines: split on \\n only)."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def parse_hostfile(text: str, source: str) -> list[tuple[str, int]]:
    """A hostfile (perhaps edited by hand) as DeepSpeed reads it: `host slots=N` per line,
    blank lines and `#` comments skipped; anything DeepSpeed would refuse, or read other
    than it looks (`slots=2x`), is refused with the file and line."""
    fix = "write it as 'host slots=N' or rewrite it with 'dscluster hostfile'"
    entries: list[tuple[str, int]] = []
    seen: set[str] = set()
    for number, raw in enumerate(_lines(text), start=1):
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


def check_env_value(key: str, value: str) -> None:
    if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
        raise DsclusterError(
            f".deepspeed_env key {show(key)} is not a shell variable name; rename it "
            "(letters, digits and '_', not starting with a digit)"
        )
    if not isinstance(value, str):
        raise DsclusterError(f".deepspeed_env value of {key} is {show(value)}, not text; quote it")
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
    if not value.isprintable():
        raise DsclusterError(
            f".deepspeed_env value of {key} ({show(value)}) contains a control character, "
            "which DeepSpeed's pdsh launcher would pass through a shell; remove it"
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
    """A `.deepspeed_env` as DeepSpeed reads it: `KEY=VALUE` per line (lines split on \\n as
    readlines does), split once on `=`, key and value stripped; anything else is refused
    with the line number."""
    env: dict[str, str] = {}
    for number, line in enumerate(_lines(text), start=1):
        if "=" not in line:
            raise DsclusterError(
                f"{source} line {number} is not KEY=VALUE (DeepSpeed would fail on it); fix it "
                "or rewrite it with 'dscluster hostfile'"
            )
        key, value = line.split("=", 1)
        key, value = key.strip(), value.strip()
        try:
            check_env_value(key, value)
        except DsclusterError as exc:
            raise DsclusterError(f"{source} line {number}: {exc}") from None
        env[key] = value
    return env


def env_text(key: object, value: object, where: str) -> str:
    """One value of dscluster_extra_env as the text `.deepspeed_env` carries: strings as
    they are, whole and finite numbers in decimal, booleans as 1 / 0 (how NCCL, torch and
    most launchers read a flag); null, lists and mappings refused naming the key."""
    if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
        raise DsclusterError(
            f"{where}: key {show(key)} is not an environment variable name; use letters, "
            "digits and '_', not starting with a digit (e.g. OMP_NUM_THREADS)"
        )
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DsclusterError(f"{where}: {key} is {value}; give a finite number or a string")
        return repr(value)
    if isinstance(value, str):
        return value
    kind = "null" if value is None else type(value).__name__
    raise DsclusterError(
        f"{where}: {key} is {kind} ({show(value)}); give it a plain value, e.g. {key}: '4' "
        "(a string, number or true/false), or remove the key"
    )


def extra_env_texts(extra: object, where: str) -> dict[str, str]:
    """dscluster_extra_env (or an extra_env argument) as {KEY: text}; see env_text."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise DsclusterError(
            f"{where} is {type(extra).__name__} ({show(extra)}), not a mapping; write it as "
            "KEY: value pairs, e.g. {OMP_NUM_THREADS: 4}"
        )
    return {str(k): env_text(k, v, where) for k, v in extra.items()}


def _one_path(facts: list[NodeFacts], field: str, variable: str) -> str:
    """A path every node recorded alike; the pdsh launcher exports one value to all."""
    paths = {getattr(f, field) for f in facts}
    if len(paths) != 1:
        raise DsclusterError(
            f"nodes record different {field} paths ({', '.join(sorted(paths))}); the pdsh "
            f"launcher needs one path on every node: set {variable} once for the whole inventory"
        )
    return paths.pop()


def _pycache_dir(facts: list[NodeFacts]) -> tuple[str, str]:
    """The ranks' PYTHONPYCACHEPREFIX when every node recorded the same one ("" when none
    did), and a warning when only some did: each rank then compiles what it imports again."""
    without = [f.host for f in facts if not f.pycache_dir]
    if len(without) == len(facts):
        return "", ""
    if without:
        return "", (
            f"no pycache_dir recorded for {', '.join(without)}: PYTHONPYCACHEPREFIX is left "
            "out, so every rank compiles what it imports again; run 'dscluster provision'"
        )
    return _one_path(facts, "pycache_dir", "ml_stack_pycache_dir"), ""


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


def omp_threads(facts: list[NodeFacts]) -> int:
    """OMP threads a rank on CPU-only nodes: each machine's cores over the ranks of every node
    on it, the least of them (.deepspeed_env has one value for all), at least 1.

    Nodes that report the same kernel boot id are containers of one machine (a local
    cluster, or containers on one remote Docker host): each sees all of its cores, so its own
    cpus // slots would put cores x nodes threads on them, the idle ones spinning on the
    cores the other nodes' ranks work on (3 local nodes on 2 cores beside other work: a smoke
    job 20 % less node CPU and 11 % sooner with 1 thread a rank than with 2). A node without
    a boot id counts as a machine of its own."""
    machine = {f.host: f.boot_id or f"host {f.host}" for f in facts}
    ranks: collections.Counter[str] = collections.Counter()
    for f in facts:
        ranks[machine[f.host]] += max(1, f.slots)
    return min(max(1, f.cpus // ranks[machine[f.host]]) for f in facts)


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
    pycache, note = _pycache_dir(facts)
    if pycache:
        env["PYTHONPYCACHEPREFIX"] = pycache
    warnings += [note] if note else []
    kinds = {f.accelerator for f in facts}
    if kinds == {"cpu"}:
        env["OMP_NUM_THREADS"] = str(omp_threads(facts))
        # Accelerate (1.x) makes a process group on CPU-only nodes only when told the run is
        # on CPU: without this, every rank of an Accelerate script or an HF Trainer under
        # torchrun, mpi, srun or `accelerate launch` finds no backend and trains alone at world
        # size 1 (accelerate/state.py: PartialState, _prepare_backend). The deepspeed launcher's
        # ds_rank.sh unsets it again: with it, accelerate switches its DeepSpeed plugin off
        # (AcceleratorState enables DEEPSPEED only `and not cpu`), and an HF Trainer given
        # --deepspeed would train plain DDP without a word.
        env["ACCELERATE_USE_CPU"] = "true"
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
        data = json.loads(read_text(path, "degraded-nodes record"))
        excluded = data["excluded"]
        if not isinstance(excluded, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("reason"), str) for v in excluded.values()
        ):
            raise TypeError("'excluded' is not a mapping of host -> {reason, since}")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
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
    extra.update(
        extra_env_texts(
            inv.var(inv.head, "dscluster_extra_env"), f"dscluster_extra_env in {inv.source}"
        )
    )
    extra.update(extra_env_texts(extra_env, "the extra environment"))
    env, warnings = derive_launch_env(facts, extra)
    env_file_text = render_env(env)
    if excluded:
        warnings = [degraded_warning(inv, excluded), *warnings]
    return LaunchFiles(
        hostfile=inv.directory / "hostfile",
        env_file=inv.directory / ".deepspeed_env",
        facts=facts,
        warnings=warnings,
        hostfile_text=hostfile_text,
        env_text=env_file_text,
    )

"""What the roles recorded about each node: `NodeFacts`, read from `facts/<host>.json`.

The deepspeed_launcher role records one JSON file per host in `<inventory dir>/facts/`
(accelerators, slots, the interface, the venv, the nccl_env fact, ...). Any wrong shape or
type in one is one DsclusterError naming the key and the file, telling the user to provision
again.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import DsclusterError
from .inventory import Inventory
from .text import show
from .validate import read_text


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

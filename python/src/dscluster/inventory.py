"""Read Ansible inventories through Ansible itself, and write the ones dscluster makes.

The inventory (`inventories/<name>/hosts.yml`) is the single source of truth about the
cluster; this module never keeps a second notion of it. Reading goes through
`ansible-inventory --list`, so every inventory Ansible accepts (YAML, INI, plugins) works.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import yaml

from . import inventory_cache, rules
from .errors import DsclusterError
from .sources import names
from .text import show_yaml
from .util import atomic_write, run, tool
from .validate import read_text

# The rendezvous port when the inventory sets no dscluster_master_port (the same value as
# roles/_dscluster_defaults' dscluster_master_port): the one place it is written.
DEFAULT_MASTER_PORT = 29500


@dataclasses.dataclass(frozen=True)
class Inventory:
    """What `ansible-inventory --list` says, plus where it came from."""

    source: pathlib.Path
    groups: dict[str, list[str]]
    hostvars: dict[str, dict[str, Any]]

    @property
    def directory(self) -> pathlib.Path:
        return self.source if self.source.is_dir() else self.source.parent

    @property
    def head(self) -> str:
        heads = self.groups.get("head", [])
        if len(heads) != 1:
            raise DsclusterError(
                f"inventory {self.source} has {len(heads)} hosts in group 'head'; "
                "put exactly one host there"
            )
        return heads[0]

    @property
    def hosts(self) -> list[str]:
        """Every host, the head first, then the others in inventory order, no repeats."""
        ordered = [self.head]
        for group in ("workers", "all"):
            for host in self.groups.get(group, []):
                if host not in ordered:
                    ordered.append(host)
        return ordered

    def var(self, host: str, name: str, default: Any = None) -> Any:
        return self.hostvars.get(host, {}).get(name, default)


def plain_var(inv: Inventory, name: str) -> Any:
    """The head's value of `name`, refused when it is a Jinja template Ansible would render."""
    value = inv.var(inv.head, name)
    if isinstance(value, str) and "{{" in value:
        raise DsclusterError(
            f"{name} in {inv.source} is a template ({value}); pass the value on the "
            "command line instead"
        )
    return value


def master_port_var(inv: Inventory) -> int | None:
    """dscluster_master_port as the inventory sets it, or None; refused (not defaulted) when
    it breaks its rule (rules.yml: a whole number 1-65535)."""
    port = plain_var(inv, "dscluster_master_port")
    if port is None:
        return None
    try:
        rules.check_value("dscluster_master_port", port)
    except DsclusterError as exc:
        raise DsclusterError(f"{exc}; fix it in {inv.source}") from None
    return int(port)


def master_port(inv: Inventory, given: int | None = None) -> int:
    """--master-port when given, else the inventory's dscluster_master_port, else the default."""
    if given is not None:
        return given
    port = master_port_var(inv)
    return DEFAULT_MASTER_PORT if port is None else port


def _collect(data: dict[str, Any], group: str, seen: set[str]) -> list[str]:
    if group in seen:
        return []
    seen.add(group)
    node = data.get(group, {})
    hosts = list(node.get("hosts", []))
    for child in node.get("children", []):
        for host in _collect(data, child, seen):
            if host not in hosts:
                hosts.append(host)
    return hosts


def _hosts_file(path: pathlib.Path) -> pathlib.Path:
    """The file Ansible is given: an inventory directory's hosts file, or the file itself."""
    if path.is_dir() and not any(path.glob("hosts.y*ml")) and not (path / "hosts").exists():
        raise DsclusterError(
            f"{path} has no hosts.yml; create one (see inventories/sample) or run "
            "'dscluster local up' to write it"
        )
    if not path.exists():
        raise DsclusterError(
            f"inventory {path} does not exist; pass -i inventories/<name> "
            "(e.g. after 'dscluster local up --name <name>')"
        )
    # Given a directory, hand Ansible its hosts file, not the directory: Ansible reads every
    # file in an inventory directory as a source, and dscluster keeps other files there
    # (hostfile, facts/*.json, reports/). group_vars/ and host_vars/ beside it still apply.
    if path.is_dir():
        path = next(
            p for p in (path / "hosts.yml", path / "hosts.yaml", path / "hosts") if p.exists()
        )
    if path.is_dir():
        raise DsclusterError(f"inventory {path} is a directory; give its hosts.yml")
    return path


class _AnsibleYaml(yaml.SafeLoader):
    """YAML as Ansible writes it: `!vault` (inline ansible-vault values) and `!unsafe` are
    Ansible's tags, not errors; their values are kept as opaque text here."""


def _ansible_tag(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)  # type: ignore[arg-type]


for _tag in ("!vault", "!unsafe", "!vault-encrypted"):
    _AnsibleYaml.add_constructor(_tag, _ansible_tag)

VAULT_HEADER = "$ANSIBLE_VAULT;"


def _parse_yaml(path: pathlib.Path, what: str) -> Any:
    """A YAML file, with a syntax error reported at its line (Ansible only warns). A file
    encrypted whole with ansible-vault is Ansible's to read: None here."""
    text = read_text(path, what)
    if text.lstrip().startswith(VAULT_HEADER):
        return None
    try:
        return yaml.load(text, Loader=_AnsibleYaml)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        why = exc.problem or exc.context or "invalid YAML"
        raise DsclusterError(
            f"cannot read {what} {path}: not valid YAML{where}: {why}; fix the YAML (indent with "
            "spaces, not tabs; close every bracket and quote)"
        ) from None
    except yaml.YAMLError as exc:
        raise DsclusterError(
            f"cannot read {what} {path}: not valid YAML ({exc}); fix the YAML"
        ) from None


_GROUP_KEYS = ("hosts", "children", "vars")


def _check_group(path: pathlib.Path, name: str, node: Any, depth: int = 0) -> None:
    example = "all: {children: {head: {hosts: {n1: {}}}, workers: {hosts: {n2: {}}}}}"
    if node is None:
        return
    if not isinstance(node, dict):
        raise DsclusterError(
            f"in inventory {path}, group {name!r} is {show_yaml(node)} ({rules.kind(node)}); "
            f"a group must be a mapping with hosts:, children: or vars:, e.g. {example}"
        )
    for key in _GROUP_KEYS:
        value = node.get(key)
        if value is not None and not isinstance(value, dict):
            raise DsclusterError(
                f"in inventory {path}, {name}.{key} is {show_yaml(value)} "
                f"({rules.kind(value)}); it must be a mapping (hosts: {{n1: {{}}}}, not a "
                f"list), e.g. {example}"
            )
    for host, hv in (node.get("hosts") or {}).items():
        try:
            names.check_host_name(host)
        except DsclusterError as exc:
            raise DsclusterError(f"{exc}; rename it in {path}") from None
        if hv is not None and not isinstance(hv, dict):
            raise DsclusterError(
                f"in inventory {path}, host {host!r} of group {name!r} has {show_yaml(hv)} "
                f"({rules.kind(hv)}) where its variables belong; write {host}: {{}} or "
                f"{host}: {{ansible_host: 10.0.0.1}}"
            )
    if depth < 32:
        for child, sub in (node.get("children") or {}).items():
            _check_group(path, str(child), sub, depth + 1)


def _check_yaml_inventory(path: pathlib.Path) -> None:
    data = _parse_yaml(path, "inventory file")
    if data is None and read_text(path, "inventory file").lstrip().startswith(VAULT_HEADER):
        return  # encrypted whole: ansible-inventory decrypts it (or says why it cannot)
    if data is None:
        raise DsclusterError(
            f"inventory file {path} is empty; add hosts under all: children: head: and "
            "workers: (see inventories/sample/hosts.yml)"
        )
    if not isinstance(data, dict):
        raise DsclusterError(
            f"inventory file {path} holds {rules.kind(data)} ({show_yaml(data)}); it must be "
            "a mapping of groups, e.g. all: {children: {head: {hosts: {n1: {}}}}}"
        )
    for name, node in data.items():
        _check_group(path, str(name), node)


def _check_var_files(directory: pathlib.Path) -> None:
    """group_vars/ and host_vars/ beside the hosts file: YAML mappings."""
    for sub in ("group_vars", "host_vars"):
        base = directory / sub
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or path.suffix not in ("", ".yml", ".yaml", ".json"):
                continue
            data = _parse_yaml(path, "variables file")
            if data is not None and not isinstance(data, dict):
                raise DsclusterError(
                    f"variables file {path} holds {rules.kind(data)} ({show_yaml(data)}); it "
                    "must be a mapping of variables, e.g. dscluster_cpu_slots: 2"
                )


def load(source: str | pathlib.Path) -> Inventory:
    """Load an inventory file or directory with `ansible-inventory --list`, then check it
    with the inventory rules (rules.py): any problem is refused here, before a command does
    anything."""
    path = _hosts_file(pathlib.Path(source).expanduser())
    if path.suffix in (".yml", ".yaml"):
        _check_yaml_inventory(path)
    _check_var_files(path.parent)
    program = tool("ansible-inventory")
    cache_key = inventory_cache.key(path, program)
    data = inventory_cache.lookup(cache_key) if cache_key else None
    text = None  # ansible-inventory's output when it ran here (a miss)
    if data is None:
        proc = run([program, "-i", str(path), "--list"], check=False, timeout=120)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise DsclusterError(
                f"ansible-inventory cannot read {path}: {lines[-1] if lines else 'no output'}"
            )
        text = proc.stdout
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DsclusterError(f"ansible-inventory gave no JSON for {path}: {exc}") from exc
    groups = {name: _collect(data, name, set()) for name in data if name != "_meta"}
    hostvars = data.get("_meta", {}).get("hostvars", {})
    for host in groups.get("all", []):
        hostvars.setdefault(host, {})
    if not groups.get("all"):
        raise DsclusterError(f"inventory {path} has no hosts; add hosts under 'head' and 'workers'")
    inv = Inventory(source=path.resolve(), groups=groups, hostvars=hostvars)
    rules.check_inventory(inv)
    if cache_key and text is not None:
        inventory_cache.remember(cache_key, text)  # written once the command has succeeded
    return inv


def write_hosts_yml(directory: pathlib.Path, data: dict[str, Any], header: str) -> pathlib.Path:
    """Write `hosts.yml` (plain YAML a person can edit) atomically."""
    text = header.rstrip() + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    path = directory / "hosts.yml"
    atomic_write(path, text)
    return path

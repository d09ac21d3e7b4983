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

from .errors import DsclusterError
from .util import atomic_write, run, tool

# The rendezvous port when the inventory sets no dscluster_master_port (the same value as
# roles/dscluster_defaults' dscluster_master_port): the one place it is written.
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
    """dscluster_master_port as the inventory sets it, or None."""
    port = plain_var(inv, "dscluster_master_port")
    if port is None:
        return None
    try:
        return int(port)
    except (TypeError, ValueError) as exc:
        raise DsclusterError(
            f"dscluster_master_port in {inv.source} is {port!r}, not a port number; fix it"
        ) from exc


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


def load(source: str | pathlib.Path) -> Inventory:
    """Load an inventory file or directory with `ansible-inventory --list`."""
    path = pathlib.Path(source).expanduser()
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
    proc = run([tool("ansible-inventory"), "-i", str(path), "--list"], check=False, timeout=120)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise DsclusterError(
            f"ansible-inventory cannot read {path}: {lines[-1] if lines else 'no output'}"
        )
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise DsclusterError(f"ansible-inventory gave no JSON for {path}: {exc}") from exc
    groups = {name: _collect(data, name, set()) for name in data if name != "_meta"}
    hostvars = data.get("_meta", {}).get("hostvars", {})
    for host in groups.get("all", []):
        hostvars.setdefault(host, {})
    if not groups.get("all"):
        raise DsclusterError(f"inventory {path} has no hosts; add hosts under 'head' and 'workers'")
    return Inventory(source=path.resolve(), groups=groups, hostvars=hostvars)


def write_hosts_yml(directory: pathlib.Path, data: dict[str, Any], header: str) -> pathlib.Path:
    """Write `hosts.yml` (plain YAML a person can edit) atomically."""
    text = header.rstrip() + "\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    path = directory / "hosts.yml"
    atomic_write(path, text)
    return path

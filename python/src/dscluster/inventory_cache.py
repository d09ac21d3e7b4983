"""What `ansible-inventory --list` said about a static inventory, remembered.

Every command that reads an inventory runs `ansible-inventory --list` (inventory.load): about
0.8 CPU-seconds of Ansible's start-up for a few hosts, each time. For an inventory whose
answer can only change when a file changes (a YAML or INI hosts file with its group_vars/ and
host_vars/), the answer is kept under `<cache>/inventory/<key>.json`, the key a SHA-256 of:

- the hosts file's path and bytes, and every file under the group_vars/ and host_vars/
  beside it (path and bytes);
- the ansible-inventory used (path, modification time, this environment's ansible-core
  version), every ansible.cfg Ansible could read (ANSIBLE_CONFIG, ./ansible.cfg,
  ~/.ansible.cfg, /etc/ansible/ansible.cfg: path and bytes), every ANSIBLE_* variable and the
  working directory.

Never kept: an executable hosts file (a script inventory), a YAML file naming an inventory
`plugin:` (aws_ec2, constructed: their answer is not in the files), anything holding
ansible-vault data (its plain text must not land in a cache), an inventory refused by the
rules, and anything read by a command that then failed: entries are written by `flush()`,
which the command line calls only after a command succeeded, so a refused command leaves the
cache as it found it. Entries are the user's own (0600 in a 0700 directory, owned by the user
or not read); a cache that cannot be read or written is a miss, never an error.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
import re
from typing import Any

from . import paths

MAX_ENTRIES = 256
_PLUGIN = re.compile(rb"^plugin\s*:", re.MULTILINE)
_VAULT = b"$ANSIBLE_VAULT"

# key -> ansible-inventory's JSON text: read (or run) in this process, and to be written.
_seen: dict[str, str] = {}
_pending: dict[str, str] = {}


def _ansible_core_version() -> str:
    try:
        return importlib.metadata.version("ansible-core")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _config_files() -> list[pathlib.Path]:
    """Every ansible.cfg Ansible could read from here, in its order of precedence."""
    found = []
    env = os.environ.get("ANSIBLE_CONFIG")
    if env:
        path = pathlib.Path(env).expanduser()
        found.append(path / "ansible.cfg" if path.is_dir() else path)
    found += [
        pathlib.Path.cwd() / "ansible.cfg",
        pathlib.Path("~/.ansible.cfg").expanduser(),
        pathlib.Path("/etc/ansible/ansible.cfg"),
    ]
    return found


def key(hosts_file: pathlib.Path, tool_path: str) -> str | None:
    """The cache key of reading `hosts_file` with `tool_path`, or None where the answer may
    depend on more than files (a script, a plugin, vault data) or a file cannot be read."""
    try:
        hosts = hosts_file.resolve()
        if os.access(hosts, os.X_OK):
            return None
        files = [hosts]
        for sub in ("group_vars", "host_vars"):
            base = hosts.parent / sub
            if base.is_dir():
                files += sorted(p for p in base.rglob("*") if p.is_file())
        digest = hashlib.sha256()
        for path in files:
            data = path.read_bytes()
            if _VAULT in data or (path == hosts and _PLUGIN.search(data)):
                return None
            digest.update(f"file {path} {len(data)}\n".encode())
            digest.update(data)
        mtime = os.stat(tool_path).st_mtime_ns
        digest.update(f"tool {tool_path} {mtime} {_ansible_core_version()}\n".encode())
        for cfg in _config_files():
            if cfg.is_file():
                data = cfg.read_bytes()
                digest.update(f"config {cfg} {len(data)}\n".encode())
                digest.update(data)
        for name in sorted(k for k in os.environ if k.startswith("ANSIBLE_")):
            digest.update(f"env {name}={os.environ[name]}\n".encode())
        digest.update(f"cwd {pathlib.Path.cwd()}\n".encode())
    except (OSError, ValueError):
        return None
    return digest.hexdigest()


def _directory() -> pathlib.Path:
    return paths.cache_root() / "inventory"


def lookup(cache_key: str) -> Any:
    """ansible-inventory's answer kept under `cache_key`, parsed afresh (the caller may change
    it), or None (a miss: no entry, not the user's own, not JSON)."""
    text = _seen.get(cache_key)
    try:
        if text is None:
            entry = _directory() / f"{cache_key}.json"
            with entry.open("rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_uid != os.getuid() or st.st_mode & 0o077:
                    return None
                text = fh.read().decode()
        data = json.loads(text)
    except (OSError, ValueError):
        return None
    _seen[cache_key] = text
    return data


def remember(cache_key: str, text: str) -> None:
    """Keep this reading for the rest of the process; flush() writes it."""
    _seen[cache_key] = text
    _pending[cache_key] = text


def flush() -> None:
    """Write the readings remembered since the last flush (after a command succeeded), and
    keep the newest MAX_ENTRIES. Best effort: a cache that cannot be written is left alone."""
    if not _pending:
        return
    pending = dict(_pending)
    _pending.clear()
    try:
        directory = _directory()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for cache_key, text in pending.items():
            tmp = directory / f".{cache_key}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(text)
                os.replace(tmp, directory / f"{cache_key}.json")
            finally:
                tmp.unlink(missing_ok=True)
        entries = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink(missing_ok=True)
    except OSError:
        return

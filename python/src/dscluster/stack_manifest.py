"""What a baked image may hold of the stack, from the controller's own wheelhouse.

`dscluster image bake` checks the node against this before it makes anything: the node's
wheelhouse holds exactly the controller lock's wheels (by sha256), and every file of the
venv's site-packages is one a controller wheel's RECORD lists, with the hash it lists
(docker/bake/verify_stack.py runs the check on the node, with the node's system python).
The controller's wheelhouse is the one whose lock.json the node's venv was installed from
(its sha256 is in the node's recorded facts: venv_lock_sha256, venv_user_lock_sha256);
each of its wheels is checked against that lock here, and only its RECORD is read (no
unpacking).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import pathlib
import tarfile
import time
import zipfile
from typing import Any

from .errors import DsclusterError

# The files of a layer's wheelhouse beside its wheels (ml_stack vars: __ml_stack_lock_files).
LOCK_FILES = ("requirements.lock", "lock.json")
# The locks the venv was installed from, kept in its prefix (ml_stack install.yml,
# install_user.yml), and the node wheelhouse's subdirectory of the user layer.
VENV_LOCKS = {"base": "dscluster-lock.json", "user": "dscluster-user-lock.json"}
USER_SUBDIR = "user"


def sha256(path: pathlib.Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def wheel_record(wheel: pathlib.Path) -> tuple[str, dict[str, str]]:
    """A wheel's .dist-info directory and its RECORD as site-packages paths -> hash field
    ("sha256=..."; "" for RECORD itself). `.data/purelib` and `.data/platlib` land in
    site-packages; `.data/scripts`, `headers` and `data` outside it (not listed)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            records = [
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")
            ]
            if len(records) != 1:
                raise DsclusterError(
                    f"{wheel} has {len(records)} .dist-info/RECORD files, not 1: it is no "
                    "wheel; remove it and provision again"
                )
            text = zf.read(records[0]).decode()
    except (OSError, zipfile.BadZipFile) as exc:
        raise DsclusterError(f"cannot read {wheel} as a wheel ({exc}); remove it") from exc
    files: dict[str, str] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        path, digest = row[0], (row[1] if len(row) > 1 else "")
        head, _, rest = path.partition("/")
        if head.endswith(".data"):
            kind, _, inner = rest.partition("/")
            if kind not in ("purelib", "platlib"):
                continue
            path = inner
        if digest and not digest.startswith("sha256="):
            raise DsclusterError(f"{wheel}'s RECORD hashes {path} with {digest.split('=')[0]}")
        files[path] = digest
    return records[0].split("/")[0], files


@dataclasses.dataclass(frozen=True)
class Layer:
    """One controller wheelhouse: its directory and lock.json."""

    directory: pathlib.Path
    lock: dict[str, Any]
    lock_sha256: str


def _layer(candidates: list[pathlib.Path], want: str, what: str, host: str) -> Layer:
    for lock in sorted(candidates):
        try:
            digest = sha256(lock)
        except OSError:
            continue
        if digest == want:
            return Layer(lock.parent, json.loads(lock.read_text()), digest)
    raise DsclusterError(
        f"no {what} on this controller has the lock {host}'s venv was installed from "
        f"(sha256 {want[:12]}…): provision the cluster from this controller, then bake"
    )


def controller_layers(
    cache: pathlib.Path, host: str, versions: dict[str, str]
) -> tuple[Layer, Layer | None]:
    """The base wheelhouse (and user layer) the node's venv was installed from, by the sha256
    of their lock.json as the node's facts record it."""
    base_sha = versions.get("venv_lock_sha256", "")
    if not base_sha:
        raise DsclusterError(
            f"{host}'s recorded facts name no lock its venv was installed from; provision it "
            "again with this dscluster, then bake"
        )
    base = _layer(list(cache.glob("wheelhouse/*/lock.json")), base_sha, "wheelhouse", host)
    user_sha = versions.get("venv_user_lock_sha256", "")
    user = None
    if user_sha:
        found = list(cache.glob(f"wheelhouse-user/{base.directory.name}/*/lock.json"))
        user = _layer(found, user_sha, "user layer", host)
    return base, user


def _wheels(layer: Layer) -> dict[str, dict[str, Any]]:
    """Each wheel of the layer, checked against its lock here: its dist-info and RECORD."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in sorted((layer.lock.get("wheels") or {}).items()):
        path = layer.directory / name
        if not path.is_file() or sha256(path) != entry.get("sha256"):
            raise DsclusterError(
                f"the controller's wheelhouse {layer.directory} has {name} "
                f"{'with another sha256 than' if path.is_file() else 'not, though it is in'} "
                f"its lock.json; remove {layer.directory} and provision again, then bake"
            )
        dist_info, files = wheel_record(path)
        out[name] = {"dist_info": dist_info, "files": files}
    return out


def _wheelhouse_files(layer: Layer) -> dict[str, str]:
    files = {name: str(e["sha256"]) for name, e in (layer.lock.get("wheels") or {}).items()}
    for name in LOCK_FILES:
        files[name] = sha256(layer.directory / name)
    return files


def build(
    *,
    host: str,
    venv: str,
    node_wheelhouse: str,
    wheelhouse_required: bool,
    base: Layer,
    user: Layer | None,
    system_wheels: str,
) -> dict[str, Any]:
    """The manifest verify_stack.py checks the node against."""
    wheels = _wheels(base)
    houses = [
        {
            "dir": node_wheelhouse,
            "required": wheelhouse_required,
            "files": _wheelhouse_files(base),
            "subdirs": [USER_SUBDIR] if user else [],
        }
    ]
    if user is not None:
        wheels |= _wheels(user)
        houses.append(
            {
                "dir": f"{node_wheelhouse}/{USER_SUBDIR}",
                "required": wheelhouse_required,
                "files": _wheelhouse_files(user),
                "subdirs": [],
            }
        )
    return {
        "node": host,
        "venv": venv,
        "prefix_files": {
            VENV_LOCKS["base"]: base.lock_sha256,
            VENV_LOCKS["user"]: user.lock_sha256 if user else "",
        },
        "wheelhouses": houses,
        "wheels": wheels,
        "system_wheels": system_wheels,
    }


def payload(script: bytes, manifest: dict[str, Any]) -> bytes:
    """The tar the node reads on stdin: verify_stack.py and manifest.json."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in (
            ("verify_stack.py", script),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


# On the node, as root: a root-only directory, the two files from stdin, the system python in
# isolated mode (no PYTHON* variables, no user site, not the script's directory first).
NODE_COMMAND = (
    'set -eu; d=$(mktemp -d); trap \'rm -rf "$d"\' EXIT; tar -x -C "$d" -f -; '
    '/usr/bin/python3 -I "$d/verify_stack.py" "$d/manifest.json"'
)


def verdict(stdout: str) -> dict[str, Any] | None:
    """verify_stack.py's JSON line (its last), or None where it printed none."""
    for line in reversed(stdout.splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "ok" in data:
            return data
    return None


def refusal(host: str, found: dict[str, Any], fix: str) -> str:
    """One line: the node, the first difference, how many, the fix."""
    first = (found.get("differs") or ["?"])[0]
    count = int(found.get("count") or 0)
    more = f" ({count} differences)" if count > 1 else ""
    return (
        f"{host}'s stack is not what the controller's wheelhouse holds: {first}{more}; "
        f"nothing was baked; {fix}"
    )


def fix_for(found: dict[str, Any], *, host: str, venv: str, wheelhouse: str, source: str) -> str:
    """What to remove on the node before it is provisioned again (the venv, its wheelhouse)."""
    differs = found.get("differs") or []
    what = [
        where
        for where in (venv, wheelhouse)
        if any(
            d == where or d.startswith(f"{where}/") or d.startswith(f"{where} ") for d in differs
        )
    ]
    gone = " and ".join(what) or venv
    return (
        f"remove {gone} on {host} and provision it again (dscluster provision -i {source} "
        f"--add {host}), or bake another --node"
    )

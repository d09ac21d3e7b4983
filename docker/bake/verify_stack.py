"""Check a node's stack against the controller's wheelhouse before `dscluster image bake`.

Run on the node as root by the system interpreter (`python3 -I`, never the venv's own python:
the venv is what is checked), with a manifest the controller made from its own wheelhouse
(python/src/dscluster/stack_manifest.py). Standard library only. An allow-list:

- each node wheelhouse holds exactly the controller lock's wheels and lock files, each with
  the controller's sha256, and nothing else (a required one must exist);
- every file of the venv's site-packages is one an installed wheel's RECORD lists, with the
  hash the controller's wheel says; allowed beside those: bytecode in `__pycache__`, and the
  files an installer writes into a dist-info it installed (INSTALLER_FILES);
- a distribution the venv got from the node's own Debian wheels (pip, from
  /usr/share/python-wheels: ml_stack's install.yml) counts only where that wheel file is
  root's and has the md5 dpkg recorded for it; its RECORD then says its files' hashes;
- the locks the venv was installed from (dscluster-lock.json ...) are the controller's.

Nothing is followed: a link where a file belongs is a difference. Prints one JSON line (ok,
the differences, the counts, the seconds) and exits 0 when everything matches, 1 when not.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import stat
import sys
import time
import zipfile

# What an installer writes into a distribution's .dist-info beside the wheel's own files
# (pip: INSTALLER, REQUESTED, RECORD, direct_url.json; uv also uv_cache.json).
INSTALLER_FILES = frozenset(
    {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json", "uv_cache.json"}
)
SHOWN = 20  # differences named in the JSON line (the count is of all)


def read_digest(path: str) -> bytes | None:
    """The sha256 of a regular file, opened without following a link; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        digest = hashlib.sha256()
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


def record_hash(digest: bytes) -> str:
    """A RECORD's hash field: sha256=<urlsafe base64, no padding>."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


class Check:
    def __init__(self) -> None:
        self.differs: list[str] = []
        self.wheels = 0  # wheelhouse files (wheels and locks) verified
        self.files = 0  # venv files verified by hash
        self.bytecode = 0
        self.system: list[str] = []

    def differ(self, path: str, why: str) -> None:
        self.differs.append(f"{path} ({why})")


def check_wheelhouse(check: Check, spec: dict) -> None:
    where = spec["dir"]
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        if spec.get("required"):
            check.differ(where, "missing")
        return
    if not stat.S_ISDIR(info.st_mode):
        check.differ(where, "not a directory")
        return
    files: dict[str, str] = spec["files"]
    subdirs = set(spec.get("subdirs") or ())
    found = set()
    for name in sorted(os.listdir(where)):
        path = os.path.join(where, name)
        if name in subdirs and stat.S_ISDIR(os.lstat(path).st_mode):
            continue
        if name not in files:
            check.differ(path, "not in the controller's wheelhouse")
            continue
        found.add(name)
        digest = read_digest(path)
        if digest is None:
            check.differ(path, "not a regular file")
        elif digest.hex() != files[name]:
            check.differ(path, "sha256 differs from the controller's")
        else:
            check.wheels += 1
    for name in sorted(set(files) - found):
        check.differ(os.path.join(where, name), "missing")


def dpkg_md5(path: str) -> str:
    """The md5 dpkg recorded for a file a package installed ("" when none did)."""
    rel = path.lstrip("/")
    info = "/var/lib/dpkg/info"
    try:
        names = sorted(n for n in os.listdir(info) if n.endswith(".md5sums"))
    except OSError:
        return ""
    for name in names:
        try:
            with open(os.path.join(info, name), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    md5, _, listed = line.rstrip("\n").partition("  ")
                    if listed == rel:
                        return md5
        except OSError:
            continue
    return ""


def wheel_record(zf: zipfile.ZipFile) -> tuple[str, dict[str, str]]:
    """A wheel's dist-info directory and its RECORD as site-packages paths -> hash."""
    records = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        return "", {}
    files: dict[str, str] = {}
    for row in csv.reader(io.TextIOWrapper(zf.open(records[0]), encoding="utf-8")):
        if not row:
            continue
        path, digest = row[0], row[1] if len(row) > 1 else ""
        head, _, rest = path.partition("/")
        if head.endswith(".data"):
            kind, _, inner = rest.partition("/")
            if kind not in ("purelib", "platlib"):
                continue  # scripts, headers, data: outside site-packages
            path = inner
        files[path] = digest
    return records[0].split("/")[0], files


def system_wheels(check: Check, where: str, site: str, installed: set[str]) -> dict[str, set]:
    """Files of the distributions the venv has from the node's Debian wheels (each wheel root's
    and matching dpkg's md5): site-packages path -> hashes."""
    expected: dict[str, set] = {}
    try:
        names = sorted(n for n in os.listdir(where) if n.endswith(".whl"))
    except OSError:
        return expected
    for name in names:
        path = os.path.join(where, name)
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            continue
        try:
            with zipfile.ZipFile(path) as zf:
                dist_info, files = wheel_record(zf)
        except (OSError, zipfile.BadZipFile):
            continue
        if not dist_info or dist_info in installed:
            continue
        if not os.path.isdir(os.path.join(site, dist_info)):
            continue
        md5 = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                md5.update(block)
        if md5.hexdigest() != dpkg_md5(path):
            check.differ(path, "differs from the md5 dpkg recorded")
            continue
        installed.add(dist_info)
        check.system.append(name)
        for rel, digest in files.items():
            expected.setdefault(rel, set()).add(digest)
    return expected


def site_packages(venv: str) -> list[str]:
    lib = os.path.join(venv, "lib")
    try:
        names = sorted(os.listdir(lib))
    except OSError:
        return []
    return [
        os.path.join(lib, n, "site-packages")
        for n in names
        if n.startswith("python") and os.path.isdir(os.path.join(lib, n, "site-packages"))
    ]


def expected_files(check: Check, manifest: dict, site: str) -> tuple[dict, set]:
    """Site-packages path -> the hashes the installed wheels' RECORDs give it, and those
    wheels' dist-info directories (a wheel counts as installed where its dist-info is)."""
    expected: dict[str, set] = {}
    installed: set[str] = set()
    for wheel in manifest["wheels"].values():
        if os.path.isdir(os.path.join(site, wheel["dist_info"])):
            installed.add(wheel["dist_info"])
            for rel, digest in wheel["files"].items():
                expected.setdefault(rel, set()).add(digest)
    if manifest.get("system_wheels"):
        found = system_wheels(check, manifest["system_wheels"], site, installed)
        for rel, digests in found.items():
            expected.setdefault(rel, set()).update(digests)
    return expected, installed


def check_file(check: Check, path: str, rel: str, expected: dict, installed: set) -> None:
    """One file of site-packages against the allow-list."""
    parent, _, name = rel.rpartition("/")
    if rel in expected:
        digest = read_digest(path)
        if digest is None:
            check.differ(path, "not a regular file")
        elif rel.endswith(".dist-info/RECORD") and "" in expected[rel]:
            check.files += 1  # the installer writes its own RECORD
        elif record_hash(digest) in expected[rel]:
            check.files += 1
        else:
            check.differ(path, "changed")
    elif os.path.islink(path):
        check.differ(path, "a link, not from any wheel")
    elif parent.rpartition("/")[2] == "__pycache__" and name.endswith(".pyc"):
        check.bytecode += 1
    elif parent in installed and name in INSTALLER_FILES:
        check.files += 1
    else:
        check.differ(path, "not from any wheel")


def check_venv(check: Check, manifest: dict) -> None:
    venv = manifest["venv"]
    for name, want in sorted((manifest.get("prefix_files") or {}).items()):
        digest = read_digest(os.path.join(venv, name))
        if (digest.hex() if digest else "") != want:
            why = "not the controller's lock" if want else "no lock of the controller's"
            check.differ(os.path.join(venv, name), why)
    sites = site_packages(venv)
    if len(sites) != 1:
        check.differ(os.path.join(venv, "lib"), f"{len(sites)} site-packages, not 1")
        return
    site = sites[0]
    expected, installed = expected_files(check, manifest, site)
    # every file and link under site-packages, by its path there, in sorted order
    found: dict[str, str] = {}
    for top, dirs, files in os.walk(site):
        rel_top = os.path.relpath(top, site)
        rel_top = "" if rel_top == "." else rel_top + "/"
        links = [d for d in dirs if os.path.islink(os.path.join(top, d))]
        dirs[:] = [d for d in dirs if d not in links]  # os.walk would not enter them either
        for name in files + links:
            found[rel_top + name] = os.path.join(top, name)
    for rel in sorted(set(found) | set(expected)):
        if rel not in found:
            check.differ(os.path.join(site, rel), "missing")
        else:
            check_file(check, found[rel], rel, expected, installed)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(json.dumps({"ok": False, "error": "usage: verify_stack.py MANIFEST"}))
        return 2
    started = time.monotonic()
    with open(argv[1], encoding="utf-8") as fh:
        manifest = json.load(fh)
    check = Check()
    for spec in manifest.get("wheelhouses") or []:
        check_wheelhouse(check, spec)
    check_venv(check, manifest)
    print(
        json.dumps(
            {
                "ok": not check.differs,
                "count": len(check.differs),
                "differs": check.differs[:SHOWN],
                "wheels": check.wheels,
                "files": check.files,
                "bytecode": check.bytecode,
                "system": check.system,
                "seconds": round(time.monotonic() - started, 2),
            }
        )
    )
    return 0 if not check.differs else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

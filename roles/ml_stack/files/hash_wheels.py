#!/usr/bin/env python3
"""Digests of a wheelhouse's wheels, the download that only takes what a hash lock pins, and
the check of a wheelhouse against its locks.

    hash_wheels.py DIR
        sha256 and size of every wheel in DIR, as JSON on stdout, sorted by file name.
    hash_wheels.py download --lock LOCK --dest DIR [--require REQ]... [--exclude NAME]...
                            [--index-for NAME=URL]... -- PIP...
        `PIP download --no-deps` of exactly the pins of LOCK (a `--generate-hashes`
        requirements file) into DIR/.download; each file is checked against LOCK's hashes
        before it is moved into DIR. Every REQ (what the role asks for) must be satisfied by
        a pin of LOCK; NAME (the DeepSpeed sdist) is left to its own download. The pin of a
        NAME given --index-for is downloaded on its own with `--extra-index-url URL`
        (PyTorch's index for torch), so that index is asked for that package alone.
    hash_wheels.py verify DIR [--lock LOCK] [--lock-json JSON] [--built GLOB]
                   [--sdist PATH] [--sdist-sha256 HEX]
        Every wheel of DIR against LOCK (its pins) and JSON (the wheelhouse's lock.json, one
        digest per file), PATH against LOCK's pin for it or HEX. A wheel matching GLOB (the
        DeepSpeed wheel built here) needs no pin in LOCK.

A re-converge used to hash every wheel again (torch alone is hundreds of MB). The digests are
kept in DIR/.wheel-hashes.json with each file's size, mtime, ctime and inode; a wheel whose
four are unchanged keeps its recorded digest, any other is hashed again. A change of content
with the old mtime put back (`touch -r`) still moves ctime, which only the clock sets, and the
record is believed only when it and DIR are this user's own, not links and writable by no one
else (whoever could forge it could as well have written the wheels).

Refusals are one line on stderr naming the file and both digests; the exit status is 1.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tempfile

from filedigest import sha256
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

CACHE = ".wheel-hashes.json"
STAGING = ".download"


class Refused(Exception):
    """One line for the operator: the value and the fix."""


def private(path: pathlib.Path) -> bool:
    """path is ours, no link, and no one else can write it."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return (
        not stat.S_ISLNK(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def load_cache(path: pathlib.Path) -> dict[str, dict]:
    if not (private(path.parent) and private(path)):
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stamp(st: os.stat_result) -> dict:
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "ino": st.st_ino,
    }


def hash_wheels(folder: pathlib.Path) -> list[dict]:
    cache_path = folder / CACHE
    cache = load_cache(cache_path)
    fresh: dict[str, dict] = {}
    out = []
    for wheel in sorted(folder.glob("*.whl")):
        st = wheel.stat()
        now = stamp(st)
        known = cache.get(wheel.name) or {}
        same = all(known.get(k) == v for k, v in now.items())
        digest = known.get("sha256", "") if same else ""
        if not isinstance(digest, str) or len(digest) != 64:
            digest = sha256(wheel)
        fresh[wheel.name] = {**now, "sha256": digest}
        out.append({"name": wheel.name, "sha256": digest, "size": st.st_size})
    if fresh != cache and private(folder):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=CACHE + ".")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(fresh, fh, indent=1, sort_keys=True)
        os.replace(tmp, cache_path)
    return out


# ---- hash locks (pip's --require-hashes format, as uv pip compile --generate-hashes writes) ----


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_key(version: str) -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


def read_lock(path: pathlib.Path) -> dict[str, dict]:
    """{canonical name: {"version": V, "hashes": [sha256, ...]}} of a hash lock."""
    text = path.read_text(encoding="utf-8")
    pins: dict[str, dict] = {}
    for raw in re.sub(r"\\\n", " ", text).splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        tokens = line.split()
        pin = tokens[0].split(";", 1)[0]
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;]+)", pin)
        hashes = [t.split(":", 1)[1] for t in tokens[1:] if t.startswith("--hash=sha256:")]
        if not match or not hashes:
            raise Refused(
                f"{path}: line {line!r} is not `name==version --hash=sha256:...`;"
                " write the lock with `uv pip compile --generate-hashes`"
            )
        pins[canonical(match[1])] = {"version": match[2], "hashes": hashes}
    if not pins:
        raise Refused(f"{path} pins nothing; write it with `uv pip compile --generate-hashes`")
    return pins


def dist_of(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel or sdist file name."""
    if filename.endswith(".whl"):
        name, version = filename.split("-")[:2]
    else:
        stem = re.sub(r"\.(tar\.gz|zip|tar\.bz2|tgz)$", "", filename)
        name, _, version = stem.rpartition("-")
    return canonical(name), version_key(version)


def expected_text(hashes: list[str]) -> str:
    return hashes[0] if len(hashes) == 1 else "one of " + ", ".join(hashes)


def check_against_lock(path: pathlib.Path, digest: str, lock: dict[str, dict], lock_path) -> bool:
    """Refuse path unless its digest is one the lock pins for it; False when the lock has no pin."""
    name, version = dist_of(path.name)
    pin = lock.get(name)
    if pin is None or version_key(pin["version"]) != version:
        return False
    if digest not in pin["hashes"]:
        raise Refused(
            f"{path}: sha256 {digest}, the lock {lock_path} expects {expected_text(pin['hashes'])};"
            f" the file changed after the lock was written: remove it and converge again"
        )
    return True


def check_requirements(requires: list[str], lock: dict[str, dict], lock_path) -> None:
    for text in requires:
        req = Requirement(text)
        pin = lock.get(canonical(req.name))
        if pin is None or not req.specifier.contains(Version(pin["version"]), prereleases=True):
            have = f"pins {req.name}=={pin['version']}" if pin else f"does not pin {req.name}"
            raise Refused(
                f"the base layer asks for {text!r} and the lock {lock_path} {have};"
                " make a lock for these requirements (`uv pip compile --generate-hashes`,"
                " see ml_stack_base_lock_file) and set ml_stack_base_lock_file to it"
            )


def index_for(item: str) -> tuple[str, str]:
    name, sep, url = item.partition("=")
    if not sep or not name or not url:
        raise Refused(
            f"--index-for {item!r}: give NAME=URL, e.g. torch=https://download.pytorch.org/whl/cpu"
        )
    return canonical(name), url


def download(args: argparse.Namespace) -> int:
    lock_path = pathlib.Path(args.lock)
    lock = read_lock(lock_path)
    check_requirements(args.require, lock, lock_path)
    skip = {canonical(n) for n in args.exclude}
    dest = pathlib.Path(args.dest)
    staging = dest / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    indexes = dict(index_for(item) for item in args.index_for)
    wanted = [n for n in sorted(lock) if n not in skip]
    # One pip run for the pins without an index of their own, then one per such pin.
    runs = [([n for n in wanted if n not in indexes], [])]
    runs += [([n], ["--extra-index-url", indexes[n]]) for n in wanted if n in indexes]
    pins = staging / "pins.txt"
    for names, extra in runs:
        if not names:
            continue
        pins.write_text("".join(f"{n}=={lock[n]['version']}\n" for n in names), encoding="utf-8")
        pip = [*args.pip, *extra, "--no-deps", "--dest", str(staging), "-r", str(pins)]
        proc = subprocess.run(pip, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            said = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
            raise Refused(
                f"pip download of the pins of {lock_path} failed (exit {proc.returncode}):"
                f" {said[-1] if said else 'no message'}"
            )
    pins.unlink()
    files = sorted(staging.iterdir())
    got = {dist_of(f.name)[0] for f in files}
    missing = sorted(set(lock) - skip - got)
    if missing:
        raise Refused(f"pip download brought no file for {', '.join(missing)} of {lock_path}")
    for f in files:
        if not check_against_lock(f, sha256(f), lock, lock_path):
            raise Refused(f"{f}: pip downloaded a file {lock_path} does not pin; remove it")
    for f in files:
        os.replace(f, dest / f.name)
    staging.rmdir()
    return 0


def verify(args: argparse.Namespace) -> int:
    folder = pathlib.Path(args.dir)
    lock_path = pathlib.Path(args.lock) if args.lock else None
    lock = read_lock(lock_path) if lock_path else {}
    recorded: dict[str, dict] = {}
    if args.lock_json:
        recorded = json.loads(pathlib.Path(args.lock_json).read_text(encoding="utf-8"))["wheels"]
    digests = {w["name"]: w["sha256"] for w in hash_wheels(folder)}
    for name, entry in sorted(recorded.items()):
        if name not in digests:
            raise Refused(
                f"{folder / name}: missing, {args.lock_json} records sha256 {entry['sha256']};"
                f" remove {folder} and converge again"
            )
    for name, digest in sorted(digests.items()):
        path = folder / name
        entry = recorded.get(name)
        if entry is not None and entry["sha256"] != digest:
            raise Refused(
                f"{path}: sha256 {digest}, {args.lock_json} expects {entry['sha256']};"
                f" the file changed after the lock was written: remove {folder} and converge again"
            )
        # The wheel built here from the sdist shares its pin (deepspeed==V), not its digest.
        built = any(fnmatch.fnmatch(name, g) for g in args.built)
        if built:
            known = entry is not None or not recorded
        elif lock:
            known = check_against_lock(path, digest, lock, lock_path)
        else:
            known = entry is not None or not recorded
        if not known:
            raise Refused(f"{path} (sha256 {digest}) is pinned by no lock of {folder}; remove it")
    if args.sdist:
        verify_sdist(pathlib.Path(args.sdist), args.sdist_sha256, lock, lock_path)
    return 0


def verify_sdist(path: pathlib.Path, expected: str, lock: dict[str, dict], lock_path) -> None:
    digest = sha256(path)
    if expected:
        if digest != expected.lower():
            raise Refused(
                f"{path}: sha256 {digest}, the role's vars expect {expected};"
                " remove it and converge again"
            )
    elif not (lock and check_against_lock(path, digest, lock, lock_path)):
        raise Refused(f"{path} (sha256 {digest}) has no pin in {lock_path}; add one")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[1] not in ("-h", "--help"):
        print(json.dumps(hash_wheels(pathlib.Path(argv[1]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    dl = sub.add_parser("download")
    dl.add_argument("--lock", required=True)
    dl.add_argument("--dest", required=True)
    dl.add_argument("--require", action="append", default=[])
    dl.add_argument("--exclude", action="append", default=[])
    dl.add_argument("--index-for", action="append", default=[])
    dl.add_argument("pip", nargs=argparse.REMAINDER)
    ve = sub.add_parser("verify")
    ve.add_argument("dir")
    ve.add_argument("--lock", default="")
    ve.add_argument("--lock-json", default="")
    ve.add_argument("--built", action="append", default=[])
    ve.add_argument("--sdist", default="")
    ve.add_argument("--sdist-sha256", default="")
    args = parser.parse_args(argv[1:])
    if args.command == "download":
        args.pip = args.pip[1:] if args.pip[:1] == ["--"] else args.pip
    try:
        return download(args) if args.command == "download" else verify(args)
    except Refused as err:
        print(err, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

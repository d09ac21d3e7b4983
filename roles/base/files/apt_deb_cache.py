#!/usr/bin/python3
"""Share downloaded .debs between nodes through a directory they all mount (run as root).

  apt_deb_cache.py CACHE_DIR [--archives DIR] [--no-install-recommends] PACKAGE...

Run before `apt-get install PACKAGE...`, it leaves every archive that install needs in apt's
archives directory, downloading each at most once for all the nodes that share CACHE_DIR:

1. asks apt which archives the install needs (`--print-uris`: file name and size) and their
   SHA256 (`apt-cache show NAME=VERSION`), both from the signed package lists;
2. copies into apt's archives those the cache holds with that size and SHA256 (a file that
   does not match is not used: apt itself checks only the size of an archive in place);
3. downloads the rest (`apt-get install --download-only`; no dpkg run, so an image's
   "remove the .debs after dpkg" hook does not take them before step 4);
4. adds what it downloaded to the cache, each written under a temporary name and renamed,
   so a node reading the cache never sees half a file; an older version of the same package
   and architecture is removed from the cache then, and so is a temporary an hour old (a
   node stopped mid-copy).

The cache never decides the install: a missing or read-only CACHE_DIR, or a failed download,
is reported and apt's own install (run next) downloads or fails as it would without it.
Prints one JSON object: needed, from_cache, downloaded, added, and problem ("" when none).
"""

import contextlib
import hashlib
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse

APT_GET = ["apt-get", "-qq", "-y", "-o", "Dpkg::Use-Pty=0"]
# 'URI' FILE SIZE ALGORITHM:HEX, one line per archive apt would download.
URI_LINE = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) [A-Za-z0-9]+:[0-9a-f]+$")
# A temporary in the cache older than this is a copy whose node stopped mid-way.
STALE_TEMPORARY = 3600
# name_version_arch.deb; a Debian package name and version hold no underscore.
DEB_NAME = re.compile(r"^(?P<name>[^_/]+)_(?P<version>[^_/]+)_(?P<arch>[^_/]+)\.deb$")


def digest(path: pathlib.Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def needed(packages: list[str], recommends: list[str]) -> list[dict]:
    """The archives `apt-get install PACKAGES` would download (none already in archives), each
    with its SHA256 from the package lists ("" where apt-cache names none: never cached)."""
    out = subprocess.run(
        [*APT_GET, *recommends, "--print-uris", "install", *packages],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = []
    for line in out.splitlines():
        match = URI_LINE.match(line.strip())
        deb = DEB_NAME.match(match["file"]) if match else None
        if match and deb:
            found.append(
                {
                    "file": match["file"],
                    "size": int(match["size"]),
                    "pool": urllib.parse.unquote(match["uri"].rsplit("/", 1)[-1]),
                    "pin": f"{deb['name']}={urllib.parse.unquote(deb['version'])}",
                }
            )
    sha256 = pool_sha256([need["pin"] for need in found])
    for need in found:
        need.update(alg="sha256", hex=sha256.get(need.pop("pool"), ""))
        del need["pin"]
    return found


def pool_sha256(pins: list[str]) -> dict[str, str]:
    """Pool file name -> SHA256 of the records `apt-cache show NAME=VERSION...` prints.

    `--print-uris` gives one hash, MD5Sum on bookworm's apt, and apt does not check an
    archive it finds in place again (only its size): the SHA256 the signed lists hold is
    what a cached file has to match."""
    if not pins:
        return {}
    out = subprocess.run(
        ["apt-cache", "show", *pins], check=False, capture_output=True, text=True
    ).stdout
    found = {}
    for record in out.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z0-9-]+): *(.*)$", record, flags=re.MULTILINE))
        if fields.get("Filename") and re.fullmatch(r"[0-9a-f]{64}", fields.get("SHA256", "")):
            found[fields["Filename"].rsplit("/", 1)[-1]] = fields["SHA256"]
    return found


def matches(path: pathlib.Path, need: dict) -> bool:
    """path has the size and the (known) hash of the archive apt needs."""
    try:
        same_size = path.stat().st_size == need["size"]
        return bool(need["hex"]) and same_size and digest(path, need["alg"]) == need["hex"]
    except OSError:
        return False


def copy_atomic(src: pathlib.Path, dest: pathlib.Path) -> None:
    """src to dest through a temporary name in dest's directory, renamed into place."""
    tmp = dest.with_name(f".{dest.name}.{socket.gethostname()}.{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def drop_other_versions(cache: pathlib.Path, kept: dict[tuple[str, str], str]) -> None:
    """Remove each cached archive of a (package, architecture) in `kept` but another version."""
    for old in cache.glob("*.deb"):
        match = DEB_NAME.match(old.name)
        if match and kept.get((match["name"], match["arch"]), old.name) != old.name:
            with contextlib.suppress(OSError):
                old.unlink()


USAGE = "usage: apt_deb_cache.py CACHE_DIR [--archives DIR] [--no-install-recommends] PACKAGE..."


def parse(argv: list[str]) -> tuple[pathlib.Path, pathlib.Path, list[str], list[str]] | None:
    """(cache, archives, recommends option, packages), or None on a usage error."""
    args = list(argv)
    archives = pathlib.Path("/var/cache/apt/archives")
    if "--archives" in args:
        i = args.index("--archives")
        if i + 1 >= len(args):
            return None
        archives = pathlib.Path(args[i + 1])
        del args[i : i + 2]
    recommends = []
    if "--no-install-recommends" in args:
        args.remove("--no-install-recommends")
        recommends = ["--no-install-recommends"]
    if len(args) < 2 or any(a.startswith("-") for a in args):
        return None
    return pathlib.Path(args[0]), archives, recommends, args[1:]


def seed(cache: pathlib.Path, archives: pathlib.Path, wanted: list[dict], report: dict) -> list:
    """Copy the matching cached archives in; returns the archives still to download."""
    missing = []
    for need in wanted:
        cached = cache / need["file"]
        if matches(cached, need):
            try:
                copy_atomic(cached, archives / need["file"])
            except OSError:
                pass
            else:
                report["from_cache"] += 1
                continue
        missing.append(need)
    return missing


def sweep_temporaries(cache: pathlib.Path, now: float) -> None:
    """Remove what copy_atomic left of a copy that never finished (its node stopped
    mid-copy): temporaries untouched for STALE_TEMPORARY seconds."""
    for tmp in cache.glob(".*.deb.*"):
        with contextlib.suppress(OSError):
            if now - tmp.stat().st_mtime > STALE_TEMPORARY:
                tmp.unlink()


def keep(cache: pathlib.Path, archives: pathlib.Path, missing: list[dict], report: dict) -> None:
    """Count what the download brought and add it to the cache."""
    got = [need for need in missing if (archives / need["file"]).is_file()]
    report["downloaded"] = len(got)
    if not cache.is_dir():
        return
    sweep_temporaries(cache, time.time())
    kept = {}
    for need in got:
        if not matches(archives / need["file"], need):
            continue
        try:
            copy_atomic(archives / need["file"], cache / need["file"])
        except OSError as err:
            report["problem"] = report["problem"] or f"cannot add to {cache}: {err.strerror}"
            continue
        report["added"] += 1
        deb = DEB_NAME.match(need["file"])
        kept[(deb["name"], deb["arch"])] = need["file"]  # needed() took only such names
    drop_other_versions(cache, kept)


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    cache, archives, recommends, packages = parsed
    report = {"needed": 0, "from_cache": 0, "downloaded": 0, "added": 0, "problem": ""}
    try:
        wanted = needed(packages, recommends)
    except subprocess.CalledProcessError as err:
        report["problem"] = f"apt-get --print-uris failed: {err.stderr.strip()[-300:]}"
        print(json.dumps(report))
        return 0
    report["needed"] = len(wanted)
    if cache.is_dir():
        missing = seed(cache, archives, wanted, report)
    else:
        report["problem"] = f"no cache directory {cache}"
        missing = wanted
    if missing:
        download = subprocess.run(
            [*APT_GET, *recommends, "--download-only", "install", *packages],
            check=False,
            capture_output=True,
            text=True,
        )
        if download.returncode != 0:
            err = download.stderr.strip()[-300:]
            report["problem"] = f"apt-get --download-only failed: {err}"
        keep(cache, archives, missing, report)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

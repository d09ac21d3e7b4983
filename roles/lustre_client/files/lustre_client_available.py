#!/usr/bin/env python3
"""List the Lustre client builds a repository offers, without touching the node's apt setup.

    lustre_client_available.py --url URL --suite SUITE [--component C ...] --key-url URL

Runs `apt-get update` against that one repository with a private, temporary apt state
(source list, lists directory, key; nothing under /etc/apt or /var/lib/apt is read or
written except apt.conf.d settings), so apt itself checks the repository's signature with the
given key. Then reads the downloaded Packages indexes and prints one JSON object:

    {"modules": {"<kernel>": ["<version>", ...]},   # lustre-client-modules-<kernel>
     "utils": ["<version>", ...],                   # lustre-client-utils
     "error": ""}                                   # apt's own words when the read failed

Versions are sorted oldest first with dpkg's version order. Exit status 0 whenever JSON was
printed; the caller decides what an empty or failed result means.
"""

import argparse
import functools
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

MODULES = re.compile(r"^lustre-client-modules-([0-9][a-z0-9+.-]*)$")


def dpkg_cmp(a, b):
    if a == b:
        return 0
    lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b], check=False).returncode
    return -1 if lt == 0 else 1


def read_packages(lists_dir):
    """(package, version) pairs from every Packages index apt downloaded."""
    pairs = []
    for path in glob.glob(os.path.join(lists_dir, "*_Packages")):
        name = version = None
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in [*fh, "\n"]:
                if line.startswith("Package:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                elif not line.strip():
                    if name and version:
                        pairs.append((name, version))
                    name = version = None
    return pairs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--component", action="append", default=[])
    parser.add_argument("--key-url", required=True)
    args = parser.parse_args()

    result = {"modules": {}, "utils": [], "error": ""}
    tmp = tempfile.mkdtemp(prefix="lustre-client-preflight-")
    try:
        lists = os.path.join(tmp, "lists")
        parts = os.path.join(tmp, "sources.list.d")
        os.makedirs(os.path.join(lists, "partial"))
        os.makedirs(parts)
        key = os.path.join(tmp, "repository-key.asc")  # apt reads armored keys by suffix
        apt_opts = [
            "-o", f"Dir::Etc::SourceList={os.path.join(tmp, 'sources.list')}",
            "-o", f"Dir::Etc::SourceParts={parts}",
            "-o", f"Dir::State::Lists={lists}",
            "-o", "Dir::Cache::pkgcache=",
            "-o", "Dir::Cache::srcpkgcache=",
            "-o", "APT::Sandbox::User=root",
            "-o", "Acquire::Languages=none",
        ]  # fmt: skip
        fetch = subprocess.run(
            ["/usr/lib/apt/apt-helper", *apt_opts, "download-file", args.key_url, key],
            capture_output=True,
            text=True,
            check=False,
        )
        if fetch.returncode != 0:
            result["error"] = f"cannot download the key {args.key_url}: " + " ".join(
                (fetch.stderr or fetch.stdout).split()
            )
            return result
        with open(os.path.join(tmp, "sources.list"), "w") as fh:
            line = " ".join([args.url, args.suite, *args.component])
            fh.write(f"deb [signed-by={key}] {line}\n")
        update = subprocess.run(
            ["apt-get", *apt_opts, "-q", "update"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
        problems = [
            ln.strip() for ln in update.stdout.splitlines() + update.stderr.splitlines()
            if ln.startswith(("E:", "W:", "Err:"))
        ]  # fmt: skip
        pairs = read_packages(lists)
        if update.returncode != 0 or not pairs:
            result["error"] = " ".join(problems) or f"apt-get update exited {update.returncode}"
            return result
        order = functools.cmp_to_key(dpkg_cmp)
        for name, version in pairs:
            match = MODULES.match(name)
            if match:
                result["modules"].setdefault(match.group(1), []).append(version)
            elif name == "lustre-client-utils":
                result["utils"].append(version)
        result["modules"] = {k: sorted(set(v), key=order) for k, v in result["modules"].items()}
        result["utils"] = sorted(set(result["utils"]), key=order)
        return result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    json.dump(main(), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")

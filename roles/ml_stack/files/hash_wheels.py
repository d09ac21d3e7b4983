#!/usr/bin/env python3
"""sha256 and size of every wheel in a wheelhouse, as JSON on stdout, sorted by file name.

A re-converge used to hash every wheel again (torch alone is hundreds of MB). The digests are
kept in DIR/.wheel-hashes.json with each file's size and mtime; a wheel whose size and mtime
are unchanged keeps its recorded digest, any other is hashed again.

Usage: hash_wheels.py DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import tempfile

CACHE = ".wheel-hashes.json"


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_cache(path: pathlib.Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def hash_wheels(folder: pathlib.Path) -> list[dict]:
    cache_path = folder / CACHE
    cache = load_cache(cache_path)
    fresh: dict[str, dict] = {}
    out = []
    for wheel in sorted(folder.glob("*.whl")):
        st = wheel.stat()
        known = cache.get(wheel.name) or {}
        if known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns:
            digest = known.get("sha256", "")
        else:
            digest = ""
        if len(digest) != 64:
            digest = sha256(wheel)
        fresh[wheel.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        out.append({"name": wheel.name, "sha256": digest, "size": st.st_size})
    if fresh != cache:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=CACHE + ".")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(fresh, fh, indent=1, sort_keys=True)
        os.replace(tmp, cache_path)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    print(json.dumps(hash_wheels(pathlib.Path(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Pack the wheels nodes lack into archives, one per distinct set (run on the controller).

ml_stack used to copy each missing wheel with its own transfer (about 0.8 s of round trips
per wheel, 25 wheels); one archive per node is one transfer and one unpack. Nodes that lack
the same wheels (a new cluster, a shared wheelhouse) share an archive. The archives are
uncompressed (wheels are zip files already); members are owned by root, mode 0644.

Usage: pack_wheels.py SRC_DIR OUT_DIR [FILE...] < JSON
JSON on stdin: a list of lists of wheel file names in SRC_DIR (one list per node).
FILE: other files of SRC_DIR (the layer's requirements.lock and lock.json) put at the end of
every archive, after the wheels: unpacked last, as their own copy ran after the wheels' did,
and one transfer fewer per layer for a node that lacked wheels.
Prints {"<the sorted names joined by spaces>": "<archive path>", ...}.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tarfile


def _plain(name: str) -> bool:
    return bool(name) and "/" not in name and not name.startswith(".")


def pack(
    src: pathlib.Path, out: pathlib.Path, sets: list[list[str]], extra: tuple[str, ...] = ()
) -> dict[str, str]:
    for name in {name for names in sets for name in names}:  # before any archive is begun
        if not _plain(name) or not name.endswith(".whl"):
            raise SystemExit(f"pack_wheels: {name!r} is not a wheel file name")
    for name in extra:
        if not _plain(name) or name.endswith(".whl") or not (src / name).is_file():
            raise SystemExit(f"pack_wheels: {name!r} is not a file of {src} beside the wheels")
    made: dict[str, str] = {}
    for names in sets:
        key = " ".join(sorted(names))
        if not names or key in made:
            continue
        archive = out / f"wheels-{len(made)}.tar"
        with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
            for name in [*sorted(names), *extra]:
                path = src / name
                info = tar.gettarinfo(str(path), arcname=name)
                info.mode, info.uid, info.gid, info.uname, info.gname = 0o644, 0, 0, "root", "root"
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
        made[key] = str(archive)
    return made


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    sets = json.load(sys.stdin)
    made = pack(pathlib.Path(argv[1]), pathlib.Path(argv[2]), sets, tuple(argv[3:]))
    print(json.dumps(made, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

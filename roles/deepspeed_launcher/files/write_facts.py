#!/usr/bin/env python3
"""Write the recorded facts of the hosts whose controller file differs (tasks/export.yml).

One process on the controller for every such host, instead of a copy module run per host
(about 0.4 s each, 16 at once on a 16-node cluster). Each file is written whole, to a
temporary file in its directory and renamed over the old one, mode 0644; a missing
directory is made (0755). A file that already holds the content is left as it is.

  python3 write_facts.py < JSON

JSON on stdin: a list of {"path": "<absolute path of a .json file>", "content": "<text>"}.
Prints the list of paths written, as JSON.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile


def write(path: pathlib.Path, content: str) -> bool:
    try:
        if path.read_text() == content:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def main() -> int:
    entries = json.load(sys.stdin)
    paths = [pathlib.Path(entry["path"]) for entry in entries]
    for path in paths:  # all refused before any is written
        if not path.is_absolute() or path.suffix != ".json" or ".." in path.parts:
            message = f"write_facts: {str(path)!r} is not an absolute path of a .json file"
            print(message, file=sys.stderr)
            return 2
    written = [str(p) for p, e in zip(paths, entries, strict=True) if write(p, e["content"])]
    print(json.dumps(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())

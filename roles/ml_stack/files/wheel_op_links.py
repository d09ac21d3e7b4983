#!/usr/bin/env python3
"""Print, as JSON, the shared libraries each pre-built op of a DeepSpeed wheel links.

Usage: wheel_op_links.py WHEEL. Output: {"async_io": ["libaio.so.1", ...], "cpu_adam": [...]}.
An op's name is its module's (deepspeed/ops/aio/async_io_op.*.so -> async_io); the list is
the DT_NEEDED entries `readelf -d` reads from it. The ml_stack build checks that every op it
asked for is in the wheel and that async_io records libaio (an op that does not load at
runtime is worse than none: DeepSpeed then neither JIT-compiles nor falls back).
"""

import json
import re
import subprocess
import sys
import tempfile
import zipfile

OP_SO = re.compile(r"^deepspeed/ops/.+/(?P<op>[A-Za-z0-9_]+)_op\.[^/]*\.so$")
NEEDED = re.compile(r"\(NEEDED\)\s+Shared library: \[(?P<lib>[^\]]+)\]")


def needed(path: str) -> list[str]:
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True)
    return NEEDED.findall(out.stdout)


def op_links(wheel: str) -> dict[str, list[str]]:
    links: dict[str, list[str]] = {}
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
        for name in zf.namelist():
            match = OP_SO.match(name)
            if match:
                links[match["op"]] = needed(zf.extract(name, tmp))
    return links


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} WHEEL", file=sys.stderr)
        return 2
    json.dump(op_links(argv[1]), sys.stdout, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Time one node's install of the base lock with pip and with uv, into fresh venvs (JSON).

  install_bench.py WHEELHOUSE [--uv /opt/dscluster/tools/bin/uv] [--python /usr/bin/python3]

Both installs are the role's own: no index, the wheelhouse as --find-links, hashes
required, no cache (pip --no-cache-dir, uv --no-cache), so the two start equally cold; pip
runs --isolated from any pip.conf or PIP_* variable. The venvs are
made before the clock starts and removed afterwards. Prints
{"pip_s": .., "uv_s": .., "packages": .., "pip": "<version>", "uv": "<version>"}; exit 1
when an install fails. Installed by the ml_stack role to /opt/dscluster/bin (stdlib only).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time


def pip_argv(venv: pathlib.Path, wheelhouse: pathlib.Path) -> list[str]:
    return [
        str(venv / "bin" / "pip"), "install", "--isolated", "--disable-pip-version-check",
        "--quiet", "--no-cache-dir", "--no-index", "--find-links", str(wheelhouse),
        "--require-hashes", "--requirement", str(wheelhouse / "requirements.lock"),
    ]  # fmt: skip


def uv_argv(uv: str, venv: pathlib.Path, wheelhouse: pathlib.Path) -> list[str]:
    return [
        uv, "pip", "install", "--quiet", "--no-cache", "--python", str(venv / "bin" / "python"),
        "--no-index", "--find-links", str(wheelhouse), "--require-hashes",
        "--requirement", str(wheelhouse / "requirements.lock"),
    ]  # fmt: skip


def timed(argv: list[str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{argv[0]} {argv[1]} {argv[2]} failed ({proc.returncode}): {tail}")
    return round(elapsed, 2)


def version(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.split()
    return out[1] if len(out) > 1 else ""


def packages(lock: pathlib.Path) -> int:
    return sum(1 for line in lock.read_text().splitlines() if "==" in line and line[:1] != "#")


def bench(wheelhouse: pathlib.Path, uv: str, python: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="install-bench-") as tmp:
        venvs = {tool: pathlib.Path(tmp) / tool for tool in ("pip", "uv")}
        for venv in venvs.values():
            subprocess.run([python, "-m", "venv", str(venv)], check=True)
        return {
            "pip_s": timed(pip_argv(venvs["pip"], wheelhouse)),
            "uv_s": timed(uv_argv(uv, venvs["uv"], wheelhouse)),
            "packages": packages(wheelhouse / "requirements.lock"),
            "pip": version([str(venvs["pip"] / "bin" / "pip"), "--version"]),
            "uv": version([uv, "--version"]),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheelhouse", type=pathlib.Path)
    parser.add_argument("--uv", default="/opt/dscluster/tools/bin/uv")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    try:
        result = bench(args.wheelhouse, args.uv, args.python)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"install_bench: {exc}", file=sys.stderr)
        return 1
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

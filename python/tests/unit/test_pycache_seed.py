"""roles/ml_stack/files/pycache_seed.py: the venv's bytecode copied to where a
PYTHONPYCACHEPREFIX reads it, as the role runs it (python3 -c FILE VENV PREFIX)."""

from __future__ import annotations

import json
import os
import pathlib
import py_compile
import subprocess
import sys

from .. import rolefiles


def seed(venv: pathlib.Path, prefix: pathlib.Path) -> dict:
    script = rolefiles.path("ml_stack", "files/pycache_seed.py").read_text()
    out = subprocess.run(
        [sys.executable, "-c", script, str(venv), str(prefix)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def imported_from(site: pathlib.Path, prefix: pathlib.Path, module: str) -> list[str]:
    """`python -v` lines saying where each module's code object came from, the prefix set."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONPATH": str(site)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run(
        [sys.executable, "-v", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("# code object from ")]


def test_the_prefix_serves_the_venvs_bytecode_and_a_second_seed_copies_nothing(tmp_path):
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "pkg" / "sub").mkdir(parents=True)
    for rel in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/mod.py"):
        (site / rel).write_text(f"NAME = {rel!r}\n")
        py_compile.compile(str(site / rel), doraise=True)  # into pkg/.../__pycache__, as root's
    (site / "pkg" / "sub" / "__pycache__" / "notes.txt").write_text("not bytecode")
    prefix = tmp_path / "pycache"
    prefix.mkdir()

    assert seed(tmp_path / "venv", prefix) == {"copied": 3, "kept": 0}
    tag = sys.implementation.cache_tag
    mod = prefix / str(site / "pkg" / "sub").lstrip("/") / f"mod.{tag}.pyc"
    assert (
        mod.read_bytes() == (site / "pkg" / "sub" / "__pycache__" / f"mod.{tag}.pyc").read_bytes()
    )
    assert not list(prefix.rglob("notes.txt"))
    # Python with the prefix reads the copies: no module compiled from its source
    lines = imported_from(site, prefix, "pkg.sub.mod")
    assert f"# code object from '{mod}'" in lines, lines
    ours = [ln for ln in lines if "/pkg/" in ln]
    assert len(ours) == 3 and all(ln.startswith(f"# code object from '{prefix}/") for ln in ours)

    assert seed(tmp_path / "venv", prefix) == {"copied": 0, "kept": 3}
    # a source changed and compiled again in the venv: only its bytecode is copied again
    (site / "pkg" / "sub" / "mod.py").write_text("NAME = 'changed, longer than before'\n")
    py_compile.compile(str(site / "pkg" / "sub" / "mod.py"), doraise=True)
    assert seed(tmp_path / "venv", prefix) == {"copied": 1, "kept": 2}

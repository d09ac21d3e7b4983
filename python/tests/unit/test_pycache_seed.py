"""roles/ml_stack/files/pycache_seed.py: the venv's bytecode copied to where a
PYTHONPYCACHEPREFIX reads it, as the role runs it (python3 FILE VENV PREFIX)."""

from __future__ import annotations

import json
import os
import pathlib
import py_compile
import subprocess
import sys

from .. import rolefiles


def seed(
    venv: pathlib.Path, prefix: pathlib.Path, *modules: str, env: dict[str, str] | None = None
) -> dict:
    script = rolefiles.path("ml_stack", "files/pycache_seed.py")
    out = subprocess.run(
        [sys.executable, str(script), str(venv), str(prefix), *modules],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, **(env or {})},
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


def test_named_modules_are_compiled_into_the_prefix_once_and_a_failing_one_is_named(tmp_path):
    """With modules after VENV PREFIX, VENV's Python imports them with the prefix set: what a
    job would import beyond the venv's own bytecode is compiled there at install. A module that
    does not import is named with its error; the others are still compiled."""
    venv = tmp_path / "venv"
    site = venv / "lib" / "site-packages"
    (site / "pkg").mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    (site / "pkg" / "__init__.py").write_text("")
    py_compile.compile(str(site / "pkg" / "__init__.py"), doraise=True)  # root's reading
    (site / "pkg" / "engine.py").write_text("from . import optim\n")
    (site / "pkg" / "optim.py").write_text("LR = 0.1\n")
    (site / "pkg" / "broken.py").write_text("raise RuntimeError('needs a device\\nsecond line')\n")
    # an import that prints, as DeepSpeed logs to stdout, before and after the verdict
    (site / "pkg" / "noisy.py").write_text(
        "import atexit\nprint('[INFO] {not json}')\natexit.register(print, '[INFO] bye')\n"
    )
    prefix = tmp_path / "pycache"
    prefix.mkdir()
    env = {"PYTHONPATH": str(site)}
    modules = ["pkg.engine", "pkg.absent", "pkg.broken", "pkg.noisy"]

    first = seed(venv, prefix, *modules, env=env)
    assert first["copied"] == 1  # pkg/__init__
    assert first["imported"] == ["pkg.engine", "pkg.noisy"]
    assert first["not_imported"] == {
        "pkg.absent": "ModuleNotFoundError: No module named 'pkg.absent'",
        "pkg.broken": "RuntimeError: needs a device",
    }
    # engine, optim (imported by engine), broken (it compiled), and the interpreter's own
    # modules the import used that its standard library had no bytecode for: with a prefix
    # set, Python keeps the standard library's there too
    copies = first["copied"] + first["stdlib_copied"]
    assert first["compiled"] == len(list(prefix.rglob("*.pyc"))) - copies
    tag = sys.implementation.cache_tag
    here = prefix / str(site / "pkg").lstrip("/")
    assert sorted(p.name for p in here.iterdir()) == sorted(
        f"{m}.{tag}.pyc" for m in ("__init__", "engine", "optim", "broken", "noisy")
    )
    assert not (site / "pkg" / "__pycache__" / f"engine.{tag}.pyc").exists()  # the venv is root's
    # The job's import then reads the prefix: nothing compiled from source
    lines = imported_from(site, prefix, "pkg.engine")
    ours = [ln for ln in lines if "/pkg/" in ln]
    assert len(ours) == 3 and all(ln.startswith(f"# code object from '{prefix}/") for ln in ours)

    again = seed(venv, prefix, *modules, env=env)
    assert (again["copied"], again["kept"], again["compiled"]) == (0, 1, 0)
    assert again["imported"] == ["pkg.engine", "pkg.noisy"]


def test_a_venv_python_that_cannot_start_names_every_module(tmp_path):
    venv = tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    prefix = tmp_path / "pycache"
    prefix.mkdir()
    out = seed(venv, prefix, "torch._dynamo", "deepspeed.runtime.engine")
    assert out["compiled"] == 0 and out["imported"] == []
    assert set(out["not_imported"]) == {"torch._dynamo", "deepspeed.runtime.engine"}
    assert all("FileNotFoundError" in why for why in out["not_imported"].values())


def test_the_standard_librarys_bytecode_is_seeded_without_tests_site_packages_or_opt(tmp_path):
    """VENV's Python names its standard library; its plain bytecode is copied into the prefix
    (not -O's, not the test package, not site-/dist-packages under it), and a module of it is
    then read from there, not compiled again."""
    stdlib = tmp_path / "usr" / "lib" / "python3.x"
    tag = sys.implementation.cache_tag
    for rel in ("json/__init__.py", "json/decoder.py", "shlex.py", "test/test_x.py",
                "site-packages/other.py", "dist-packages/debian.py"):  # fmt: skip
        (stdlib / rel).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / rel).write_text(f"NAME = {rel!r}\n")
        py_compile.compile(str(stdlib / rel), doraise=True)
    py_compile.compile(str(stdlib / "shlex.py"), optimize=1, doraise=True)  # shlex.*.opt-1.pyc
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    # VENV's Python, as far as the seed asks it: where its standard library is, its tag
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho \'["{stdlib}", "{tag}"]\'\n')
    python.chmod(0o755)
    prefix = tmp_path / "pycache"
    prefix.mkdir()

    first = seed(venv, prefix)
    assert (first["copied"], first["stdlib_copied"], first["stdlib_kept"]) == (0, 3, 0)
    copied = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*.pyc"))
    inside = str(stdlib).lstrip("/")
    assert copied == [
        f"{inside}/json/__init__.{tag}.pyc",
        f"{inside}/json/decoder.{tag}.pyc",
        f"{inside}/shlex.{tag}.pyc",
    ]
    lines = imported_from(stdlib, prefix, "json.decoder")
    ours = [ln for ln in lines if str(stdlib) in ln]
    assert len(ours) == 2 and all(ln.startswith(f"# code object from '{prefix}/") for ln in ours)

    assert seed(venv, prefix)["stdlib_kept"] == 3
    # a VENV whose Python does not answer: the venv's own bytecode only, no stdlib_ keys
    python.write_text("#!/bin/sh\nexit 3\n")
    assert seed(venv, prefix) == {"copied": 0, "kept": 0}

"""Small I/O helpers: atomic writes, warnings, tools, subprocesses (paths: paths.py)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence

from .errors import DsclusterError


def atomic_write(path: pathlib.Path, text: str, mode: int = 0o644) -> None:
    """Write text to path so that readers see the old file or the whole new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def print_warnings(console, warnings: Sequence[str]) -> None:
    """Each warning as one plain `warning: ...` line on the given rich Console."""
    for warning in warnings:
        console.print(f"warning: {warning}", markup=False, highlight=False)


def tool(name: str) -> str:
    """Path of a console script, preferring the one beside this interpreter (the venv)."""
    beside = pathlib.Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise DsclusterError(f"'{name}' is not installed; run 'make venv' (or pip install ansible)")
    return found


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing output; a failure becomes a one-line DsclusterError."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, input=input, check=False
        )
    except FileNotFoundError as exc:
        raise DsclusterError(f"'{argv[0]}' is not installed: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise DsclusterError(f"'{' '.join(argv[:3])}' did not finish within {timeout} s") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        last = detail[-1] if detail else f"exit {proc.returncode}"
        raise DsclusterError(f"'{' '.join(argv[:3])}' failed: {last}")
    return proc

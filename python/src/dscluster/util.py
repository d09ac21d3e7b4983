"""Small I/O helpers: atomic writes, warnings, tools, subprocesses (paths: paths.py)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

from .errors import DsclusterError


def atomic_write(path: pathlib.Path, text: str | bytes, mode: int = 0o644) -> None:
    """Write one file so that readers see the old file or the whole new one, never half."""
    write_files({path: text}, modes={path: mode})


def _missing_parents(path: pathlib.Path) -> list[pathlib.Path]:
    """The ancestors of path that do not exist yet, outermost first."""
    missing: list[pathlib.Path] = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return list(reversed(missing))


def _cannot_write(path: pathlib.Path, exc: OSError) -> DsclusterError:
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, IsADirectoryError) or path.is_dir():
        return DsclusterError(f"cannot write {path}: it is a directory; give a file path")
    if isinstance(exc, NotADirectoryError | FileExistsError):
        return DsclusterError(
            f"cannot write {path}: a part of that path is a file, not a directory; "
            "choose another path"
        )
    return DsclusterError(
        f"cannot write {path}: {reason}; choose a writable place or fix its permissions"
    )


def _check_targets(targets: Sequence[pathlib.Path]) -> None:
    for path in targets:
        if path.is_dir():
            raise DsclusterError(f"cannot write {path}: it is a directory; give a file path")
        for parent in path.parents:
            if parent.exists() and not parent.is_dir():
                raise DsclusterError(
                    f"cannot write {path}: {parent} is a file, not a directory; choose another path"
                )


def _backup_beside(path: pathlib.Path) -> str:
    """A second name for path's file in its directory (a hard link, else a copy), made under
    a name nobody held: link() and mkstemp() fail rather than use an existing name, so a file
    or link another user put there first is never written through or replaced."""
    for _ in range(100):
        backup = path.parent / f".{path.name}.{secrets.token_hex(8)}.old"
        try:
            os.link(path, backup, follow_symlinks=False)
            return str(backup)
        except FileExistsError:
            continue
        except OSError:  # a file system without hard links
            break
    fd, backup_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent)
    with os.fdopen(fd, "wb") as out, path.open("rb") as src:
        shutil.copyfileobj(src, out)
    shutil.copystat(path, backup_name)
    return backup_name


class _Transaction:
    """Staged files, backups of the files they replace, directories made: what to undo."""

    def __init__(self) -> None:
        self.made_dirs: list[pathlib.Path] = []
        self.staged: dict[pathlib.Path, str] = {}
        self.backups: dict[pathlib.Path, str] = {}
        self.replaced: list[pathlib.Path] = []
        self.current = pathlib.Path()

    def stage(self, path: pathlib.Path, content: str | bytes, mode: int) -> None:
        self.current = path
        for parent in _missing_parents(path):
            parent.mkdir()
            self.made_dirs.append(parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
        self.staged[path] = tmp
        data = content.encode("utf-8") if isinstance(content, str) else content
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)

    def keep_old(self, path: pathlib.Path) -> None:
        self.current = path
        if not path.exists():
            return
        self.backups[path] = _backup_beside(path)

    def replace(self, path: pathlib.Path) -> None:
        self.current = path
        os.replace(self.staged[path], path)
        del self.staged[path]
        self.replaced.append(path)

    def rollback(self) -> None:
        for path in reversed(self.replaced):
            if path in self.backups:
                os.replace(self.backups.pop(path), path)
            else:
                path.unlink(missing_ok=True)
        self.cleanup()
        for directory in reversed(self.made_dirs):
            with contextlib.suppress(OSError):
                directory.rmdir()

    def cleanup(self) -> None:
        for leftover in [*self.staged.values(), *self.backups.values()]:
            pathlib.Path(leftover).unlink(missing_ok=True)


def write_files(
    files: Mapping[pathlib.Path, str | bytes],
    *,
    modes: Mapping[pathlib.Path, int] | None = None,
) -> None:
    """Write a set of files as one transaction.

    Every file is staged beside its target first; only when all are staged are they renamed
    into place. On any failure nothing is left behind: staged files and directories made
    here are removed and every file that existed before is byte-identical. An OSError
    becomes a one-line DsclusterError naming the path.
    """
    modes = modes or {}
    targets = [pathlib.Path(p) for p in files]
    _check_targets(targets)
    txn = _Transaction()
    try:
        for path, content in zip(targets, files.values(), strict=True):
            txn.stage(path, content, modes.get(path, 0o644))
        for path in targets:
            txn.keep_old(path)
        for path in targets:
            txn.replace(path)
    except BaseException as exc:
        txn.rollback()
        if isinstance(exc, OSError):
            raise _cannot_write(txn.current, exc) from exc
        raise
    txn.cleanup()


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

"""The checks every command runs on its arguments before any side effect.

Each `*_type` is an argparse `type=`: it turns the text into a value or raises
`argparse.ArgumentTypeError` with a message naming the value and the fix (the parser prints
it as one line, exit 2). Checks that need several arguments, or a file's contents, live in
each command's `check(args)` (cli/*), which `main` calls after parsing and before the command
runs: nothing is written, no playbook, Docker or AWS call happens before a refusal.

Names and patterns are matched with `fullmatch` (a regex `$` also matches before a final
newline, so `re.match('^x$', 'x\\n')` passes).
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import re
from collections.abc import Callable

from .errors import DsclusterError

# A Docker image reference: [registry[:port]/]path[:tag][@digest], full match.
IMAGE_REF_RE = re.compile(
    r"(?:[a-z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)

MAX_PORT = 65535
MAX_SLOTS = 1024  # per node: more than any machine has accelerators or sensible CPU ranks
# The most nodes one inventory / hostfile / host list / Slurm node or count list may name
# (checked before a list is expanded), and the most --nodes / --num-nodes / --count take.
# A Slurm allocation of 10,000 nodes is a list dscluster expands (tests/unit/test_slurm.py);
# 2(x99999999999) is not.
MAX_NODES = 16_384
MAX_SECONDS = 7 * 24 * 3600
MAX_STEPS = 10_000_000
# --max-restarts (launch, sbatch): more than this is a job that should not be restarted blindly.
MAX_RESTARTS = 100


def _fail(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


def _arg(text: str, flag: str | None) -> str:
    """How a message names the value: `--nodes 0` (the flag as the user would retype it),
    quoted when it holds blanks or is empty; `'0'` without a flag."""
    plain = text if text and not any(c.isspace() or c in "'\"" for c in text) else repr(text)
    return f"{flag} {plain}" if flag else repr(text)


def _int(text: str, flag: str | None, what: str, example: str) -> int:
    raw = str(text).strip()
    if not re.fullmatch(r"[+-]?[0-9]+", raw) or not raw.isascii():
        raise _fail(f"{_arg(text, flag)} is not a whole number; give {what}, e.g. {example}")
    return int(raw)


def port_type_for(flag: str | None) -> Callable[[str], int]:
    """A TCP port, 1-65535."""

    def parse(text: str) -> int:
        value = _int(text, flag, f"a port from 1 to {MAX_PORT}", "29500")
        if not 1 <= value <= MAX_PORT:
            raise _fail(
                f"{_arg(text, flag)} is out of range; give a port from 1 to {MAX_PORT}, e.g. 29500"
            )
        return value

    parse.__name__ = "port"
    return parse


port_type = port_type_for(None)


def count_type(
    lo: int, hi: int, what: str, example: int, *, flag: str | None = None
) -> Callable[[str], int]:
    """A whole number from lo to hi."""

    def parse(text: str) -> int:
        value = _int(text, flag, f"{what} from {lo} to {hi}", str(example))
        if not lo <= value <= hi:
            raise _fail(
                f"{_arg(text, flag)} is out of range; give {what} from {lo} to {hi}, e.g. {example}"
            )
        return value

    parse.__name__ = what
    return parse


def seconds_type(
    what: str = "seconds", hi: int = MAX_SECONDS, *, flag: str | None = None
) -> Callable[[str], int]:
    return count_type(1, hi, what, 600, flag=flag)


def real_type(
    lo: float,
    hi: float,
    what: str,
    example: str,
    *,
    lo_open: bool = False,
    flag: str | None = None,
) -> Callable[[str], float]:
    """A finite number in [lo, hi] (or (lo, hi] with lo_open)."""

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise _fail(
                f"{_arg(text, flag)} is not a number; give {what}, e.g. {example}"
            ) from None
        low_ok = value > lo if lo_open else value >= lo
        if not math.isfinite(value) or not low_ok or value > hi:
            bound = f"above {lo:g}" if lo_open else f"from {lo:g}"
            raise _fail(
                f"{_arg(text, flag)} is out of range; give {what} {bound} to {hi:g}, e.g. {example}"
            )
        return value

    parse.__name__ = what
    return parse


def _as_type(check: Callable[[str], object], name: str) -> Callable[[str], str]:
    """An argparse type from a check that raises DsclusterError (the text, unchanged)."""

    def parse(text: str) -> str:
        try:
            check(text)
        except DsclusterError as exc:
            raise _fail(str(exc)) from None
        return text

    parse.__name__ = name
    return parse


def name_type(check: Callable[[str], None]) -> Callable[[str], str]:
    """An argparse type from one of sources/names.py's checks."""
    return _as_type(check, check.__name__)


def existing_file_type(what: str) -> Callable[[str], pathlib.Path]:
    """A file that exists and can be read."""

    def parse(text: str) -> pathlib.Path:
        if not str(text).strip():
            raise _fail(f"the {what} path is empty; give a file")
        path = pathlib.Path(text).expanduser()
        if not path.exists():
            raise _fail(f"{what} {text} does not exist; give an existing file")
        if not path.is_file():
            raise _fail(f"{what} {text} is not a file; give a file")
        if not os.access(path, os.R_OK):
            raise _fail(f"{what} {text} cannot be read; fix its permissions")
        return path

    parse.__name__ = what
    return parse


def _nearest_existing(path: pathlib.Path) -> pathlib.Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def out_file_type(what: str = "output file") -> Callable[[str], pathlib.Path]:
    """A file dscluster may write: not a directory, under a directory (made when missing)."""
    text_type = _as_type(lambda text: check_out_file(text, what), what)
    return lambda text: pathlib.Path(text_type(text)).expanduser()


def out_dir_type(what: str = "output directory") -> Callable[[str], pathlib.Path]:
    text_type = _as_type(lambda text: check_out_dir(text, what), what)
    return lambda text: pathlib.Path(text_type(text)).expanduser()


def _one_line_path(text: str | os.PathLike[str], what: str, noun: str) -> str:
    raw = os.fspath(text)
    if not raw.strip() or "\n" in raw or "\x00" in raw:
        raise DsclusterError(f"the {what} {raw!r} is empty or not one line; give {noun}")
    return raw


def _writable_below(raw: str, probe: pathlib.Path, what: str) -> None:
    """probe (the nearest existing part of the path) must be a directory we may write in."""
    if not probe.is_dir():
        raise DsclusterError(
            f"{what} {raw}: {probe} is a file, not a directory; choose another path"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise DsclusterError(f"{what} {raw}: {probe} is not writable; choose a writable place")


def check_out_file(text: str | os.PathLike[str], what: str = "output file") -> pathlib.Path:
    raw = _one_line_path(text, what, "a file")
    path = pathlib.Path(raw).expanduser()
    if path.is_dir() or raw.endswith("/"):
        raise DsclusterError(f"{what} {raw} is a directory; give a file path, e.g. {raw}/out.json")
    _writable_below(raw, _nearest_existing(path.parent), what)
    return path


def check_out_dir(text: str | os.PathLike[str], what: str = "output directory") -> pathlib.Path:
    """A directory dscluster writes files into (made when missing); not an existing file."""
    raw = _one_line_path(text, what, "a directory")
    path = pathlib.Path(raw).expanduser()
    if path.exists() and not path.is_dir():
        raise DsclusterError(f"{what} {raw} is a file; give a directory (it is made when missing)")
    _writable_below(raw, _nearest_existing(path), what)
    return path


def read_text(path: pathlib.Path, what: str) -> str:
    """A text file as UTF-8; unreadable or non-UTF-8 becomes one line naming the file."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise DsclusterError(
            f"{what} {path} is not UTF-8 text (bad byte at line {line}); save it as UTF-8"
        ) from None
    except IsADirectoryError:
        raise DsclusterError(f"{what} {path} is a directory; give a file") from None
    except FileNotFoundError:
        raise DsclusterError(f"{what} {path} does not exist; give an existing file") from None
    except OSError as exc:
        raise DsclusterError(f"cannot read {what} {path}: {exc.strerror}; fix it") from None

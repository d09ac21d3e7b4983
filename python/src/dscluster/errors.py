"""The one exception type of dscluster, and what happens to any other (a bug).

A `DsclusterError` is a problem the user can fix: `main` prints its message as one plain
line (`dscluster: error: ...`) and exits non-zero. Anything else reaching `main` is a bug in
dscluster: `bug_report` writes the traceback to a file under the cache and `main` prints one
line naming that file; `DSCLUSTER_DEBUG=1` shows the traceback instead.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import platform
import sys
import traceback
from collections.abc import Sequence

DEBUG_ENV = "DSCLUSTER_DEBUG"


class DsclusterError(Exception):
    """A problem the user can fix; the message names it and says what to do."""


def one_line(text: str) -> str:
    """A message as one line: inner newlines folded, no ANSI escapes, no trailing blanks."""
    text = "".join(ch for ch in _strip_ansi(text) if ch in {"\n", "\t"} or ch >= " ")
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _strip_ansi(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\x1b":
            j = i + 1
            if j < len(text) and text[j] == "[":
                j += 1
                while j < len(text) and not ("@" <= text[j] <= "~"):
                    j += 1
            i = j + 1
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0", "false", "no")


def bug_report(exc: BaseException, argv: Sequence[str]) -> pathlib.Path | None:
    """Write the traceback of an unexpected exception to a file; its path, or None."""
    from . import __version__  # noqa: PLC0415
    from .paths import cache_root  # noqa: PLC0415 - paths imports this module

    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    path = cache_root() / "bug-reports" / f"{stamp}-{os.getpid()}.txt"
    text = (
        f"dscluster {__version__}, Python {platform.python_version()} on {platform.platform()}\n"
        f"argv: {list(argv)!r}\n\n"
        + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    )
    try:
        path.parent.parent.mkdir(parents=True, exist_ok=True)
        # argv can hold what only this user may read (paths, a job's arguments): 0700 / 0600
        path.parent.mkdir(mode=0o700, exist_ok=True)
        if path.parent.stat().st_uid == os.getuid():
            os.chmod(path.parent, 0o700)  # one an older dscluster made 0755
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(path, flags, 0o600), "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        return None
    return path


def print_error(message: str) -> None:
    print(f"dscluster: error: {one_line(message)}", file=sys.stderr)

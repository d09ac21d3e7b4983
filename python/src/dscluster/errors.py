"""The one exception type of dscluster, and what happens to any other (a bug).

A `DsclusterError` is a problem the user can fix: `main` prints its message as one plain
line (`dscluster: error: ...`) and exits non-zero. Anything else reaching `main` is a bug in
dscluster: `cli.bug_report` writes the traceback to a file under the cache and `main` prints
one line naming that file; `DSCLUSTER_DEBUG=1` (`debug()`) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

from .text import one_line

DEBUG_ENV = "DSCLUSTER_DEBUG"


class DsclusterError(Exception):
    """A problem the user can fix; the message names it and says what to do."""


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0", "false", "no")


def print_error(message: str) -> None:
    print(f"dscluster: error: {one_line(message)}", file=sys.stderr)

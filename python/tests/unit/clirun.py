"""dscluster.cli in this process with its output captured, and the one-line error check."""

from __future__ import annotations

import contextlib
import io
import re

from rich.console import Console

from dscluster import cli
from dscluster.cli import flags
from dscluster.errors import DsclusterError

DS_HOSTFILE_RE = re.compile(r"^(\S+)\s+slots=(\d+)")  # DeepSpeed's runner._parse_hostfile


def run_cli(*argv: str) -> tuple[int, str, str]:
    args = cli.build_parser().parse_args(list(argv))
    flags.check_required(args)
    out_buf, err_buf = io.StringIO(), io.StringIO()
    out = Console(file=out_buf, soft_wrap=True, width=200)
    err = Console(file=err_buf, soft_wrap=True, width=200)
    try:
        rc = int(args.func(args, out, err))
    except DsclusterError as exc:
        err_buf.write(f"dscluster: error: {exc}\n")
        rc = 1
    return rc, out_buf.getvalue(), err_buf.getvalue()


def run_main(*argv: str) -> tuple[int, str, str]:
    """cli.main (argument checks, exit codes, the bug handler), its output captured."""
    out_buf, err_buf = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_buf), contextlib.redirect_stderr(err_buf):
        try:
            rc = cli.main(list(argv))
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out_buf.getvalue(), err_buf.getvalue()


def one_line_error(result: tuple[int, str, str], rc: int | tuple[int, ...] = 1) -> str:
    """rc 1: a failure the line explains; 2: an argument refused before anything ran."""
    got, _, err = result
    assert got in (rc if isinstance(rc, tuple) else (rc,)), result
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dscluster: error: ")
    return lines[0]

"""dscluster command line: local clusters, provisioning, launch files, smoke test.

Every user-facing error is one line on stderr and a non-zero exit, never a traceback.
Each command group registers its parser from its own module here; shared options are
defined once in flags.py; the domain modules take plain arguments, never a Namespace.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import pathlib
import platform
import re
import sys
import traceback
from collections.abc import Sequence

from rich.console import Console

from .. import __version__, inventory_cache, paths, runner
from ..errors import DsclusterError, debug, print_error
from ..text import one_line
from . import (
    aws,
    doctor,
    dsconfig,
    flags,
    inventory,
    jobs,
    launch,
    local,
    lock,
    provision,
    sbatch,
    smoke,
)


class _Version(argparse.Action):
    """`dscluster --version`: this client's version and the collection it drives."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            where = f"{paths.FQCN} {paths.collection_version()} at {paths.collection_root()}"
        except DsclusterError as exc:
            where = f"no collection: {exc}"
        print(f"dscluster {__version__}\n{where}")  # stdout, as argparse's own version action
        parser.exit()


def _check_home(value: str) -> str:
    """--home: a directory, or a path whose nearest existing part is one (it is created)."""
    if not value.strip():
        raise DsclusterError("--home is empty; give a directory, e.g. --home ~/clusters")
    path = os.path.abspath(os.path.expanduser(value))
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise DsclusterError(
            f"--home {value}: {probe} is not a directory; give a directory "
            "(a missing one is created)"
        )
    return path


def bug_report(exc: BaseException, argv: Sequence[str]) -> pathlib.Path | None:
    """Write the traceback of an unexpected exception to a file; its path, or None."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    path = paths.cache_root() / "bug-reports" / f"{stamp}-{os.getpid()}.txt"
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
        open_flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(path, open_flags, 0o600), "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError:
        return None
    return path


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `dscluster <command>: error: ...; see ... --help`.

    argparse prints the usage block before its message; a user with a typo wants the one
    line that names the value and where to look. Sub-parsers inherit this class."""

    def error(self, message: str):
        # "argument --nodes: --nodes 0 is out of range; ..." -> the type's own words, which
        # name the option as the user would retype it (an old alias names today's spelling).
        own = re.fullmatch(r"argument [^:]+: (--\S+ .*)", one_line(message))
        text = own.group(1) if own else one_line(message)
        self.exit(2, f"dscluster: error: {text}; see '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dscluster", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version, nargs=0, help="print the versions and exit")
    parser.add_argument(
        "--home",
        metavar="DIR",
        help="where inventories/<name>/ live (default: $DSCLUSTER_HOME, else the working "
        "directory); caches go to $DSCLUSTER_CACHE, else $XDG_CACHE_HOME/dscluster",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order `dscluster --help` lists them.
    groups = (local, provision, smoke, launch, jobs, inventory, aws, sbatch, doctor, dsconfig, lock)
    for group in groups:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Exit 0 on success, 2 on a refused argument (nothing done), 1 on a
    failure the message explains, 3 on a bug (its traceback saved in a file), 130 on ^C."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = _main(words)
        if rc == 0:
            # The inventory readings of a command that succeeded (never a refused one's).
            inventory_cache.flush()
        return rc
    except DsclusterError as exc:
        print_error(str(exc))
        return 1
    except KeyboardInterrupt:
        print("dscluster: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `dscluster ... | head`: the reader left; not an error of ours or the user's.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except SystemExit:
        raise
    except Exception as exc:
        if debug():
            raise
        where = bug_report(exc, words)
        saved = f"the traceback is in {where}" if where else "the traceback could not be saved"
        print(
            f"dscluster: internal error (a bug in dscluster, not in your input): "
            f"{type(exc).__name__}: {one_line(str(exc))[:200]}; {saved}; please report it "
            f"with that file (DSCLUSTER_DEBUG=1 shows it here)",
            file=sys.stderr,
        )
        return 3


def _main(words: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(words)
    flags.check_required(args)
    if args.home is not None:
        try:
            home = _check_home(args.home)
        except DsclusterError as exc:
            print_error(str(exc))
            return 2
        # paths.home() reads it; set before any command resolves an inventory name.
        os.environ["DSCLUSTER_HOME"] = home
    try:
        # A bad DSCLUSTER_MITOGEN, DSCLUSTER_JINJA_CACHE or DSCLUSTER_FACTS_MEMO is refused
        # before any command does anything.
        runner.mitogen_strategy_dir()
        runner.callback_switches()
    except DsclusterError as exc:
        print_error(str(exc))
        return 2
    check = getattr(args, "check", None)
    if check is not None:
        # Every refusal a command can make from its arguments alone, before any side effect.
        try:
            check(args)
        except DsclusterError as exc:
            print_error(str(exc))
            return 2
    out = Console(soft_wrap=True)
    err = Console(stderr=True, soft_wrap=True)
    return int(args.func(args, out, err))


__all__ = ["build_parser", "main"]

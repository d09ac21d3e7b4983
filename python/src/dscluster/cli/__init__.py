"""dscluster command line: local clusters, provisioning, launch files, smoke test.

Every user-facing error is one line on stderr and a non-zero exit, never a traceback.
Each command group registers its parser from its own module here; shared options are
defined once in flags.py; the domain modules take plain arguments, never a Namespace.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rich.console import Console

from .. import __version__
from ..errors import DsclusterError
from . import aws, doctor, dsconfig, flags, inventory, launch, local, provision, sbatch, smoke


class _Version(argparse.Action):
    """`dscluster --version`: this client's version and the collection it drives."""

    def __call__(self, parser, namespace, values, option_string=None):
        from .. import paths  # noqa: PLC0415

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dscluster", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version, nargs=0, help="print the versions and exit")
    parser.add_argument(
        "--home",
        metavar="DIR",
        help="where inventories/<name>/ live (default: $DSCLUSTER_HOME, else the working "
        "directory); caches go to $DSCLUSTER_CACHE, else $XDG_CACHE_HOME/dscluster",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order `dscluster --help` lists them.
    for group in (local, provision, smoke, launch, inventory, aws, sbatch, doctor, dsconfig):
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    flags.check_required(args)
    if args.home is not None:
        try:
            home = _check_home(args.home)
        except DsclusterError as exc:
            print(f"dscluster: error: {exc}", file=sys.stderr)
            return 2
        # paths.home() reads it; set before any command resolves an inventory name.
        os.environ["DSCLUSTER_HOME"] = home
    out = Console(soft_wrap=True)
    err = Console(stderr=True, soft_wrap=True)
    try:
        return int(args.func(args, out, err))
    except DsclusterError as exc:
        print(f"dscluster: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dscluster: interrupted", file=sys.stderr)
        return 130


__all__ = ["build_parser", "main"]

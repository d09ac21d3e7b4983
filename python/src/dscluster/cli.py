"""dscluster command line: local clusters, provisioning, launch files, smoke test.

Every user-facing error is one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from . import __version__
from .errors import DsclusterError
from .util import print_warnings


def _inventory(value: str):
    from .inventory import load  # noqa: PLC0415

    return load(value)


def cmd_local_up(args: argparse.Namespace, out: Console, err: Console) -> int:
    from . import local  # noqa: PLC0415

    path = local.up(
        args.name, args.nodes, cpu_slots=args.slots, shm_size=args.shm_size, console=err
    )
    out.print(f"local cluster '{args.name}': {args.nodes} nodes, inventory {path}")
    return 0


def cmd_local_down(args: argparse.Namespace, out: Console, err: Console) -> int:
    from . import local  # noqa: PLC0415

    removed = local.down(args.name, console=err)
    out.print(f"local cluster '{args.name}': removed {len(removed)} objects")
    return 0


def cmd_hostfile(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .hostfile import write_launch_files  # noqa: PLC0415

    files = write_launch_files(_inventory(args.inventory))
    out.print(f"wrote {files.hostfile} ({files.world_size} slots on {len(files.facts)} hosts)")
    out.print(f"wrote {files.env_file}")
    print_warnings(err, files.warnings)
    return 0


def cmd_image(args: argparse.Namespace, out: Console, err: Console) -> int:
    from . import local  # noqa: PLC0415

    local.ensure_engine()
    out.print(local.node_image(args.base, console=err))
    return 0


class _Version(argparse.Action):
    """`dscluster --version`: this client's version and the collection it drives."""

    def __call__(self, parser, namespace, values, option_string=None):
        from . import paths  # noqa: PLC0415

        try:
            where = f"{paths.FQCN} {paths.collection_version()} at {paths.collection_root()}"
        except DsclusterError as exc:
            where = f"no collection: {exc}"
        parser.exit(message=f"dscluster {__version__}\n{where}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dscluster", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version, nargs=0, help="print the versions and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    local = sub.add_parser("local", help="local cluster of node containers")
    lsub = local.add_subparsers(dest="local_command", required=True)
    up = lsub.add_parser("up", help="create or reconcile a local cluster (idempotent)")
    up.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    up.add_argument("--name", default="local", help="cluster name (default local)")
    up.add_argument("--slots", type=int, default=1, help="slots per CPU node (default 1)")
    up.add_argument("--shm-size", default="1g", help="/dev/shm size per node (default 1g)")
    up.set_defaults(func=cmd_local_up)
    down = lsub.add_parser("down", help="remove a local cluster and everything it made")
    down.add_argument("--name", default="local")
    down.set_defaults(func=cmd_local_down)

    image = sub.add_parser("image", help="make sure the node image exists (build it if not)")
    image.add_argument("--base", default="debian:bookworm", help="base image (pulled or built)")
    image.set_defaults(func=cmd_image)

    def add_inventory(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-i", "--inventory", required=True, help="inventories/<name> or its hosts.yml"
        )

    from . import provision  # noqa: PLC0415

    provision.add_parsers(sub, add_inventory)

    hf = sub.add_parser("hostfile", help="write the DeepSpeed hostfile and .deepspeed_env")
    add_inventory(hf)
    hf.set_defaults(func=cmd_hostfile)

    from . import launch, smoke  # noqa: PLC0415

    smoke.add_parsers(sub, add_inventory)
    launch.add_parsers(sub, add_inventory)

    # Inventory sources: each writes inventories/<name>/hosts.yml (+ a hostfile of the slots
    # the source expects), the same place `local up` writes to.
    from . import aws, slurm, static  # noqa: PLC0415

    inventory = sub.add_parser(
        "inventory", help="write an inventory from AWS, Slurm or a host list"
    )
    isub = inventory.add_subparsers(dest="inventory_command", required=True)
    aws.add_inventory_parser(isub)
    slurm.add_inventory_parser(isub)
    static.add_inventory_parser(isub)
    aws.add_parsers(sub, add_inventory)
    slurm.add_parsers(sub, add_inventory)
    from . import doctor  # noqa: PLC0415

    doctor.add_parsers(sub, add_inventory)
    from . import dsconfig  # noqa: PLC0415

    dsconfig.add_parsers(sub, add_inventory)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())

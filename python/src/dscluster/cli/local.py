"""`dscluster local up|down` (a local cluster of node containers) and `dscluster image`."""

from __future__ import annotations

import argparse

from rich.console import Console

from . import flags


def register(sub) -> None:
    local = sub.add_parser("local", help="local cluster of node containers")
    lsub = local.add_subparsers(dest="local_command", required=True)
    up = lsub.add_parser("up", help="create or reconcile a local cluster (idempotent)")
    up.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    up.add_argument("--name", default="local", help="cluster name (default local)")
    flags.slots(up, default=1, help="slots per CPU node (default 1)")
    up.add_argument("--shm-size", default="1g", help="/dev/shm size per node (default 1g)")
    up.set_defaults(func=cmd_local_up)
    down = lsub.add_parser("down", help="remove a local cluster and everything it made")
    down.add_argument("--name", default="local")
    down.set_defaults(func=cmd_local_down)

    image = sub.add_parser("image", help="make sure the node image exists (build it if not)")
    image.add_argument("--base", default="debian:bookworm", help="base image (pulled or built)")
    image.set_defaults(func=cmd_image)


def cmd_local_up(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sources import local  # noqa: PLC0415

    path = local.up(
        args.name, args.nodes, cpu_slots=args.slots, shm_size=args.shm_size, console=err
    )
    out.print(f"local cluster '{args.name}': {args.nodes} nodes, inventory {path}")
    return 0


def cmd_local_down(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sources import local  # noqa: PLC0415

    removed = local.down(args.name, console=err)
    out.print(f"local cluster '{args.name}': removed {len(removed)} objects")
    return 0


def cmd_image(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sources import local  # noqa: PLC0415

    local.ensure_engine()
    out.print(local.node_image(args.base, console=err))
    return 0

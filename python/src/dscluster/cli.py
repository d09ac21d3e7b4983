"""dscluster command line: local clusters, provisioning, launch files, smoke test.

Every user-facing error is one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import json
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


def cmd_provision(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .runner import raise_for_failures, run_playbook, summary_table  # noqa: PLC0415

    inv = _inventory(args.inventory)
    result = run_playbook(
        args.playbook, inv, limit=args.limit, tags=args.tags, timeout=args.timeout, console=err
    )
    out.print(summary_table(result, f"{args.playbook} on {len(inv.hosts)} hosts"))
    raise_for_failures(result, f"provisioning ({args.playbook})")
    out.print(f"provisioned {len(inv.hosts)} hosts, {result.changed_total} changes")
    return 0


def cmd_hostfile(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .hostfile import write_launch_files  # noqa: PLC0415

    files = write_launch_files(_inventory(args.inventory))
    out.print(f"wrote {files.hostfile} ({files.world_size} slots on {len(files.facts)} hosts)")
    out.print(f"wrote {files.env_file}")
    print_warnings(err, files.warnings)
    return 0


def cmd_smoke(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .smoke import bandwidth_table, rank_table, run_smoke  # noqa: PLC0415

    report, path = run_smoke(
        _inventory(args.inventory),
        zero=args.zero,
        steps=args.steps,
        timeout=args.timeout,
        launcher=args.launcher,
        master_port=args.master_port,
        console=err,
    )
    if args.json:
        out.print_json(json.dumps(report))
    else:
        out.print(rank_table(report))
        out.print(bandwidth_table(report))
        out.print(f"smoke test passed: {report['world_size']} ranks; report {path}")
    return 0


def cmd_image(args: argparse.Namespace, out: Console, err: Console) -> int:
    from . import local  # noqa: PLC0415

    local.ensure_engine()
    out.print(local.node_image(args.base, console=err))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dscluster", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dscluster {__version__}")
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

    prov = sub.add_parser("provision", help="run playbooks/site.yml with live progress")
    add_inventory(prov)
    prov.add_argument("--playbook", default="site.yml", help="playbook under playbooks/")
    prov.add_argument("--limit", help="Ansible host pattern to limit the run")
    prov.add_argument("--tags", help="only plays/tasks with these tags")
    prov.add_argument("--timeout", type=int, default=None, help="seconds before the run is cut")
    prov.set_defaults(func=cmd_provision)

    hf = sub.add_parser("hostfile", help="write the DeepSpeed hostfile and .deepspeed_env")
    add_inventory(hf)
    hf.set_defaults(func=cmd_hostfile)

    smoke = sub.add_parser("smoke", help="run a DeepSpeed job across every slot")
    add_inventory(smoke)
    smoke.add_argument("--zero", type=int, choices=(1, 2, 3), default=2, help="ZeRO stage")
    smoke.add_argument("--steps", type=int, default=30)
    smoke.add_argument("--timeout", type=int, default=600, help="seconds before the job is cut")
    smoke.add_argument("--json", action="store_true", help="print the report as JSON")
    from . import launch  # noqa: PLC0415
    from .smoke import add_smoke_options  # noqa: PLC0415

    add_smoke_options(smoke)
    smoke.set_defaults(func=cmd_smoke)
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

"""`dscluster provision` (playbooks with live progress) and `dscluster hostfile`."""

from __future__ import annotations

import argparse

from rich.console import Console

from . import flags


def register(sub) -> None:
    prov = sub.add_parser("provision", help="run playbooks/site.yml with live progress")
    flags.inventory(prov)
    # check_provision sets `loaded` (the inventory it read for --limit or --add) and
    # `add_hosts` (the hosts --add names) for the command.
    prov.set_defaults(check=check_provision, loaded=None, add_hosts=None)
    prov.add_argument("--playbook", default="site.yml", help="playbook under playbooks/")
    prov.add_argument("--limit", help="Ansible host pattern to limit the run")
    prov.add_argument("--tags", help="only plays/tasks with these tags")
    prov.add_argument(
        "--add",
        metavar="HOST[,HOST...]",
        help="grow or repair the cluster by these inventory hosts: the whole site.yml on "
        "them, only the cluster-wide files (tag cluster_files: /etc/hosts, known_hosts, NFS "
        "exports, slurm.conf) on the others; not with --limit, --tags or another --playbook",
    )
    flags.timeout(prov, None, "the run")
    prov.add_argument(
        "--allow-degraded",
        action="store_true",
        help="when some nodes fail, write the hostfile without them (recorded in "
        "degraded.json until a provision succeeds on them) and exit 0",
    )
    prov.set_defaults(func=cmd_provision)

    hf = sub.add_parser("hostfile", help="write the DeepSpeed hostfile and .deepspeed_env")
    flags.inventory(hf)
    hf.set_defaults(func=cmd_hostfile)


def check_provision(args: argparse.Namespace) -> None:
    """--playbook, --tags and --limit against the collection and the inventory, before any
    playbook runs (a typo in --tags would otherwise be a successful run that changed nothing)."""
    from .. import provision  # noqa: PLC0415
    from ..inventory import load  # noqa: PLC0415

    provision.check_playbook(args.playbook)
    if args.add is not None:
        args.loaded = load(args.inventory)
        args.add_hosts = provision.check_add(
            args.add, args.loaded, playbook=args.playbook, limit=args.limit, tags=args.tags
        )
        return
    if args.tags is not None:
        provision.check_tags(args.tags)
    if args.limit is not None:
        args.loaded = load(args.inventory)
        provision.check_limit(args.limit, args.loaded)


def cmd_provision(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .. import provision  # noqa: PLC0415

    if args.add_hosts:
        return provision.provision_add(
            args.loaded,
            args.add_hosts,
            timeout=args.timeout,
            allow_degraded=args.allow_degraded,
            out=out,
            err=err,
        )
    return provision.provision(
        args.loaded or args.inventory,
        playbook=args.playbook,
        limit=args.limit,
        tags=args.tags,
        timeout=args.timeout,
        allow_degraded=args.allow_degraded,
        out=out,
        err=err,
    )


def cmd_hostfile(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..inventory import load  # noqa: PLC0415
    from ..launch_files import write_launch_files  # noqa: PLC0415
    from ..util import print_warnings  # noqa: PLC0415

    files = write_launch_files(load(args.inventory))
    out.print(f"wrote {files.hostfile} ({files.world_size} slots on {len(files.facts)} hosts)")
    out.print(f"wrote {files.env_file}")
    print_warnings(err, files.warnings)
    return 0

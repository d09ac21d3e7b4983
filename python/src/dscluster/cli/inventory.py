"""`dscluster inventory aws|slurm|static`: write inventories/<name>/hosts.yml + hostfile."""

from __future__ import annotations

import argparse
import os
import pathlib

from rich.console import Console

from ..errors import DsclusterError
from . import flags


def register(sub) -> None:
    inventory = sub.add_parser(
        "inventory", help="write an inventory from AWS, Slurm or a host list"
    )
    isub = inventory.add_subparsers(dest="inventory_command", required=True)
    _aws(isub)
    _slurm(isub)
    _static(isub)


def _key_value(text: str) -> tuple[str, str]:
    """--head-tag KEY=VAL: an EC2 tag (key 1-128 characters, value at most 256, one line)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KEY=VALUE; give e.g. dscluster:role=head"
        )
    if key != key.strip() or len(key) > 128 or len(value) > 256:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an EC2 tag; keys are 1-128 characters without surrounding spaces, "
            "values at most 256 (e.g. dscluster:role=head)"
        )
    if any(not ch.isprintable() for ch in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} holds a control character; give one line, e.g. dscluster:role=head"
        )
    return key, value


def _user(text: str) -> str:
    """--user of inventory aws: a login name (it goes into ansible_user)."""
    import re  # noqa: PLC0415

    if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", text):
        raise argparse.ArgumentTypeError(
            f"SSH user {text!r} is not a login name; use lowercase letters, digits, '_', '.', "
            "'-', starting with a letter or '_' (e.g. ubuntu)"
        )
    return text


def aws_common(p: argparse.ArgumentParser) -> None:
    """--cluster, --region, --profile: every command that talks to EC2."""
    from .. import validate  # noqa: PLC0415
    from ..sources.aws.config import CLUSTER_TAG  # noqa: PLC0415
    from ..sources.aws.session import check_region  # noqa: PLC0415
    from ..sources.names import check_cluster_name  # noqa: PLC0415

    p.add_argument(
        "--cluster",
        required=True,
        type=validate.name_type(check_cluster_name),
        help=f"value of the tag {CLUSTER_TAG}",
    )
    p.add_argument(
        "--region",
        type=validate.name_type(check_region),
        help="AWS region (default: the profile's or AWS_DEFAULT_REGION)",
    )
    p.add_argument("--profile", help="AWS profile (default: boto3's chain, e.g. AWS_PROFILE)")


def check_aws_session(args: argparse.Namespace, services: tuple[str, ...] = ("ec2",)) -> None:
    """The profile, the region and the endpoint: refused here, before any AWS request."""
    from ..sources.aws.session import check_session  # noqa: PLC0415

    check_session(args.profile, args.region, services)


def aws_session(args: argparse.Namespace):
    """The boto3 session of --profile and --region."""
    from ..sources.aws.session import session  # noqa: PLC0415

    return session(args.profile, args.region)


def _aws(isub) -> None:
    from .. import validate  # noqa: PLC0415
    from ..sources.aws.config import HEAD_ROLE, ROLE_TAG  # noqa: PLC0415

    p = isub.add_parser(
        "aws",
        help="write inventories/aws/hosts.yml + hostfile from running EC2 instances of a cluster",
    )
    aws_common(p)
    flags.out(
        p,
        help="directory for hosts.yml and hostfile (default inventories/aws)",
        type=validate.out_dir_type("inventory directory"),
    )
    p.add_argument(
        "--head-tag",
        type=_key_value,
        default=(ROLE_TAG, HEAD_ROLE),
        metavar="KEY=VAL",
        help=f"tag marking the head (default {ROLE_TAG}={HEAD_ROLE}; else lowest launch index)",
    )
    p.add_argument(
        "--user", type=_user, help="SSH user for every host (default: from each AMI's family)"
    )
    p.add_argument(
        "--key-file",
        type=validate.existing_file_type("SSH key file"),
        help="SSH private key (default ~/.ssh/<KeyName>.pem)",
    )
    p.add_argument(
        "--public", action="store_true", help="reach hosts on public IPs (default private IPs)"
    )
    flags.slots(p, default=1, help="slots per CPU-only host (default 1)")
    p.add_argument(
        "--no-console-keys",
        dest="console_keys",
        action="store_false",
        help="do not read SSH host keys from the instances' console output",
    )
    p.set_defaults(func=cmd_inventory_aws, check=check_inventory_aws)


def check_inventory_aws(args: argparse.Namespace) -> None:
    from .. import validate  # noqa: PLC0415
    from ..errors import DsclusterError  # noqa: PLC0415

    if args.slots is None or not 1 <= args.slots <= validate.MAX_SLOTS:
        raise DsclusterError(
            f"--slots {args.slots} is out of range; give slots per CPU-only host from 1 to "
            f"{validate.MAX_SLOTS}, e.g. 1"
        )
    check_aws_session(args)


def _slurm(isub) -> None:
    p = isub.add_parser("slurm", help="an inventory from a Slurm allocation or node list")
    p.add_argument("--name", default="slurm", help="inventory name (default slurm)")
    p.add_argument(
        "--nodelist", help="Slurm node list, e.g. 'gpu-[001-004,010],cpu7' (default: the job's)"
    )
    flags.slots(p, default=None, help="slots per node (default: GPUs, tasks or CPUs Slurm gave)")
    flags.out(p, help="directory to write (default inventories/<name>)")
    flags.ssh(p)
    p.set_defaults(func=cmd_inventory_slurm, check=check_static_or_slurm)


def _static(isub) -> None:
    p = isub.add_parser("static", help="an inventory from a plain host list (a,b,c or node[1-4])")
    p.add_argument(
        "--hosts",
        required=True,
        help="comma-separated hosts, head first: name, name:slots or prefix[01-16]",
    )
    p.add_argument("--head", help="the head host (default: the first one listed)")
    flags.slots(p, default=1, help="slots per host without :N (default 1)")
    p.add_argument("--name", default="static", help="inventory name (default static)")
    flags.out(p, help="directory to write (default inventories/<name>)")
    flags.ssh(p)
    p.set_defaults(func=cmd_inventory_static, check=check_static_or_slurm)


def cmd_inventory_aws(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .. import sources  # noqa: PLC0415
    from ..sources.aws import discover  # noqa: PLC0415
    from ..util import print_warnings  # noqa: PLC0415

    described = sources.describe(
        "aws",
        sess=aws_session(args),
        cluster=args.cluster,
        out_dir=args.out,
        head_tag=args.head_tag,
        user=args.user,
        key_file=str(args.key_file) if args.key_file else None,
        public=args.public,
        cpu_slots=args.slots,
        console_keys=args.console_keys,
    )
    result = discover.written_result(described, sources.write(described))
    print_warnings(err, result.warnings)
    out.print(discover.summary_table(result))
    out.print(
        f"wrote {result.hosts_yml} and {result.hostfile}: {len(result.nodes)} hosts, "
        f"{result.total_slots} slots",
        markup=False,
        highlight=False,
    )
    return 0


def check_static_or_slurm(args: argparse.Namespace) -> None:
    """Before anything runs: --name, --slots, -o, --user, --key-file, --known-hosts."""
    from ..sources import names, static  # noqa: PLC0415
    from ..validate import MAX_SLOTS, check_out_dir  # noqa: PLC0415

    names.check_inventory_name(args.name)
    if args.slots is not None and not 1 <= args.slots <= MAX_SLOTS:
        raise DsclusterError(
            f"--slots {args.slots} is out of range; use 1 or more (at most {MAX_SLOTS})"
        )
    check_out_dir(args.out or static.default_out(args.name))
    static.ssh_vars(args.user, args.key_file, args.known_hosts)


def cmd_inventory_slurm(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .. import sources  # noqa: PLC0415
    from ..sources import slurm, static  # noqa: PLC0415

    described = sources.describe(
        "slurm",
        name=args.name,
        nodelist=args.nodelist,
        slots=args.slots,
        ssh=static.SshOptions(args.user, args.key_file, args.known_hosts),
        out=pathlib.Path(args.out) if args.out else None,
        env=dict(os.environ),
    )
    written = sources.write(described)
    found: slurm.Allocation = described.found
    nodes = found.nodes
    out.print(
        f"wrote {written.hosts_yml} ({len(nodes)} nodes, head {nodes[0]}, "
        f"slots from {found.slots_source})"
    )
    out.print(f"wrote {written.hostfile} ({sum(found.slots)} slots)")
    return 0


def cmd_inventory_static(args: argparse.Namespace, out: Console, err: Console) -> int:
    from .. import sources  # noqa: PLC0415
    from ..sources import static  # noqa: PLC0415

    described = sources.describe(
        "static",
        hosts=args.hosts,
        head=args.head,
        slots=args.slots,
        name=args.name,
        out=pathlib.Path(args.out) if args.out else None,
        ssh=static.SshOptions(args.user, args.key_file, args.known_hosts),
    )
    written = sources.write(described)
    entries = described.found
    total = sum(s for _, s in entries)
    out.print(f"wrote {written.hosts_yml} ({len(entries)} hosts, head {entries[0][0]})")
    out.print(f"wrote {written.hostfile} ({total} slots)")
    return 0

"""`dscluster aws up|down`: create or remove an EC2 cluster (placement group, SG, EFA).

Every option is checked here, before any AWS call: shapes by argparse types, the rest (the
AMI, the profile, the region, AWS_ENDPOINT_URL) by `check_up`/`check_down`, which `main` runs
after parsing."""

from __future__ import annotations

import argparse

from rich.console import Console

from .. import validate
from ..errors import DsclusterError
from .inventory import aws_common, aws_session, check_aws_session


def _shape(name: str):
    """An argparse type from a check in sources/aws/config.py (imported when parsing)."""

    def check(text: str) -> None:
        from ..sources.aws import config  # noqa: PLC0415

        getattr(config, name)(text)

    check.__name__ = name
    return validate.name_type(check)


def register(sub) -> None:
    aws = sub.add_parser("aws", help="create or remove an EC2 cluster (placement group, SG, EFA)")
    asub = aws.add_subparsers(dest="aws_command", required=True)
    up = asub.add_parser("up", help="create or reconcile an EC2 cluster (idempotent)")
    aws_common(up)
    up.add_argument(
        "--type",
        required=True,
        type=_shape("check_instance_type"),
        help="instance type, e.g. p4d.24xlarge",
    )
    up.add_argument(
        "--count",
        type=validate.count_type(1, validate.MAX_NODES, "an instance count", 2),
        required=True,
        help="number of instances wanted",
    )
    up.add_argument("--efa", action="store_true", help="EFA interfaces (type must support EFA)")
    up.add_argument(
        "--subnet",
        type=_shape("check_subnet"),
        help="subnet id (default: a default subnet of the default VPC)",
    )
    up.add_argument(
        "--ami",
        type=_shape("check_ami"),
        help="AMI id, or an SSM parameter name starting with '/' that holds one (required)",
    )
    up.add_argument("--key-name", type=_shape("check_key_name"), help="EC2 key pair name for SSH")
    up.add_argument(
        "--ssh-cidr",
        type=_shape("check_cidr"),
        help="also allow SSH (tcp/22) into the security group from this CIDR "
        "(0.0.0.0/0 or ::/0 only with --allow-world-ssh)",
    )
    up.add_argument(
        "--allow-world-ssh",
        action="store_true",
        help="accept an --ssh-cidr of prefix length 0 (SSH open to the whole internet)",
    )
    _wait(up, "instances")
    up.set_defaults(func=cmd_aws_up, check=check_up)
    down = asub.add_parser("down", help="terminate the cluster and remove what 'aws up' made")
    aws_common(down)
    _wait(down, "termination")
    down.set_defaults(func=cmd_aws_down, check=check_down)


def _wait(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--wait",
        type=validate.seconds_type("seconds to wait"),
        default=600,
        help=f"seconds to wait for {what} (default 600)",
    )


def check_up(args: argparse.Namespace) -> None:
    """What `aws up` refuses before any AWS call, beyond the argparse types."""
    if not args.ami:
        raise DsclusterError(
            "aws up needs --ami: pass --ami <ami-id> (e.g. an AWS Deep Learning AMI of your "
            "region, 'aws ec2 describe-images'), or an SSM parameter name starting with '/' "
            "that holds one; dscluster does not guess"
        )
    from ..sources.aws.config import check_world_ssh  # noqa: PLC0415

    check_world_ssh(args.ssh_cidr, args.allow_world_ssh)
    services = ("ec2", "ssm") if args.ami.startswith("/") else ("ec2",)
    check_aws_session(args, services)


def check_down(args: argparse.Namespace) -> None:
    check_aws_session(args, ("ec2",))


def _say(out: Console):
    return lambda line: out.print(line, markup=False, highlight=False)


def cmd_aws_up(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sources.aws import instance  # noqa: PLC0415

    result = instance.up(
        aws_session(args),
        args.cluster,
        instance_type=args.type,
        count=args.count,
        efa=args.efa,
        subnet=args.subnet,
        ami=args.ami,
        key_name=args.key_name,
        ssh_cidr=args.ssh_cidr,
        wait_s=args.wait,
        allow_world_ssh=args.allow_world_ssh,
        say=_say(out),
    )
    out.print(result.summary(), markup=False, highlight=False)
    return 0


def cmd_aws_down(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ..sources.aws import instance  # noqa: PLC0415

    removed = instance.down(aws_session(args), args.cluster, wait_s=args.wait, say=_say(out))
    out.print(
        f"aws cluster '{args.cluster}': removed {len(removed)} objects"
        + (f" ({', '.join(removed)})" if removed else ""),
        markup=False,
        highlight=False,
    )
    return 0

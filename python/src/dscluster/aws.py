"""AWS EC2: `dscluster inventory aws` and `dscluster aws up/down` (command line + shared bits).

Everything talks to EC2 through boto3 and only boto3: credentials come from boto3's own chain
(profile, environment, SSO, instance role) and are never written anywhere; the endpoint comes
from boto3 too (`AWS_ENDPOINT_URL`, honoured by botocore itself). Every AWS failure a user can
fix becomes one DsclusterError line: no credentials, no region, an AWS error code.

Discovery lives in aws_inventory.py, cluster creation and removal in aws_cluster.py.
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console

from .errors import DsclusterError
from .util import print_warnings

CLUSTER_TAG = "dscluster:cluster"
ROLE_TAG = "dscluster:role"
HEAD_ROLE = "head"

# Error codes that mean "these credentials do not work", not "this request is wrong".
_AUTH_CODES = {
    "AuthFailure",
    "UnauthorizedOperation",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "RequestExpired",
    "OptInRequired",
}
_CONFIGURE = (
    "configure them with 'aws configure' (or 'aws sso login'), pick a profile with --profile "
    "or AWS_PROFILE, export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or run on an instance "
    "with an IAM role"
)


def one_line(text: object) -> str:
    return " ".join(str(text).split())


def session(profile: str | None, region: str | None) -> Any:
    """A boto3 session on boto3's own credential chain; fails early without a region."""
    import boto3  # noqa: PLC0415
    from botocore.exceptions import ProfileNotFound  # noqa: PLC0415

    try:
        sess = boto3.session.Session(profile_name=profile, region_name=region)
    except ProfileNotFound as exc:
        raise DsclusterError(
            f"AWS profile {profile!r} is not configured ({one_line(exc)}); {_CONFIGURE}"
        ) from exc
    if not sess.region_name:
        raise DsclusterError(
            "no AWS region: pass --region, set AWS_DEFAULT_REGION, or give the profile a region "
            "('aws configure set region <region>')"
        )
    return sess


def ec2_client(sess: Any) -> Any:
    from botocore.config import Config  # noqa: PLC0415

    with aws_errors(sess.region_name):
        return sess.client("ec2", config=Config(retries={"mode": "standard", "max_attempts": 5}))


@contextlib.contextmanager
def aws_errors(region: str | None) -> Iterator[None]:
    """Turn botocore's exceptions into one-line DsclusterErrors a user can act on."""
    from botocore import exceptions as bx  # noqa: PLC0415

    where = f" in {region}" if region else ""
    try:
        yield
    except (bx.NoCredentialsError, bx.PartialCredentialsError) as exc:
        raise DsclusterError(f"no usable AWS credentials ({one_line(exc)}); {_CONFIGURE}") from exc
    except bx.ProfileNotFound as exc:
        raise DsclusterError(f"AWS profile not found ({one_line(exc)}); {_CONFIGURE}") from exc
    except bx.NoRegionError as exc:
        raise DsclusterError("no AWS region: pass --region or set AWS_DEFAULT_REGION") from exc
    except bx.WaiterError as exc:
        raise DsclusterError(
            f"EC2 did not reach the expected state{where} in time ({one_line(exc)}); "
            "check the instances in the EC2 console and run the command again"
        ) from exc
    except bx.ClientError as exc:
        error = exc.response.get("Error", {})
        code = error.get("Code", "Unknown")
        op = getattr(exc, "operation_name", "a request")
        hint = f"; {_CONFIGURE}" if code in _AUTH_CODES else "; fix the request or its permissions"
        raise DsclusterError(
            f"AWS refused {op}{where}: {code}: {one_line(error.get('Message', ''))}{hint}"
        ) from exc
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError) as exc:
        raise DsclusterError(
            f"cannot reach the EC2 endpoint{where} ({one_line(exc)}); check the network, "
            "the region and AWS_ENDPOINT_URL"
        ) from exc
    except bx.BotoCoreError as exc:
        raise DsclusterError(f"AWS request failed{where}: {one_line(exc)}") from exc


def tag_value(resource: dict[str, Any], key: str) -> str | None:
    for tag in resource.get("Tags") or []:
        if tag.get("Key") == key:
            return str(tag.get("Value", ""))
    return None


def cluster_filter(cluster: str) -> dict[str, Any]:
    return {"Name": f"tag:{CLUSTER_TAG}", "Values": [cluster]}


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


_CLUSTER_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


def check_cluster_name(name: str) -> None:
    if not _CLUSTER_RE.match(name):
        raise DsclusterError(
            f"cluster name {name!r} is not usable; use lowercase letters, digits and '-', "
            "starting with a letter, at most 31 characters"
        )


# ---------------------------------------------------------------- command line


def cmd_inventory_aws(args: argparse.Namespace, out: Console, err: Console) -> int:
    from . import aws_inventory  # noqa: PLC0415

    check_cluster_name(args.cluster)
    sess = session(args.profile, args.region)
    result = aws_inventory.write_inventory(
        sess,
        args.cluster,
        out_dir=args.out,
        head_tag=args.head_tag,
        user=args.user,
        key_file=args.key_file,
        public=args.public,
        cpu_slots=args.cpu_slots,
        console_keys=args.console_keys,
    )
    print_warnings(err, result.warnings)
    out.print(aws_inventory.summary_table(result))
    out.print(
        f"wrote {result.hosts_yml} and {result.hostfile}: {len(result.nodes)} hosts, "
        f"{result.total_slots} slots",
        markup=False,
        highlight=False,
    )
    return 0


def cmd_aws_up(args: argparse.Namespace, out: Console, err: Console) -> int:
    from . import aws_cluster  # noqa: PLC0415

    check_cluster_name(args.cluster)
    sess = session(args.profile, args.region)
    result = aws_cluster.up(
        sess,
        args.cluster,
        instance_type=args.type,
        count=args.count,
        efa=args.efa,
        subnet=args.subnet,
        ami=args.ami,
        key_name=args.key_name,
        ssh_cidr=args.ssh_cidr,
        wait_s=args.wait,
        say=lambda line: out.print(line, markup=False, highlight=False),
    )
    out.print(result.summary(), markup=False, highlight=False)
    return 0


def cmd_aws_down(args: argparse.Namespace, out: Console, err: Console) -> int:
    from . import aws_cluster  # noqa: PLC0415

    check_cluster_name(args.cluster)
    sess = session(args.profile, args.region)
    removed = aws_cluster.down(
        sess,
        args.cluster,
        wait_s=args.wait,
        say=lambda line: out.print(line, markup=False, highlight=False),
    )
    out.print(
        f"aws cluster '{args.cluster}': removed {len(removed)} objects"
        + (f" ({', '.join(removed)})" if removed else ""),
        markup=False,
        highlight=False,
    )
    return 0


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, help=f"value of the tag {CLUSTER_TAG}")
    p.add_argument("--region", help="AWS region (default: the profile's or AWS_DEFAULT_REGION)")
    p.add_argument("--profile", help="AWS profile (default: boto3's chain, e.g. AWS_PROFILE)")


def add_inventory_parser(isub: Any) -> argparse.ArgumentParser:
    """`dscluster inventory aws` under the `dscluster inventory` subparsers `isub`."""
    p = isub.add_parser(
        "aws",
        help="write inventories/aws/hosts.yml + hostfile from running EC2 instances of a cluster",
    )
    _add_common(p)
    p.add_argument("--out", help="directory for hosts.yml and hostfile (default inventories/aws)")
    p.add_argument(
        "--head-tag",
        type=_key_value,
        default=(ROLE_TAG, HEAD_ROLE),
        metavar="KEY=VAL",
        help=f"tag marking the head (default {ROLE_TAG}={HEAD_ROLE}; else lowest launch index)",
    )
    p.add_argument("--user", help="SSH user for every host (default: from each AMI's family)")
    p.add_argument("--key-file", help="SSH private key (default ~/.ssh/<KeyName>.pem)")
    p.add_argument(
        "--public", action="store_true", help="reach hosts on public IPs (default private IPs)"
    )
    p.add_argument("--cpu-slots", type=int, default=1, help="slots per CPU-only host (default 1)")
    p.add_argument(
        "--no-console-keys",
        dest="console_keys",
        action="store_false",
        help="do not read SSH host keys from the instances' console output",
    )
    p.set_defaults(func=cmd_inventory_aws)
    return p


def add_parsers(sub: Any, add_inventory: Callable[[argparse.ArgumentParser], None]) -> None:
    """Top-level `dscluster aws` with `up` and `down` (add_inventory unused: EC2 is the source)."""
    del add_inventory
    aws = sub.add_parser("aws", help="create or remove an EC2 cluster (placement group, SG, EFA)")
    asub = aws.add_subparsers(dest="aws_command", required=True)
    up = asub.add_parser("up", help="create or reconcile an EC2 cluster (idempotent)")
    _add_common(up)
    up.add_argument("--type", required=True, help="instance type, e.g. p4d.24xlarge")
    up.add_argument("--count", type=int, required=True, help="number of instances wanted")
    up.add_argument("--efa", action="store_true", help="EFA interfaces (type must support EFA)")
    up.add_argument("--subnet", help="subnet id (default: a default subnet of the default VPC)")
    up.add_argument(
        "--ami",
        help="AMI id, or an SSM parameter name starting with '/' that holds one (required)",
    )
    up.add_argument("--key-name", help="EC2 key pair name for SSH")
    up.add_argument(
        "--ssh-cidr", help="also allow SSH (tcp/22) into the security group from this CIDR"
    )
    up.add_argument(
        "--wait", type=int, default=600, help="seconds to wait for instances (default 600)"
    )
    up.set_defaults(func=cmd_aws_up)
    down = asub.add_parser("down", help="terminate the cluster and remove what 'aws up' made")
    _add_common(down)
    down.add_argument(
        "--wait", type=int, default=600, help="seconds to wait for termination (default 600)"
    )
    down.set_defaults(func=cmd_aws_down)

"""EC2 access that `dscluster inventory aws` (aws.py) and `aws up/down` (aws_cluster.py) share.

Everything talks to EC2 through boto3 and only boto3: credentials come from boto3's own chain
(profile, environment, SSO, instance role) and are never written anywhere; the endpoint comes
from boto3 too (`AWS_ENDPOINT_URL`, honoured by botocore itself). Every AWS failure a user can
fix becomes one DsclusterError line: no credentials, no region, an AWS error code.

Discovery lives in aws.py, cluster creation and removal in aws_cluster.py; both import this
module and nothing imports them back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import DsclusterError
from .names import check_cluster_name

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


__all__ = [
    "CLUSTER_TAG",
    "HEAD_ROLE",
    "ROLE_TAG",
    "aws_errors",
    "check_cluster_name",
    "cluster_filter",
    "ec2_client",
    "one_line",
    "session",
    "tag_value",
]

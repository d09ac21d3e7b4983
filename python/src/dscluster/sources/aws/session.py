"""The boto3 session and clients every AWS command uses, and how their errors read.

Everything talks to EC2 through boto3 and only boto3: credentials come from boto3's own chain
(profile, environment, SSO, instance role) and are never written anywhere; the endpoint comes
from boto3 too (`AWS_ENDPOINT_URL`, honoured by botocore itself). Every AWS failure a user can
fix becomes one DsclusterError line: no credentials, no region, an AWS error code.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import DsclusterError
from ...text import squeeze

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


REGION_RE = re.compile(r"[a-z]{2,4}(-[a-z]+)+-[0-9]{1,2}")
ENDPOINT_VARS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL_SSM")
# Seconds between two polls of an EC2 waiter or of a retried call.
WAITER_DELAY_S = 5


def check_region(region: str) -> None:
    if not REGION_RE.fullmatch(region):
        raise DsclusterError(
            f"AWS region {region!r} is not a region name; give one like us-east-1 or eu-west-2"
        )


def check_endpoint_env(environ: Mapping[str, str]) -> None:
    """AWS_ENDPOINT_URL (and the per-service variables) must be http(s) URLs with a host."""
    from urllib.parse import urlsplit  # noqa: PLC0415

    for var in ENDPOINT_VARS:
        url = environ.get(var)
        if url is None:
            continue
        try:
            parts = urlsplit(url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            _ = parts.port  # a bad port raises ValueError
        except ValueError:
            ok = False
        if not ok or any(ch.isspace() for ch in url):
            raise DsclusterError(
                f"{var}={url!r} is not an http(s) URL; set it like "
                f"{var}=https://ec2.us-east-1.amazonaws.com, or unset it to use AWS"
            )


def session(profile: str | None, region: str | None) -> Any:
    """A boto3 session on boto3's own credential chain; fails early without a usable region,
    with an unknown profile or a malformed endpoint variable. Nothing is sent anywhere."""
    import boto3  # noqa: PLC0415
    from botocore.exceptions import BotoCoreError, ProfileNotFound  # noqa: PLC0415

    check_endpoint_env(os.environ)
    if region is not None:
        check_region(region)
    try:
        sess = boto3.session.Session(profile_name=profile, region_name=region)
        region_name = sess.region_name
    except ProfileNotFound as exc:
        raise DsclusterError(
            f"AWS profile {profile or os.environ.get('AWS_PROFILE')!r} is not configured "
            f"({squeeze(exc)}); {_CONFIGURE}"
        ) from exc
    except BotoCoreError as exc:
        raise DsclusterError(
            f"the AWS configuration cannot be read ({squeeze(exc)}); fix ~/.aws/config or "
            "AWS_CONFIG_FILE"
        ) from exc
    if not region_name:
        raise DsclusterError(
            "no AWS region: pass --region, set AWS_DEFAULT_REGION, or give the profile a region "
            "('aws configure set region <region>')"
        )
    try:
        check_region(region_name)
    except DsclusterError as exc:
        raise DsclusterError(
            f"{exc} (from AWS_DEFAULT_REGION, AWS_REGION or the profile; or pass --region)"
        ) from None
    return sess


def _require_request_id(http_response: Any, parsed: Any, model: Any, **_: Any) -> None:
    """EC2 answers every successful call with a requestId; an endpoint that answers 200 with
    some other document (a proxy, a web page, another service) is not EC2."""
    status = getattr(http_response, "status_code", 0)
    if status < 300 and not (parsed or {}).get("ResponseMetadata", {}).get("RequestId"):
        raise DsclusterError(
            f"the endpoint {str(getattr(http_response, 'url', '?')).rstrip('/')} answered "
            f"{model.name} with "
            "something that is not an EC2 response; check AWS_ENDPOINT_URL (unset it to use AWS)"
        )


def client(sess: Any, service: str = "ec2") -> Any:
    """A client with standard retries; a malformed endpoint from any source is one line."""
    from botocore.config import Config  # noqa: PLC0415

    with aws_errors(sess.region_name):
        try:
            result = sess.client(
                service, config=Config(retries={"mode": "standard", "max_attempts": 5})
            )
        except ValueError as exc:
            raise DsclusterError(
                f"the {service.upper()} endpoint is not a usable URL ({squeeze(exc)}); "
                "fix AWS_ENDPOINT_URL or the profile's endpoint_url (unset it to use AWS)"
            ) from None
    url = str(result.meta.endpoint_url)
    if not url.startswith(("http://", "https://")):
        raise DsclusterError(
            f"the {service.upper()} endpoint {url!r} is not an http(s) URL; fix "
            "AWS_ENDPOINT_URL or the profile's endpoint_url (unset it to use AWS)"
        )
    if service == "ec2":
        result.meta.events.register("after-call.ec2", _require_request_id)
    return result


def ec2_client(sess: Any) -> Any:
    return client(sess, "ec2")


def check_session(
    profile: str | None, region: str | None, services: tuple[str, ...] = ("ec2",)
) -> None:
    """Everything about the AWS configuration that can be refused without a request: the
    profile, the region, the endpoint of each service. Builds clients; sends nothing."""
    sess = session(profile, region)
    for service in services:
        client(sess, service)


def endpoint(api: Any) -> str:
    return str(getattr(getattr(api, "meta", None), "endpoint_url", "") or "the AWS endpoint")


def _client_error(exc: Any, where: str, url: str) -> DsclusterError:
    error = exc.response.get("Error", {})
    meta = exc.response.get("ResponseMetadata", {})
    status = int(meta.get("HTTPStatusCode") or 0)
    code = str(error.get("Code") or "Unknown")
    op = getattr(exc, "operation_name", None) or "a request"
    retries = int(meta.get("RetryAttempts") or 0)
    if status >= 500:
        return DsclusterError(
            f"the EC2 endpoint {url} failed {op}{where} with HTTP {status} ({code}, retried "
            f"{retries} times); try again later, or check AWS_ENDPOINT_URL"
        )
    if code == "Unknown" or code.isdigit():
        return DsclusterError(
            f"the endpoint {url} answered {op}{where} with HTTP {status} and no EC2 error; "
            "check AWS_ENDPOINT_URL, a proxy, or the region"
        )
    hint = f"; {_CONFIGURE}" if code in _AUTH_CODES else "; fix the request or its permissions"
    return DsclusterError(
        f"AWS refused {op}{where}: {code}: {squeeze(error.get('Message', ''))}{hint}"
    )


@contextlib.contextmanager
def aws_errors(region: str | None, url: str | None = None) -> Iterator[None]:
    """Turn botocore's exceptions into one-line DsclusterErrors a user can act on."""
    from botocore import exceptions as bx  # noqa: PLC0415
    from botocore.parsers import ResponseParserError  # noqa: PLC0415

    where = f" in {region}" if region else ""
    url = url or "the AWS endpoint"
    try:
        yield
    except (bx.NoCredentialsError, bx.PartialCredentialsError) as exc:
        raise DsclusterError(f"no usable AWS credentials ({squeeze(exc)}); {_CONFIGURE}") from exc
    except bx.ProfileNotFound as exc:
        raise DsclusterError(f"AWS profile not found ({squeeze(exc)}); {_CONFIGURE}") from exc
    except bx.NoRegionError as exc:
        raise DsclusterError("no AWS region: pass --region or set AWS_DEFAULT_REGION") from exc
    except bx.WaiterError as exc:
        raise DsclusterError(
            f"EC2 did not reach the expected state{where} in time ({squeeze(exc)}); "
            "check the instances in the EC2 console and run the command again"
        ) from exc
    except bx.ClientError as exc:
        raise _client_error(exc, where, url) from exc
    except ResponseParserError as exc:
        raise DsclusterError(
            f"the endpoint {url} answered{where} with something that is not an EC2 response "
            f"({squeeze(exc)[:120]}); check AWS_ENDPOINT_URL (unset it to use AWS)"
        ) from exc
    except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError) as exc:
        raise DsclusterError(
            f"cannot reach the EC2 endpoint {url}{where} ({squeeze(exc)}); check the "
            "network, the region and AWS_ENDPOINT_URL"
        ) from exc
    except bx.ParamValidationError as exc:
        raise DsclusterError(
            f"EC2 request refused before sending{where} ({squeeze(exc)}); check the options"
        ) from exc
    except bx.BotoCoreError as exc:
        raise DsclusterError(
            f"AWS request to {url} failed{where}: {squeeze(exc)}; check the network and "
            "AWS_ENDPOINT_URL, and run the command again"
        ) from exc


def error_code(exc: Exception) -> str:
    """The AWS error code of a botocore ClientError ("" for any other exception)."""
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))

"""Fixtures the unit tests share."""

from __future__ import annotations

import pathlib
import textwrap

import pytest
import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from . import aws_moto
from .facts import write_facts


@pytest.fixture
def inventory_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A three-host inventory with recorded facts, as provision leaves it."""
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        textwrap.dedent(
            """\
            all:
              vars:
                dscluster_cpu_slots: 1
              children:
                head:
                  hosts:
                    node-a: {}
                workers:
                  hosts:
                    node-b: {}
                    node-c: {}
            """
        )
    )
    facts = inv / "facts"
    facts.mkdir()
    for host, kind, count in (("node-a", "cuda", 4), ("node-b", "cuda", 2), ("node-c", "cpu", 0)):
        write_facts(facts, host, kind=kind, count=count)
    return inv


# ---------------------------------------------------------------- AWS on a moto server


@pytest.fixture(scope="module")
def moto_url():
    server, url = aws_moto.start()
    yield url
    server.stop()


def _reset_moto(moto_url: str) -> None:
    """Empty moto's account. The reset is idempotent, so a connection the loaded test machine's
    werkzeug server drops (CI once failed a setup on a reset POST's ECONNRESET) is retried;
    an answer other than 2xx still fails the test."""
    retry = Retry(total=5, backoff_factor=0.5, allowed_methods=None, status_forcelist=())
    with requests.Session() as http:
        http.mount("http://", HTTPAdapter(max_retries=retry))
        http.post(f"{moto_url}/moto-api/reset", timeout=30).raise_for_status()


@pytest.fixture
def aws_env(moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path):
    """A fresh moto account, dummy credentials, nothing read from ~/.aws; boto3 and
    dscluster reach the moto server only through AWS_ENDPOINT_URL."""
    _reset_moto(moto_url)
    aws_moto.reset()
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    for var in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_REGION",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", aws_moto.REGION)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    # Never probe the instance metadata service (169.254.169.254) from a test.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("DSCLUSTER_CACHE", str(tmp_path / "cache"))

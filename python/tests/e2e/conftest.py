"""The end-to-end session's local cluster, and the order its modules run in."""

from __future__ import annotations

import pathlib

import pytest

from .. import rolefiles
from .e2e_cluster import NAME, NODES, REUSE, docker, dsc


@pytest.fixture(scope="session")
def cluster() -> pathlib.Path:
    """A local cluster of NODES containers, made fresh for the session and removed after it.

    The end-to-end modules share it: test_e2e provisions it, later modules build on that."""
    if REUSE:
        yield rolefiles.REPO / "inventories" / NAME
        return
    dsc("local", "down", "--name", NAME)  # clear what an earlier run may have left
    up = dsc("local", "up", "--name", NAME, "--nodes", str(NODES))
    assert up.returncode == 0, up.stderr
    inv = pathlib.Path(up.stdout.split("inventory ")[-1].strip()).parent
    yield inv
    down = dsc("local", "down", "--name", NAME)
    assert down.returncode == 0, down.stderr
    assert docker("ps", "-a", "-q", "--filter", f"label=dscluster.cluster={NAME}") == ""


def pytest_collection_modifyitems(config, items):
    """Tests marked `disruptive` (they stop nodes) run after every other test."""
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)

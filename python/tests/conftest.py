from __future__ import annotations

import json
import pathlib
import textwrap

import pytest

from .e2e_cluster import NAME, NODES, REUSE, docker, dsc


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


def write_facts(
    facts: pathlib.Path, host: str, *, kind: str = "cpu", count: int = 0, **over
) -> None:
    data = {
        "host": host,
        "hostname": host,
        "address": "10.0.0.1",
        "interface": "eth0",
        "accelerators": {"kind": kind, "count": count, "cpus": 8},
        "versions": {
            "torch": "2.13.0+cpu",
            "deepspeed": "0.19.8",
            "venv": "/opt/dscluster/venv",
            "torch_extensions_dir": "/opt/dscluster/torch_extensions",
        },
        "cpu_slots": 2,
    }
    data.update(over)
    (facts / f"{host}.json").write_text(json.dumps(data))


@pytest.fixture(scope="session")
def cluster() -> pathlib.Path:
    """A local cluster of NODES containers, made fresh for the session and removed after it.

    The end-to-end modules share it: test_e2e provisions it, later modules build on that."""
    if REUSE:
        yield pathlib.Path(__file__).resolve().parents[2] / "inventories" / NAME
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

"""Fixtures the unit tests share."""

from __future__ import annotations

import pathlib
import textwrap

import pytest

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

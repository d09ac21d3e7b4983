"""Recorded facts as provision leaves them in <inventory>/facts/<host>.json."""

from __future__ import annotations

import json
import pathlib


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

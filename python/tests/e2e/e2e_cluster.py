"""The local container cluster the end-to-end modules share (one per test session).

DSCLUSTER_E2E_NAME names it (default e2e). DSCLUSTER_E2E_REUSE=1 uses an existing,
provisioned cluster of that name as it is (no down/up, nothing removed at the end), for
running one module by hand during development.
"""

from __future__ import annotations

import os
import subprocess
import sys

NAME = os.environ.get("DSCLUSTER_E2E_NAME", "e2e")
REUSE = os.environ.get("DSCLUSTER_E2E_REUSE") == "1"
NODES = 3


def dsc(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dscluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def docker(*args: str, timeout: int = 300) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True, timeout=timeout
    ).stdout

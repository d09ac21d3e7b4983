"""Bad inputs to smoke, launch and doctor (options and the files they read)."""

from __future__ import annotations

from .harness import Case

INV = ["-i", "inventories/demo"]

CASES = [
    Case("smoke-steps-negative", ["smoke", *INV, "--steps", "-5"], "-5", "from 1"),
    Case("smoke-steps-word", ["smoke", *INV, "--steps", "ten"], "ten", "e.g."),
    Case(
        "launch-master-port-high",
        ["launch", *INV, "--master-port", "70000", "--", "train.py"],
        "70000",
        "1 to 65535",
    ),
]

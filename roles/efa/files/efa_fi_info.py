#!/usr/bin/env python3
"""Count the EFA devices that libfabric reports, from `fi_info -p efa` output.

`fi_info -p efa` prints one block per (fabric, domain, endpoint type); every EFA device shows
up more than once: as `<dev>-rdm` (fabric `efa`, and `efa-direct` on libfabric >= 2.0) and as
`<dev>-dgrm`. A device is a distinct domain name with that suffix removed. On a host without
EFA devices fi_info prints `fi_getinfo: -61 (No data available)` and exits non-zero: that is
zero devices, not an error. Any other failure is an error and is reported as such.

Usage:
  efa_fi_info.py count [--fi-info PATH]   run fi_info -p efa, print JSON
  efa_fi_info.py parse < recorded-output   parse recorded output, print JSON
JSON: {"devices": N, "names": [...], "domains": [...], "error": null | "message"}
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

ENODATA = 61
_FIELD = re.compile(r"^\s*(provider|fabric|domain|type)\s*:\s*(\S.*?)\s*$")
_SUFFIX = re.compile(r"-(rdm|dgrm)$")


def parse(text: str) -> dict:
    """Return the EFA domains and distinct devices listed in fi_info output."""
    domains: set[str] = set()
    provider = None
    for line in text.splitlines():
        match = _FIELD.match(line)
        if not match:
            continue
        key, value = match.groups()
        if key == "provider":
            provider = value
        elif key == "domain" and provider is not None and _is_efa(provider):
            domains.add(value)
    names = sorted({_SUFFIX.sub("", d) for d in domains})
    return {"devices": len(names), "names": names, "domains": sorted(domains), "error": None}


def _is_efa(provider: str) -> bool:
    # Older releases name layered providers "efa;ofi_rxd"; the core provider comes first.
    return provider.split(";", 1)[0] == "efa"


def from_run(stdout: str, stderr: str, returncode: int) -> dict:
    """Interpret one run of `fi_info -p efa`."""
    if returncode == 0:
        return parse(stdout)
    text = (stderr or stdout).strip()
    if abs(returncode) == ENODATA or re.search(r"fi_getinfo:\s*-61\b", text):
        return {"devices": 0, "names": [], "domains": [], "error": None}
    last = text.splitlines()[-1] if text else "no output"
    return {
        "devices": 0,
        "names": [],
        "domains": [],
        "error": f"fi_info -p efa failed (rc={returncode}): {last}",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    count = sub.add_parser("count", help="run fi_info -p efa and count devices")
    count.add_argument("--fi-info", default="/opt/amazon/efa/bin/fi_info")
    sub.add_parser("parse", help="parse recorded fi_info output from stdin")
    args = ap.parse_args(argv)
    if args.cmd == "parse":
        result = parse(sys.stdin.read())
    else:
        try:
            proc = subprocess.run(
                [args.fi_info, "-p", "efa"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            result = {"devices": 0, "names": [], "domains": [], "error": f"{args.fi_info}: {exc}"}
        else:
            result = from_run(proc.stdout, proc.stderr, proc.returncode)
    print(json.dumps(result, sort_keys=True))
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())

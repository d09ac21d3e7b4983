"""Load the node-side scripts (accelerators fact, nccl_profile) and their recorded fixtures.

The scripts are not part of the dscluster package: they run on nodes with the system
python3. The tests import the very files the roles install.
"""

from __future__ import annotations

import json
import os
import pathlib

from .. import rolefiles

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "accelerators"
ACCELERATORS_FACT = rolefiles.path("node_facts", "files/accelerators.fact")
NCCL_PROFILE = rolefiles.REPO / "plugins" / "module_utils" / "nccl_profile.py"

accelerators = rolefiles.load("node_facts", "accelerators.fact")
nccl_profile = rolefiles.load_util("nccl_profile")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def outputs(**recorded: str | None) -> dict:
    """Collector outputs as collect() returns them: every tool absent unless given.

    ip_addr / ip_route default to the build host's recorded `ip` output.
    """
    result: dict = {name: None for name in accelerators.COMMANDS}
    result["ip_addr"] = fixture("ip-j-4-addr_buildhost.json")
    result["ip_route"] = fixture("ip-j-route-default_buildhost.json")
    result["hostname"] = "node"
    result["cpus"] = 8
    result.update(recorded)
    return result


def make_root(
    tmp: pathlib.Path, efa: tuple[str, ...] = (), ib: tuple[tuple[str, str], ...] = ()
) -> pathlib.Path:
    """A filesystem root whose /sys/class/infiniband holds the given devices.

    EFA devices are linked to an `efa` driver and HCAs to `mlx5_core`, as the kernel does,
    each HCA with one port carrying the given link layer.
    """
    drivers = tmp / "sys" / "bus" / "pci" / "drivers"
    for driver in ("efa", "mlx5_core"):
        (drivers / driver).mkdir(parents=True, exist_ok=True)
    base = tmp / "sys" / "class" / "infiniband"
    base.mkdir(parents=True, exist_ok=True)
    for name in efa:
        (base / name / "device").mkdir(parents=True)
        os.symlink(drivers / "efa", base / name / "device" / "driver")
    for name, link_layer in ib:
        (base / name / "device").mkdir(parents=True)
        os.symlink(drivers / "mlx5_core", base / name / "device" / "driver")
        (base / name / "ports" / "1").mkdir(parents=True)
        (base / name / "ports" / "1" / "link_layer").write_text(link_layer + "\n")
    return tmp


def rename_interface(ip_addr_json: str, ip_route_json: str, old: str, new: str) -> tuple[str, str]:
    """The recorded `ip` output with one interface renamed (a test edit, not a recording)."""
    links = json.loads(ip_addr_json)
    for link in links:
        if link.get("ifname") == old:
            link["ifname"] = new
            for addr in link.get("addr_info", []):
                if addr.get("label") == old:
                    addr["label"] = new
    routes = json.loads(ip_route_json)
    for route in routes:
        if route.get("dev") == old:
            route["dev"] = new
    return json.dumps(links), json.dumps(routes)

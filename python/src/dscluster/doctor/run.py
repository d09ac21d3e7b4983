"""Running doctor: gather the findings with playbooks/doctor.yml, judge them; the preflight
that smoke and launch run first.
"""

from __future__ import annotations

import json
import pathlib
import secrets
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from rich.console import Console

from .. import storage
from ..errors import DsclusterError
from ..hostfile import parse_env_file
from ..inventory import DEFAULT_MASTER_PORT, Inventory
from ..paths import cache_dir
from ..util import atomic_write
from .evaluate import evaluate
from .findings import load_json
from .report import DoctorReport, Thresholds, problem_lines, summary_line, table


def _read_hostfile(path: pathlib.Path) -> dict[str, int] | None:
    if not path.is_file():
        return None
    slots: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("slots="):
            slots[parts[0]] = int(parts[1].split("=", 1)[1])
    return slots


def _recorded(inv: Inventory) -> dict[str, dict[str, Any]]:
    out = {}
    for host in inv.hosts:
        path = inv.directory / "facts" / f"{host}.json"
        if path.is_file():
            data = load_json(path.read_text())
            if data:
                out[host] = data
    return out


def _env_file(inv: Inventory) -> dict[str, str]:
    path = inv.directory / ".deepspeed_env"
    return parse_env_file(path.read_text(), str(path)) if path.is_file() else {}


def run_doctor(
    inv: Inventory,
    *,
    master_port: int = DEFAULT_MASTER_PORT,
    thresholds: Thresholds | None = None,
    console: Console | None = None,
) -> DoctorReport:
    """Run playbooks/doctor.yml and judge what it found. Saves reports/doctor-latest.json."""
    from ..hostfile import read_degraded  # noqa: PLC0415
    from ..runner import run_playbook  # noqa: PLC0415

    console = console or Console(stderr=True)
    # Nodes a provision --allow-degraded left out are not in the hostfile: not checked either.
    degraded = read_degraded(inv)
    hosts = [h for h in inv.hosts if h not in degraded]
    if degraded:
        console.print(
            f"doctor: leaving out {', '.join(degraded)} (degraded, not in the hostfile)",
            markup=False,
            highlight=False,
        )
    recorded = _recorded(inv)
    env = _env_file(inv)
    token = secrets.token_hex(8)
    shared = storage.inventory_paths(inv).shared
    out_dir = pathlib.Path(tempfile.mkdtemp(prefix="doctor-", dir=cache_dir()))
    try:
        result = run_playbook(
            "doctor.yml",
            inv,
            extravars={
                "doctor_out_dir": str(out_dir),
                "doctor_addresses": {
                    h: str(f["address"]) for h, f in recorded.items() if f.get("address")
                },
                "doctor_ifnames": {
                    k: v
                    for k, v in env.items()
                    if k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
                },
                "doctor_master_port": master_port,
                "doctor_token": token,
            },
            limit=",".join(hosts) if degraded else None,
            timeout=600,
            console=console,
            live=False if not console.is_terminal else None,
        )
        findings = {}
        for path in out_dir.glob("*.json"):
            data = load_json(path.read_text())
            if data is not None:
                findings[path.stem] = data
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    unreachable = {
        host: msg
        for host, task, msg in result.failures
        if host in hosts and result.hosts.get(host) and result.hosts[host].unreachable
    }
    for host in hosts:
        if host not in findings and host not in unreachable:
            failed = [f"task '{t}': {m}" for h, t, m in result.failures if h == host]
            unreachable[host] = failed[0] if failed else "no findings came back"
    report = evaluate(
        hosts,
        inv.head,
        findings,
        unreachable=unreachable,
        hostfile_slots=_read_hostfile(inv.directory / "hostfile"),
        expected_slots={
            h: int(v)
            for h in inv.hosts
            if (v := inv.var(h, "dscluster_expected_slots")) is not None
        },
        cpu_slots={h: int(inv.var(h, "dscluster_cpu_slots", 1) or 1) for h in inv.hosts},
        recorded=recorded,
        shared_storage=shared,
        token=token,
        master_port=master_port,
        user=str(inv.var(inv.head, "dscluster_training_user", "ds")),
        thresholds=thresholds,
    )
    atomic_write(
        inv.directory / "reports" / "doctor-latest.json",
        json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n",
    )
    return report


def preflight(
    inv: Inventory, *, master_port: int, console: Console, what: str, skip: bool
) -> Callable[[], None] | None:
    """The doctor run `smoke`/`launch` make once their launch files are written, or None
    with --no-doctor."""
    if skip:
        return None
    return lambda: require_healthy(inv, master_port=master_port, console=console, what=what)


def require_healthy(inv: Inventory, *, master_port: int, console: Console, what: str) -> None:
    """Run doctor before a job; raise with the first failure when any check fails."""
    console.print(f"{what}: running doctor first (--no-doctor skips it)", highlight=False)
    report = run_doctor(inv, master_port=master_port, console=console)
    for line in problem_lines(report):
        console.print(line, markup=False, highlight=False)
    if not report.ok:
        console.print(table(report))
        raise DsclusterError(
            f"{summary_line(report)} — {what} not started (fix it, or pass --no-doctor)"
        )

"""Running doctor: gather the findings with playbooks/doctor.yml, judge them; the preflight
that smoke and launch run first.
"""

from __future__ import annotations

import json
import pathlib
import secrets
from collections.abc import Callable
from typing import Any

from rich.console import Console

from .. import rules, storage
from ..deepspeed_env import parse_env_file
from ..degraded import read_degraded
from ..errors import DsclusterError
from ..hostfile import parse_hostfile
from ..inventory import DEFAULT_MASTER_PORT, Inventory
from ..text import show_yaml
from ..util import atomic_write
from ..validate import read_text
from .evaluate import evaluate
from .exclude import Excluded, check_left, excluded_line, unhealthy
from .findings import load_json
from .record import check_record_dir, recordings, write_record
from .report import DoctorReport, Thresholds, problem_lines, summary_line, table


def _read_hostfile(path: pathlib.Path) -> dict[str, int] | None:
    """host -> slots of the hostfile (perhaps edited by hand), read as DeepSpeed reads it
    (hostfile.parse_hostfile); a bad line is refused with its number, before any playbook."""
    if not path.is_file():
        return None
    return dict(parse_hostfile(read_text(path, "hostfile"), str(path)))


def _recorded(inv: Inventory) -> dict[str, dict[str, Any]]:
    out = {}
    for host in inv.hosts:
        path = inv.directory / "facts" / f"{host}.json"
        if path.is_file():
            data = load_json(read_text(path, "facts file"))
            if data:
                out[host] = data
    return out


def _env_file(inv: Inventory) -> dict[str, str]:
    path = inv.directory / ".deepspeed_env"
    if not path.is_file():
        return {}
    try:
        return parse_env_file(read_text(path, ".deepspeed_env"), str(path))
    except (ValueError, TypeError) as exc:
        raise DsclusterError(
            f"{path} cannot be read ({exc}); rewrite it with 'dscluster hostfile'"
        ) from None


def _slot_var(inv: Inventory, host: str, name: str) -> int | None:
    """An int slot variable of the inventory (rules.yml checked its type at load); a
    template Ansible would render is refused: doctor compares numbers."""
    value = inv.var(host, name)
    if value is None:
        return None
    rules.check_value(name, value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise DsclusterError(
            f"{name} on {host} is {show_yaml(value)}; doctor needs a plain whole number "
            f"there, not a template: write e.g. {name}: 2 in {inv.source}"
        )
    return value


def _inputs(inv: Inventory) -> dict[str, Any]:
    """Everything doctor reads from the controller's files, read (and refused) before the
    playbook runs."""
    try:
        degraded = read_degraded(inv)
    except (ValueError, TypeError) as exc:
        raise DsclusterError(
            f"the degraded-nodes record of {inv.directory} cannot be read ({exc}); delete it "
            "and run 'dscluster provision' again"
        ) from None
    user = inv.var(inv.head, "dscluster_training_user", "ds")
    return {
        "degraded": degraded,
        "recorded": _recorded(inv),
        "env": _env_file(inv),
        "hostfile_slots": _read_hostfile(inv.directory / "hostfile"),
        "expected_slots": {
            h: v
            for h in inv.hosts
            if (v := _slot_var(inv, h, "dscluster_expected_slots")) is not None
        },
        "instance_types": {
            h: t
            for h in inv.hosts
            if isinstance(t := inv.var(h, "dscluster_instance_type", ""), str)
        },
        "expected_efa": {
            h: v
            for h in inv.hosts
            if (v := _slot_var(inv, h, "dscluster_expected_efa")) is not None
        },
        "cpu_slots": {h: _slot_var(inv, h, "dscluster_cpu_slots") or 1 for h in inv.hosts},
        "user": user if isinstance(user, str) and not rules.is_template(user) else "ds",
    }


def run_doctor(
    inv: Inventory,
    *,
    master_port: int = DEFAULT_MASTER_PORT,
    thresholds: Thresholds | None = None,
    console: Console | None = None,
    gpu_diag_budget: int = 0,
    record: pathlib.Path | None = None,
) -> DoctorReport:
    """Run playbooks/doctor.yml and judge what it found. Saves reports/doctor-latest.json;
    with `record`, the nodes' health outputs go to that directory (record.py) for --replay."""
    from ..runner import run_playbook  # noqa: PLC0415

    console = console or Console(stderr=True)
    if record is not None:
        check_record_dir(record)
    inputs = _inputs(inv)
    # Nodes a provision --allow-degraded left out are not in the hostfile: not checked either.
    degraded = inputs["degraded"]
    hosts = [h for h in inv.hosts if h not in degraded]
    if degraded:
        console.print(
            f"doctor: leaving out {', '.join(degraded)} (degraded, not in the hostfile)",
            markup=False,
            highlight=False,
        )
    recorded, env = inputs["recorded"], inputs["env"]
    token = secrets.token_hex(8)
    shared = storage.inventory_paths(inv).shared
    result = run_playbook(
        "doctor.yml",
        inv,
        extravars={
            "doctor_addresses": {
                h: str(f["address"]) for h, f in recorded.items() if f.get("address")
            },
            "doctor_ifnames": {
                k: v for k, v in env.items() if k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
            },
            "doctor_master_port": master_port,
            "doctor_token": token,
            "doctor_gpu_diag_budget": gpu_diag_budget,
        },
        limit=",".join(hosts) if degraded else None,
        timeout=600 + gpu_diag_budget,
        console=console,
        live=False if not console.is_terminal else None,
    )
    # The role hands the findings over as the play's custom stats: {host: findings}.
    findings = {
        host: data
        for host, data in result.handed("doctor_findings").items()
        if isinstance(data, dict)
    }
    unreachable = {
        host: msg
        for host, task, msg in result.failures
        if host in hosts and result.hosts.get(host) and result.hosts[host].unreachable
    }
    # A failure no host owns (the play did not start, a timeout): why no host reported.
    unowned = [f"{t}: {m}" for h, t, m in result.failures if h not in inv.hosts]
    for host in hosts:
        if host not in findings and host not in unreachable:
            failed = [f"task '{t}': {m}" for h, t, m in result.failures if h == host]
            unreachable[host] = (
                failed[0]
                if failed
                else f"no findings came back ({unowned[0]})"
                if unowned
                else f"no findings came back (the play ended {result.status}, rc {result.rc})"
            )
    live = [h for h in hosts if h in findings and h not in unreachable]
    health = recordings(
        live,
        findings,
        recorded=recorded,
        expected_slots=inputs["expected_slots"],
        instance_types=inputs["instance_types"],
        expected_efa=inputs["expected_efa"],
    )
    report = evaluate(
        hosts,
        inv.head,
        findings,
        unreachable=unreachable,
        hostfile_slots=inputs["hostfile_slots"],
        expected_slots=inputs["expected_slots"],
        cpu_slots=inputs["cpu_slots"],
        recorded=recorded,
        shared_storage=shared,
        token=token,
        master_port=master_port,
        user=inputs["user"],
        thresholds=thresholds,
        health=health,
    )
    if record is not None:
        write_record(record, health)
        console.print(
            f"doctor: recorded {len(health)} node(s)' health outputs in {record} "
            f"(judge them again with 'dscluster doctor --replay {record}')",
            markup=False,
            highlight=False,
        )
    atomic_write(
        inv.directory / "reports" / "doctor-latest.json",
        json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n",
    )
    return report


NO_DOCTOR_EXCLUDE = (
    "--exclude-unhealthy leaves out the nodes doctor fails, and --no-doctor skips doctor: "
    "nothing to exclude by; drop one of them"
)


def preflight(
    inv: Inventory,
    *,
    master_port: int,
    console: Console,
    what: str,
    skip: bool,
    exclude_unhealthy: bool = False,
) -> Callable[[], list[Excluded]] | None:
    """The doctor run `smoke`/`launch` make once their launch files are written, or None
    with --no-doctor. It returns the nodes to leave out of the run (exclude.py): none
    without `exclude_unhealthy`, where any failure stops the job instead."""
    if skip and exclude_unhealthy:
        raise DsclusterError(NO_DOCTOR_EXCLUDE)
    if skip:
        return None
    return lambda: require_healthy(
        inv,
        master_port=master_port,
        console=console,
        what=what,
        exclude_unhealthy=exclude_unhealthy,
    )


def require_healthy(
    inv: Inventory,
    *,
    master_port: int,
    console: Console,
    what: str,
    exclude_unhealthy: bool = False,
) -> list[Excluded]:
    """Run doctor before a job; raise with the first failure when any check fails. With
    `exclude_unhealthy`, the failing (and to-be-isolated) nodes are returned instead, each
    said on the console, unless the head is one of them (exclude.check_left)."""
    console.print(f"{what}: running doctor first (--no-doctor skips it)", highlight=False)
    report = run_doctor(inv, master_port=master_port, console=console)
    for line in problem_lines(report):
        console.print(line, markup=False, highlight=False)
    if not report.ok:
        console.print(table(report, console.width))
    if not exclude_unhealthy:
        if not report.ok:
            raise DsclusterError(
                f"{summary_line(report)} — {what} not started (fix it, pass "
                "--exclude-unhealthy to run without the failing nodes, or pass --no-doctor)"
            )
        return []
    excluded = unhealthy(report)
    check_left(report, excluded, what)
    for e in excluded:
        console.print(excluded_line(e, what), markup=False, highlight=False, soft_wrap=True)
    return excluded

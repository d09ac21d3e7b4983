"""Checks on each node: /dev/shm, disk, the shared path, libaio, socket interfaces, the
versions manifest against the others, hostfile slots against the accelerators.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .report import GIB, MIB, Thresholds

# Fields of the versions manifest (roles/ml_stack/files/record_versions.py) that must agree.
VERSION_FIELDS = (
    "python",
    "torch",
    "deepspeed",
    "installed_ops",
    "accelerator",
    "cuda",
    "nccl",
    "nvidia_driver",
    "synapseai",
    "libfabric",
    "lock_sha256",
    # the wheelhouse's user layer (ml_stack_extra_requirements / ml_stack_requirements_file)
    "user_layer_key",
    "user_lock_sha256",
)
RDMA_PROFILES = {"efa", "ib", "roce"}
# A path root would run from that is not root's up to / (the probe's root_chain): the probe
# ran nothing from it and its finding names the path and its owner.
UNSAFE_FIX = (
    "make that path root's up to / (chown root:root, chmod go-w), or set the variable that "
    "names it (dscluster_venv, doctor_venv, doctor_bin_dir, doctor_accelerators_fact) to a "
    "path below root's own directories, then run 'dscluster provision'"
)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def judge_local(report, live, node, *, t: Thresholds, shared_storage: bool, token: str) -> None:  # noqa: C901, PLR0912 - one branch per local check (shm, disk, shared, libaio, ifname)
    for host in live:
        data = node[host]
        if not data:
            continue
        shm = data.get("shm") or {}
        size = int(shm.get("size_bytes", 0))
        if size < t.min_shm_bytes:
            report.cell("shm", host).add(
                "fail",
                f"/dev/shm is {_size(size)}, below {_size(t.min_shm_bytes)} (NCCL's shared "
                "memory transport and dataloader workers fail with 'No space left on device')",
                "containers: docker run --shm-size=8g (or --ipc=host; dscluster local up "
                "--shm-size); hosts: mount -o remount,size=50% /dev/shm",
            )
        else:
            report.cell("shm", host).add("pass", _size(size))
        for path, disk in sorted((data.get("disk") or {}).items()):
            free = int(disk.get("free_bytes", 0))
            detail = f"{path}: {_size(free)} free"
            fix = f"free space on {host}'s filesystem holding {path}"
            if free < t.min_free_bytes:
                report.cell("disk", host).add("fail", detail, fix)
            elif free < t.warn_free_bytes:
                report.cell("disk", host).add("warn", detail, fix)
            else:
                report.cell("disk", host).add("pass", detail)
        shared = data.get("shared") or {}
        if not shared_storage:
            report.cell("shared", host).add("skip", "no shared storage declared")
        elif shared.get("read") == token and token:
            report.cell("shared", host).add("pass", f"token read at {shared.get('path')}")
        else:
            what = shared.get("error") or f"read {shared.get('read', '')!r}"
            report.cell("shared", host).add(
                "fail",
                f"the token the head wrote is not visible at {shared.get('path')} ({what}): "
                "this directory is not the head's shared storage",
                f"mount the shared filesystem on {host} (dscluster_shared_dir) and provision",
            )
        aio = data.get("libaio") or {}
        fix = f"reinstall libaio on {host}: 'dscluster provision --tags base_packages'"
        if aio.get("missing_libs"):
            report.cell("libaio", host).add(
                "fail",
                f"DeepSpeed's async_io op cannot load: {', '.join(aio['missing_libs'])} not found",
                fix,
            )
        elif aio and not aio.get("ldconfig"):
            report.cell("libaio", host).add("fail", "libaio.so.1 is not in the loader cache", fix)
        for variable, res in sorted((data.get("ifname") or {}).items()):
            if res.get("error"):
                report.cell("ifname", host).add(
                    "fail",
                    res["error"],
                    UNSAFE_FIX
                    if res.get("unsafe")
                    else "set dscluster_nccl_socket_ifname to an interface every node has (or "
                    "unset it) and run 'dscluster provision --tags nccl_env'",
                )
            else:
                report.cell("ifname", host).add(
                    "pass", f"{variable}={res.get('spec')} → {', '.join(res.get('matched', []))}"
                )


def _majority(values: Mapping[str, str], head: str) -> str:
    counts: dict[str, int] = {}
    for value in values.values():
        counts[value] = counts.get(value, 0) + 1
    best = max(counts.values())
    tied = [v for v, c in counts.items() if c == best]
    return values[head] if head in values and values[head] in tied else sorted(tied)[0]


def _cell_text(value: Any) -> str:
    """A manifest value as the versions row shows it: a list as [a,b], nothing as (none)."""
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value) if value not in ("", None) else "(none)"


def judge_versions(report, live, head, node, recorded) -> None:
    manifests: dict[str, dict[str, Any]] = {}
    for host in live:
        versions = (node[host] or {}).get("versions")
        if versions is None:
            continue
        if "error" in versions:
            fix = (
                UNSAFE_FIX
                if versions.get("unsafe")
                else "run 'dscluster provision --tags ml_stack'"
            )
            report.cell("versions", host).add("fail", versions["error"], fix)
            continue
        manifests[host] = versions
    for field in VERSION_FIELDS:
        values = {h: _cell_text(m.get(field, "")) for h, m in manifests.items()}
        if len(set(values.values())) <= 1:
            continue
        usual = _majority(values, head)
        where = ", ".join(h for h, v in values.items() if v == usual)
        for host, value in values.items():
            if value != usual:
                report.cell("versions", host).add(
                    "fail",
                    f"{field} {value} here, {usual} on {where}",
                    "run 'dscluster provision' (ml_stack reinstalls the locked wheels; every "
                    "node must run the same build, NCCL/NVIDIA say so too)",
                )
    for host, manifest in manifests.items():
        before = (recorded.get(host) or {}).get("versions") or {}
        drift = [
            f"{f} {_cell_text(before[f])} → {_cell_text(manifest.get(f, ''))}"
            for f in ("torch", "deepspeed", "installed_ops", "cuda", "nccl")
            if f in before and _cell_text(before[f]) != _cell_text(manifest.get(f, ""))
        ]
        if drift:
            report.cell("versions", host).add(
                "warn",
                "differs from what provision recorded: " + "; ".join(drift),
                "run 'dscluster provision' to put the locked build back",
            )
        elif report.cell("versions", host).status == "pass":
            report.cell("versions", host).add(
                "pass",
                f"torch {manifest.get('torch')}, deepspeed {manifest.get('deepspeed')}, "
                f"{len(manifest.get('installed_ops') or [])} ops",
            )


def judge_slots(report, live, node, *, hostfile_slots, expected_slots, cpu_slots) -> None:
    for host in live:
        acc = (node[host] or {}).get("accelerators") or {}
        if not acc or acc.get("error"):
            report.cell("slots", host).add(
                "fail",
                f"accelerators not detected: {acc.get('error', 'no data')}",
                UNSAFE_FIX if acc.get("unsafe") else "run 'dscluster provision --tags node_facts'",
            )
            continue
        kind, count = str(acc.get("kind", "cpu")), int(acc.get("count", 0) or 0)
        slots = count if kind != "cpu" else int((cpu_slots or {}).get(host, 1))
        what = f"{count} {kind} device(s)" if kind != "cpu" else f"a CPU node ({slots} slot(s))"
        fix = "rewrite it with 'dscluster hostfile' (or check the node: a device gone?)"
        want = (expected_slots or {}).get(host)
        if want is not None and kind != "cpu" and int(want) != count:
            report.cell("slots", host).add(
                "fail",
                f"{host} should have {want} accelerators (its instance type / Slurm gres), "
                f"{count} {kind} detected now",
                "check the node's devices (nvidia-smi / hl-smi); a GPU may have fallen off",
            )
        if hostfile_slots is None:
            report.cell("slots", host).add("skip", "no hostfile yet ('dscluster hostfile')")
        elif host not in hostfile_slots:
            report.cell("slots", host).add("warn", f"{host} is not in the hostfile", fix)
        elif hostfile_slots[host] != slots:
            report.cell("slots", host).add(
                "fail", f"hostfile gives {host} slots={hostfile_slots[host]}; it has {what}", fix
            )
        else:
            report.cell("slots", host).add("pass", f"slots={slots} ({kind})")

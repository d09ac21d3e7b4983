"""`dscluster doctor`: every node and every pair of nodes checked before a job starts.

playbooks/doctor.yml (role `doctor`) gathers findings on the nodes and writes one JSON file
per host on the controller; `evaluate` judges them here, as pure functions: a table of
check x node (pass / warn / fail / skip), one line per problem naming the node and the fix.

Attribution for pairwise checks (SSH, ports): a target that no node reaches is the target's
fault (sshd down, a firewall on it); a source that reaches no target is the source's; other
failed pairs are the source's, naming the target. A node the controller cannot reach fails
`reach`, and nothing else is blamed on it or on the nodes that could not reach it.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import storage
from .errors import DsclusterError
from .hostfile import parse_env_file
from .inventory import DEFAULT_MASTER_PORT, Inventory
from .paths import cache_dir
from .util import atomic_write

CHECKS: dict[str, str] = {
    "reach": "the controller reaches the node (Ansible over SSH)",
    "ssh": "SSH to every node as the training user (BatchMode, StrictHostKeyChecking)",
    "pdsh": "pdsh from the head reaches the node (DeepSpeed's launcher path)",
    "resolve": "every cluster host name resolves to its address on this node",
    "rendezvous": "the head's rendezvous port is reachable from this node",
    "ports": "ephemeral TCP ports reachable between every pair of nodes",
    "clock": "clock offset from the head",
    "shm": "/dev/shm size",
    "memlock": "ulimit -l as the launcher's sessions see it (through pdsh)",
    "disk": "free disk on the venv and shared paths",
    "shared": "the shared path is really shared (a token written on the head)",
    "versions": "python/torch/deepspeed/ops/CUDA/NCCL/driver/SynapseAI/libfabric agree",
    "libaio": "libaio present and DeepSpeed's async_io op loadable",
    "slots": "hostfile slots match the accelerators detected now",
    "ifname": "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name an addressed interface",
}
STATUS_ORDER = {"pass": 0, "skip": 1, "warn": 2, "fail": 3}
STYLE = {"pass": "green", "skip": "dim", "warn": "yellow", "fail": "bold red"}
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
)
RDMA_PROFILES = {"efa", "ib", "roce"}
GIB = 1 << 30
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Thresholds:
    min_shm_bytes: int = GIB
    min_free_bytes: int = 2 * GIB
    warn_free_bytes: int = 10 * GIB
    clock_warn_s: float = 0.5
    clock_fail_s: float = 2.0
    # Where RDMA or accelerators pin memory (NCCL over EFA/IB, CUDA pinned buffers), memlock
    # must be unlimited; on CPU nodes over TCP a small limit only bounds pinned CPU buffers.
    min_memlock_kb_cpu: int = 64


@dataclasses.dataclass
class Cell:
    status: str = "pass"
    details: list[str] = dataclasses.field(default_factory=list)
    fixes: list[str] = dataclasses.field(default_factory=list)

    def add(self, status: str, detail: str, fix: str = "") -> None:
        if STATUS_ORDER[status] > STATUS_ORDER[self.status]:
            self.status = status
        if detail and detail not in self.details:
            self.details.append(detail)
        if fix and fix not in self.fixes:
            self.fixes.append(fix)


@dataclasses.dataclass
class DoctorReport:
    hosts: list[str]
    head: str
    cells: dict[str, dict[str, Cell]]  # check -> host -> cell

    def cell(self, check: str, host: str) -> Cell:
        return self.cells.setdefault(check, {}).setdefault(host, Cell())

    @property
    def ok(self) -> bool:
        return not self.problems("fail")

    def problems(self, status: str = "fail") -> list[tuple[str, str, Cell]]:
        """(host, check, cell) with that status, in host order then check order."""
        out = []
        for host in self.hosts:
            for check in CHECKS:
                cell = self.cells.get(check, {}).get(host)
                if cell and cell.status == status:
                    out.append((host, check, cell))
        return out

    def failed(self) -> set[tuple[str, str]]:
        return {(host, check) for host, check, _ in self.problems("fail")}

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "head": self.head,
            "hosts": self.hosts,
            "checks": {
                check: {host: dataclasses.asdict(cell) for host, cell in self.cells[check].items()}
                for check in CHECKS
                if check in self.cells
            },
            "failures": [
                {"host": h, "check": c, "detail": "; ".join(cell.details), "fix": cell.fixes}
                for h, c, cell in self.problems("fail")
            ],
            "warnings": [
                {"host": h, "check": c, "detail": "; ".join(cell.details), "fix": cell.fixes}
                for h, c, cell in self.problems("warn")
            ],
        }


# --- judging ----------------------------------------------------------------------------------


def _json(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _stdout_json(finding: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """The JSON a probe step printed (a registered command result), or None."""
    result = finding.get(key) or {}
    if not isinstance(result, Mapping) or result.get("skipped"):
        return None
    return _json(str(result.get("stdout", "")))


def _step_error(finding: Mapping[str, Any], key: str) -> str:
    result = finding.get(key) or {}
    if not isinstance(result, Mapping):
        return "no result"
    lines = [ln.strip() for ln in str(result.get("stderr", "")).splitlines() if ln.strip()]
    err = lines[-1][-300:] if lines else ""
    return f"probe step '{key}' failed (rc={result.get('rc')}): {err or result.get('msg', '')}"


def _ssh_fix(src: str, dst: str, error: str, user: str) -> str:
    if "Host key verification failed" in error or "REMOTE HOST IDENTIFICATION" in error:
        return (
            f"{dst}'s host key is missing or wrong in {src}'s /etc/ssh/ssh_known_hosts; run "
            "'dscluster provision --tags cluster_ssh' (pins every node's key)"
        )
    if "Permission denied" in error:
        return (
            f"{user}'s cluster key is not authorized on {dst}; run 'dscluster provision "
            "--tags cluster_ssh'"
        )
    if "resolve" in error.lower():
        return f"{src} cannot resolve {dst}: fix /etc/hosts or DNS on {src} (see 'resolve')"
    return f"check the network and sshd between {src} and {dst} (firewall, security group)"


def _attribute(
    pairs: Mapping[tuple[str, str], str], sources: Sequence[str], targets: Sequence[str]
) -> tuple[dict[str, str], dict[str, str], dict[tuple[str, str], str]]:
    """Split failed (src, dst) pairs into targets no source reaches, sources that reach no
    target, and the remaining pairs (blamed on the source)."""
    bad_targets: dict[str, str] = {}
    for dst in targets:
        srcs = [s for s in sources if s != dst]
        if srcs and all((s, dst) in pairs for s in srcs):
            bad_targets[dst] = pairs[(srcs[0], dst)]
    bad_sources: dict[str, str] = {}
    for src in sources:
        dsts = [d for d in targets if d != src and d not in bad_targets]
        if len(dsts) > 1 and all((src, d) in pairs for d in dsts):
            bad_sources[src] = pairs[(src, dsts[0])]
    rest = {
        (s, d): why
        for (s, d), why in pairs.items()
        if d not in bad_targets and s not in bad_sources
    }
    return bad_targets, bad_sources, rest


def evaluate(
    hosts: Sequence[str],
    head: str,
    findings: Mapping[str, Mapping[str, Any]],
    *,
    unreachable: Mapping[str, str] | None = None,
    hostfile_slots: Mapping[str, int] | None = None,
    expected_slots: Mapping[str, int] | None = None,
    cpu_slots: Mapping[str, int] | None = None,
    recorded: Mapping[str, Mapping[str, Any]] | None = None,
    shared_storage: bool = False,
    token: str = "",
    master_port: int = DEFAULT_MASTER_PORT,
    user: str = "ds",
    thresholds: Thresholds | None = None,
) -> DoctorReport:
    """Judge the findings. findings: host -> the JSON the doctor role wrote for it.
    recorded: host -> its recorded facts (facts/<host>.json from provision), for the NCCL
    profile, the accelerator kind and the versions provision installed."""
    t = thresholds or Thresholds()
    unreachable = dict(unreachable or {})
    recorded = recorded or {}
    report = DoctorReport(hosts=list(hosts), head=head, cells={c: {} for c in CHECKS})
    live: list[str] = []
    node: dict[str, dict[str, Any]] = {}
    for host in hosts:
        finding = findings.get(host)
        if host in unreachable or finding is None:
            why = unreachable.get(host) or "no findings came back (the play stopped on it)"
            report.cell("reach", host).add(
                "fail",
                f"not reachable from the controller: {why}",
                f"start {host} or fix SSH to it; 'dscluster provision --allow-degraded' "
                "leaves it out of the hostfile",
            )
            for check in CHECKS:
                if check != "reach":
                    report.cell(check, host).add("skip", "node not reachable")
            continue
        report.cell("reach", host)
        live.append(host)
        data = _stdout_json(finding, "node")
        if data is None:
            report.cell("versions", host).add("fail", _step_error(finding, "node"))
            data = {}
        node[host] = data

    _judge_ssh(report, live, findings, user)
    _judge_pdsh_memlock(report, live, head, findings, recorded=recorded, t=t)
    _judge_resolve(report, live, node)
    _judge_ports(report, live, head, findings, master_port)
    _judge_clock(report, live, head, findings, t)
    _judge_local(report, live, node, t=t, shared_storage=shared_storage, token=token)
    _judge_versions(report, live, head, node, recorded)
    _judge_slots(
        report,
        live,
        node,
        hostfile_slots=hostfile_slots,
        expected_slots=expected_slots,
        cpu_slots=cpu_slots,
    )
    return report


def _judge_ssh(report, live, findings, user) -> None:
    pairs: dict[tuple[str, str], str] = {}
    for src in live:
        data = _stdout_json(findings[src], "ssh")
        if data is None:
            report.cell("ssh", src).add("fail", _step_error(findings[src], "ssh"))
            continue
        for dst, res in (data.get("results") or {}).items():
            if dst in live and not res.get("ok"):
                pairs[(src, dst)] = str(res.get("error", "failed"))
    bad_targets, bad_sources, rest = _attribute(pairs, live, live)
    for dst, why in bad_targets.items():
        report.cell("ssh", dst).add(
            "fail",
            f"no node can log in to {dst} as {user}: {why}",
            f"check sshd on {dst} and 'dscluster provision --tags cluster_ssh'",
        )
    for src, why in bad_sources.items():
        report.cell("ssh", src).add(
            "fail",
            f"{src} can log in to no other node as {user}: {why}",
            f"check {user}'s key and ~/.ssh on {src}: 'dscluster provision --tags cluster_ssh'",
        )
    for (src, dst), why in sorted(rest.items()):
        report.cell("ssh", src).add("fail", f"{src} → {dst}: {why}", _ssh_fix(src, dst, why, user))


def _judge_pdsh_memlock(report, live, head, findings, *, recorded, t: Thresholds) -> None:
    if head not in live:
        for host in live:
            report.cell("pdsh", host).add("skip", "the head is not reachable")
            report.cell("memlock", host).add("skip", "the head is not reachable")
        return
    data = _stdout_json(findings[head], "pdsh")
    if data is None or not data.get("installed", True):
        why = (data or {}).get("error") or _step_error(findings[head], "pdsh")
        report.cell("pdsh", head).add(
            "fail",
            why,
            "install pdsh on the head: 'dscluster provision --tags pdsh' (DeepSpeed's "
            "default launcher runs pdsh -R ssh from the head)",
        )
        for host in live:
            report.cell("memlock", host).add("skip", "not measured: pdsh does not run")
        return
    memlock = data.get("memlock") or {}
    errors = data.get("errors") or {}
    for host in live:
        if host not in memlock:
            report.cell("pdsh", host).add(
                "fail",
                f"pdsh from {head}: {errors.get(host, 'no answer')}",
                f"check ssh from {head} to {host} as the training user (see 'ssh')",
            )
            report.cell("memlock", host).add("skip", "not measured: pdsh did not reach it")
            continue
        value = memlock[host]
        facts = recorded.get(host) or {}
        kind = str((facts.get("accelerators") or {}).get("kind", "cpu"))
        profile = str((facts.get("nccl_env") or {}).get("profile", ""))
        needs_unlimited = kind != "cpu" or profile in RDMA_PROFILES
        cell = report.cell("memlock", host)
        fix = (
            "raise memlock for the training user: '* - memlock unlimited' in "
            "/etc/security/limits.d (sshd applies it through pam_limits), or docker run "
            "--ulimit memlock=-1"
        )
        if value == "unlimited":
            cell.add("pass", "unlimited")
        elif not value.isdigit():
            cell.add("fail", f"ulimit -l printed {value!r}", fix)
        elif needs_unlimited:
            why = f"{kind} node" if kind != "cpu" else f"{profile} fabric"
            cell.add(
                "fail", f"{value} KiB; a {why} needs unlimited (pinned, registered memory)", fix
            )
        elif int(value) < t.min_memlock_kb_cpu:
            cell.add("fail", f"{value} KiB, below {t.min_memlock_kb_cpu} KiB", fix)
        else:
            cell.add("pass", f"{value} KiB (CPU node over TCP)")


def _judge_resolve(report, live, node) -> None:
    for src in live:
        for name, res in sorted((node[src].get("resolve") or {}).items()):
            expected, addresses = res.get("expected", ""), res.get("addresses") or []
            fix = (
                f"fix /etc/hosts or DNS on {src} so {name} resolves to {expected or 'its address'}"
            )
            if not addresses:
                report.cell("resolve", src).add("fail", f"{src} cannot resolve {name}", fix)
            elif expected and addresses[0] != expected:
                report.cell("resolve", src).add(
                    "fail",
                    f"{src} resolves {name} to {', '.join(addresses)}, but {name} is at "
                    f"{expected} (a stale /etc/hosts entry?)",
                    fix,
                )


def _judge_ports(report, live, head, findings, master_port) -> None:
    listens = {h: findings[h].get("listen") or {} for h in live}
    if head in live:
        listen = listens[head]
        if master_port in (listen.get("busy") or []):
            report.cell("rendezvous", head).add(
                "warn",
                f"port {master_port} is in use on {head} (a job running?); not probed",
                "end the other job or pass --master-port with a free port",
            )
        elif not listen:
            report.cell("rendezvous", head).add("fail", "no listener started on the head")
    for kind, check in (("rendezvous", "rendezvous"), ("ephemeral", "ports")):
        pairs: dict[tuple[str, str], str] = {}
        ports_of: dict[str, set[int]] = {}
        for src in live:
            data = _stdout_json(findings[src], "connect")
            if data is None:
                report.cell(check, src).add("fail", _step_error(findings[src], "connect"))
                continue
            for res in data.get("results") or []:
                if res.get("kind") != kind or res.get("host") not in live:
                    continue
                dst = res["host"]
                ports_of.setdefault(dst, set()).add(int(res["port"]))
                if not res.get("ok"):
                    msg = f"port {res['port']}: {res.get('error', 'failed')}"
                    previous = pairs.get((src, dst))
                    pairs[(src, dst)] = f"{previous}, {msg}" if previous else msg
        targets = [head] if kind == "rendezvous" else live
        bad_targets, bad_sources, rest = _attribute(pairs, live, targets)
        span = {h: listens[h].get("range") for h in live}
        for dst, why in bad_targets.items():
            if kind == "rendezvous":
                detail = f"no node reaches {dst}:{master_port} ({why})"
                fix = (
                    f"open TCP {master_port} on {dst} (iptables, security group) or pass "
                    "--master-port with a port that is open"
                )
            else:
                lo_hi = span.get(dst) or ["?", "?"]
                detail = f"no node reaches {dst}'s ephemeral ports ({why})"
                fix = (
                    f"allow TCP {lo_hi[0]}-{lo_hi[1]} into {dst} from the other nodes: NCCL and "
                    "gloo connect on ephemeral ports (AWS: a security group allowing all "
                    "traffic from itself)"
                )
            report.cell(check, dst).add("fail", detail, fix)
        for src, why in bad_sources.items():
            report.cell(check, src).add(
                "fail",
                f"{src} reaches no other node's {kind} ports ({why})",
                f"check outbound firewall rules on {src}",
            )
        for (src, dst), why in sorted(rest.items()):
            report.cell(check, src).add(
                "fail",
                f"{src} → {dst}: {why}",
                f"check the firewall between {src} and {dst}",
            )
        probed = bool(ports_of.get(head)) or master_port in (
            listens.get(head, {}).get("busy") or []
        )
        if kind == "rendezvous" and head in live and len(live) > 1 and not probed:
            report.cell(check, head).add("warn", "no node probed the rendezvous port")


def _judge_clock(report, live, head, findings, t: Thresholds) -> None:
    base = head if head in live else (live[0] if live else "")
    data = _stdout_json(findings[base], "ssh") if base else None
    if not data:
        return
    for host in live:
        res = (data.get("results") or {}).get(host) or {}
        if not res.get("ok"):
            report.cell("clock", host).add("skip", f"not measured: no SSH from {base}")
            continue
        offset = float(res.get("offset_s", 0.0))
        detail = f"{offset:+.3f} s vs {base}"
        fix = f"run chrony/NTP on {host} (and on {base}) so the clocks agree"
        if abs(offset) > t.clock_fail_s:
            report.cell("clock", host).add("fail", detail, fix)
        elif abs(offset) > t.clock_warn_s:
            report.cell("clock", host).add("warn", detail, fix)
        else:
            report.cell("clock", host).add("pass", detail)


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _judge_local(report, live, node, *, t: Thresholds, shared_storage: bool, token: str) -> None:
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
                    "set dscluster_nccl_socket_ifname to an interface every node has (or unset "
                    "it) and run 'dscluster provision --tags nccl_env'",
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


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value) if value not in ("", None) else "(none)"


def _judge_versions(report, live, head, node, recorded) -> None:
    manifests: dict[str, dict[str, Any]] = {}
    for host in live:
        versions = (node[host] or {}).get("versions")
        if versions is None:
            continue
        if "error" in versions:
            report.cell("versions", host).add(
                "fail", versions["error"], "run 'dscluster provision --tags ml_stack'"
            )
            continue
        manifests[host] = versions
    for field in VERSION_FIELDS:
        values = {h: _show(m.get(field, "")) for h, m in manifests.items()}
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
            f"{f} {_show(before[f])} → {_show(manifest.get(f, ''))}"
            for f in ("torch", "deepspeed", "installed_ops", "cuda", "nccl")
            if f in before and _show(before[f]) != _show(manifest.get(f, ""))
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


def _judge_slots(report, live, node, *, hostfile_slots, expected_slots, cpu_slots) -> None:
    for host in live:
        acc = (node[host] or {}).get("accelerators") or {}
        if not acc or acc.get("error"):
            report.cell("slots", host).add(
                "fail",
                f"accelerators not detected: {acc.get('error', 'no data')}",
                "run 'dscluster provision --tags node_facts'",
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


# --- running ----------------------------------------------------------------------------------


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
            data = _json(path.read_text())
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
    from .hostfile import read_degraded  # noqa: PLC0415
    from .runner import run_playbook  # noqa: PLC0415

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
            data = _json(path.read_text())
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


def table(report: DoctorReport) -> Table:
    t = Table(title=f"doctor: {len(report.hosts)} nodes, head {report.head}", title_justify="left")
    t.add_column("check")
    for host in report.hosts:
        t.add_column(host)
    for check in CHECKS:
        row = [check]
        for host in report.hosts:
            cell = report.cells.get(check, {}).get(host) or Cell()
            row.append(Text(cell.status, style=STYLE[cell.status]))
        t.add_row(*row)
    return t


def problem_lines(report: DoctorReport) -> list[str]:
    lines = []
    for status in ("fail", "warn"):
        for host, check, cell in report.problems(status):
            fix = f" — fix: {'; '.join(cell.fixes)}" if cell.fixes else ""
            lines.append(f"{status.upper()} {host} {check}: {'; '.join(cell.details)}{fix}")
    return lines


def summary_line(report: DoctorReport) -> str:
    fails = report.problems("fail")
    if not fails:
        warns = len(report.problems("warn"))
        extra = f" ({warns} warning(s))" if warns else ""
        return f"doctor: every check passed on {len(report.hosts)} nodes{extra}"
    where = sorted({h for h, _, _ in fails}, key=report.hosts.index)
    checks = sorted({c for _, c, _ in fails}, key=list(CHECKS).index)
    return (
        f"doctor: {len(fails)} failure(s) on {', '.join(where)} ({', '.join(checks)}); "
        f"first: {problem_lines(report)[0]}"
    )


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

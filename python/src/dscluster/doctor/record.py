"""The node health outputs as the judges read them, from a live run or from a directory:
`doctor --record DIR` writes them, `doctor --replay DIR` judges them without contacting
anything.

    DIR/<host>/<file>          each output the probe recorded (health.FILES names), 0600
    DIR/<host>/probe.json      the probe's index: argv, rc, seconds, why a file is missing
    DIR/<host>/expect.json     what the node should have (accelerator kind, device count)

Directories are 0700 and files 0600: the kernel log lines are the node's own. A directory
made by hand (an admin's `nvidia-smi -q -x > DIR/n1/nvidia-smi-q.xml`) replays too: without
probe.json a file not there is "not recorded"; without expect.json the accelerator kind is
read off the files present.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import stat
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import DsclusterError
from .findings import stdout_json
from .health import FILES, PROBE_INDEX, Expect, NodeOutputs
from .health.registry import add_cells, judge_node
from .report import HEALTH_CHECKS, DoctorReport

EXPECT = "expect.json"
# A recorded file is at most 4 MiB (the probe's cap); a hand-made one gets some slack.
MAX_FILE = 64 << 20
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
# the accelerators fact's kinds (node_facts) -> Expect's
KINDS = {"cuda": "nvidia", "nvidia": "nvidia", "hpu": "gaudi", "gaudi": "gaudi"}


@dataclasses.dataclass(frozen=True)
class Recording:
    """One node's recorded health outputs, the probe's index of them, what it should have."""

    outputs: NodeOutputs
    index: Mapping[str, Mapping[str, Any]]
    expect: Expect


def expect_for(
    host: str,
    facts: Mapping[str, Any] | None,
    live: Mapping[str, Any] | None,
    expected_slots: int | None,
    instance_type: str = "",
    efa: int | None = None,
) -> Expect:
    """The accelerator kind and count provision recorded (facts/<host>.json), else the ones
    detected now; dscluster_expected_slots overrides the count. EFA: the EFA interfaces the
    inventory says the instance has (dscluster_expected_efa, from EC2 at discovery), or None:
    not judged against a count."""
    recorded = (facts or {}).get("accelerators") or {}
    now = live or {}
    kind = KINDS.get(str(recorded.get("kind") or now.get("kind") or "cpu"), "cpu")
    count = recorded.get("count") if recorded.get("kind") else now.get("count")
    devices = expected_slots if expected_slots is not None else count
    if kind == "cpu" or isinstance(devices, bool) or not isinstance(devices, int):
        devices = None
    return Expect(accelerator=kind, devices=devices, efa=efa, instance_type=instance_type)


def from_probe(host: str, health: Any, expect: Expect) -> Recording:
    """A node's "health" as the probe returned it ({"files", "index"}); what is not the
    probe's shape is left out, and a node whose probe recorded nothing says so."""
    health = health if isinstance(health, Mapping) else {}
    raw_files = health.get("files") if isinstance(health.get("files"), Mapping) else {}
    raw_index = health.get("index") if isinstance(health.get("index"), Mapping) else {}
    files = {n: t for n, t in raw_files.items() if n in FILES and isinstance(t, str)}
    index = {n: dict(e) for n, e in raw_index.items() if n in FILES and isinstance(e, Mapping)}
    missing = {n: str(e["missing"]) for n, e in index.items() if e.get("missing")}
    if not health:
        why = f"the doctor probe on {host} recorded no health outputs"
        missing = {n: why for n in FILES}
    return Recording(NodeOutputs(host, files, missing), index, expect)


def recordings(
    live: Sequence[str],
    findings: Mapping[str, Mapping[str, Any]],
    *,
    recorded: Mapping[str, Mapping[str, Any]] | None = None,
    expected_slots: Mapping[str, int] | None = None,
    instance_types: Mapping[str, str] | None = None,
    expected_efa: Mapping[str, int] | None = None,
) -> dict[str, Recording]:
    """Every live node's recording from the findings the doctor role handed over."""
    out = {}
    for host in live:
        node = stdout_json(findings.get(host) or {}, "node") or {}
        expect = expect_for(
            host,
            (recorded or {}).get(host),
            node.get("accelerators"),
            (expected_slots or {}).get(host),
            (instance_types or {}).get(host, ""),
            (expected_efa or {}).get(host),
        )
        out[host] = from_probe(host, node.get("health"), expect)
    return out


def judge_health(report: DoctorReport, recs: Mapping[str, Recording]) -> None:
    for host, rec in recs.items():
        add_cells(report, host, judge_node(rec.outputs, rec.expect))


# ---- --record ------------------------------------------------------------------------------


def check_record_dir(path: pathlib.Path) -> pathlib.Path:
    """Refuse, before anything runs, a DIR that is a link, a file, or a non-empty directory."""
    raw = str(path)
    if path.is_symlink():
        raise DsclusterError(f"--record {raw} is a symbolic link; give a new directory's path")
    if path.exists() and not path.is_dir():
        raise DsclusterError(f"--record {raw} is a file; give a new or empty directory")
    if path.is_dir() and any(path.iterdir()):
        raise DsclusterError(
            f"--record {raw} is not empty; give a new or empty directory (a recording is "
            "never mixed with another)"
        )
    parent = path.absolute().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise DsclusterError(f"--record {raw}: {parent} is not a writable directory")
    return path


def _write(path: pathlib.Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text)


def write_record(path: pathlib.Path, recs: Mapping[str, Recording]) -> None:
    """DIR/<host>/<file>, probe.json and expect.json for every node (dirs 0700, files 0600)."""
    check_record_dir(path)
    try:
        if not path.exists():
            path.mkdir(mode=0o700)
        os.chmod(path, 0o700)
        for host, rec in recs.items():
            if not HOST.fullmatch(host) or host.startswith("."):
                raise DsclusterError(f"cannot record host {host!r}: not a plain host name")
            folder = path / host
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)
            for name, text in rec.outputs.files.items():
                _write(folder / name, text)
            _write(folder / PROBE_INDEX, json.dumps(rec.index, indent=2, sort_keys=True) + "\n")
            expect = json.dumps(dataclasses.asdict(rec.expect), indent=2, sort_keys=True)
            _write(folder / EXPECT, expect + "\n")
    except OSError as exc:
        raise DsclusterError(
            f"cannot record into {path}: {exc.strerror or exc}; give a writable new directory"
        ) from None


# ---- --replay ------------------------------------------------------------------------------


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _host_dirs(path: pathlib.Path) -> list[str]:
    raw = str(path)
    fix = "give a directory 'dscluster doctor --record DIR' wrote (DIR/<host>/<file>)"
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise DsclusterError(f"--replay {raw}: {exc.strerror or exc}; {fix}") from None
    if stat.S_ISLNK(st.st_mode):
        raise DsclusterError(f"--replay {raw} is a symbolic link; give the directory itself")
    if not stat.S_ISDIR(st.st_mode):
        raise DsclusterError(f"--replay {raw} is not a directory; {fix}")
    hosts = []
    try:
        entries = sorted(os.scandir(path), key=lambda e: _natural(e.name))
    except OSError as exc:
        raise DsclusterError(f"--replay {raw} cannot be read: {exc.strerror or exc}") from None
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            raise DsclusterError(
                f"--replay {raw}: {entry.name} is a symbolic link; host folders must be "
                "directories in DIR itself"
            )
        if not entry.is_dir(follow_symlinks=False):
            continue
        if not HOST.fullmatch(entry.name):
            raise DsclusterError(
                f"--replay {raw}: {entry.name!r} is not a host name; rename or remove it"
            )
        hosts.append(entry.name)
    if not hosts:
        raise DsclusterError(f"--replay {raw} holds no host folders; {fix}")
    return hosts


def _read(path: pathlib.Path, shown: str) -> str | None:
    """A regular file's text (bad bytes replaced, as the probe decodes), None when absent."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "a symbolic link" if path.is_symlink() else (exc.strerror or str(exc))
        raise DsclusterError(f"--replay: {shown} cannot be read ({why})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DsclusterError(f"--replay: {shown} is not a regular file")
        if st.st_size > MAX_FILE:
            raise DsclusterError(
                f"--replay: {shown} is {st.st_size >> 20} MiB, more than a recording holds "
                f"({MAX_FILE >> 20} MiB); record it again with 'dscluster doctor --record DIR'"
            )
        return f.read().decode(errors="replace")


def _json(path: pathlib.Path, shown: str) -> dict[str, Any] | None:
    text = _read(path, shown)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DsclusterError(
            f"--replay: {shown} is not JSON ({exc}); record again with "
            "'dscluster doctor --record DIR' or remove it"
        ) from None
    if not isinstance(value, dict):
        raise DsclusterError(f"--replay: {shown} is not a JSON object; record it again")
    return value


def _expect(data: Mapping[str, Any] | None, files: Mapping[str, str], shown: str) -> Expect:
    if data is None:  # made by hand: the kind the files show
        kind = (
            "nvidia"
            if "nvidia-smi-q.xml" in files
            else "gaudi"
            if "hl-smi-q.txt" in files
            else "cpu"
        )
        return Expect(accelerator=kind)
    fields = {f.name: f.type for f in dataclasses.fields(Expect)}
    kw: dict[str, Any] = {}
    for key, value in data.items():
        ok = (
            key in fields
            and (value is None or not isinstance(value, bool))
            and (
                (key in ("accelerator", "instance_type") and isinstance(value, str))
                or (key in ("devices", "efa") and (value is None or isinstance(value, int)))
            )
        )
        if not ok:
            raise DsclusterError(
                f"--replay: {shown} has {key}={value!r}; give accelerator (nvidia, gaudi, "
                "cpu), devices and efa (whole numbers or null), instance_type"
            )
        kw[key] = value
    if kw.get("accelerator", "cpu") not in ("nvidia", "gaudi", "cpu"):
        raise DsclusterError(
            f"--replay: {shown} has accelerator={kw['accelerator']!r}; give nvidia, gaudi or cpu"
        )
    return Expect(**kw)


def read_record(path: pathlib.Path) -> dict[str, Recording]:
    """Every host folder of DIR, read and checked; a bad DIR is one line naming it and the fix."""
    out = {}
    for host in _host_dirs(path):
        folder = path / host
        files = {}
        for name in FILES:
            text = _read(folder / name, f"{path}/{host}/{name}")
            if text is not None:
                files[name] = text
        raw_index = _json(folder / PROBE_INDEX, f"{path}/{host}/{PROBE_INDEX}") or {}
        index = {n: e for n, e in raw_index.items() if n in FILES and isinstance(e, dict)}
        missing = {n: str(e["missing"]) for n, e in index.items() if e.get("missing")}
        shown = f"{path}/{host}/{EXPECT}"
        expect = _expect(_json(folder / EXPECT, shown), files, shown)
        out[host] = Recording(NodeOutputs(host, files, missing), index, expect)
    return out


def replay(path: pathlib.Path) -> DoctorReport:
    """The health checks judged on DIR, contacting nothing."""
    recs = read_record(path)
    hosts = list(recs)
    report = DoctorReport(
        hosts=hosts,
        head=hosts[0],
        cells={c: {} for c in HEALTH_CHECKS},
        checks=list(HEALTH_CHECKS),
        title=f"doctor --replay {path}: {len(hosts)} nodes",
    )
    judge_health(report, recs)
    return report

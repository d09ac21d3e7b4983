"""Checks between nodes: SSH as the training user, pdsh (and memlock through it), name
resolution, the rendezvous and ephemeral ports, clock offset.
"""

from __future__ import annotations

from .findings import attribute, stdout_json, step_error
from .node import RDMA_PROFILES
from .report import Thresholds


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


def judge_ssh(report, live, findings, user) -> None:
    pairs: dict[tuple[str, str], str] = {}
    for src in live:
        data = stdout_json(findings[src], "ssh")
        if data is None:
            report.cell("ssh", src).add("fail", step_error(findings[src], "ssh"))
            continue
        for dst, res in (data.get("results") or {}).items():
            if dst in live and not res.get("ok"):
                pairs[(src, dst)] = str(res.get("error", "failed"))
    bad_targets, bad_sources, rest = attribute(pairs, live, live)
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


def judge_pdsh_memlock(report, live, head, findings, *, recorded, t: Thresholds) -> None:
    if head not in live:
        for host in live:
            report.cell("pdsh", host).add("skip", "the head is not reachable")
            report.cell("memlock", host).add("skip", "the head is not reachable")
        return
    data = stdout_json(findings[head], "pdsh")
    if data is None or not data.get("installed", True):
        why = (data or {}).get("error") or step_error(findings[head], "pdsh")
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


def judge_resolve(report, live, node) -> None:
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


def judge_ports(report, live, head, findings, master_port) -> None:  # noqa: C901, PLR0912 - one branch per port-probe outcome, in the order they are reported
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
            data = stdout_json(findings[src], "connect")
            if data is None:
                report.cell(check, src).add("fail", step_error(findings[src], "connect"))
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
        bad_targets, bad_sources, rest = attribute(pairs, live, targets)
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


def judge_clock(report, live, head, findings, t: Thresholds) -> None:
    base = head if head in live else (live[0] if live else "")
    data = stdout_json(findings[base], "ssh") if base else None
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

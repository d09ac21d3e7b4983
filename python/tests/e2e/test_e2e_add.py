"""`dscluster provision --add` on the session's e2e cluster (in `make test`, a second cluster of
its own: second_cluster), for real: the last worker is taken
out (local up --nodes N-1, the others' cluster files rewritten with --tags cluster_files),
then grown back (local up --nodes N starts only it, provision --add converges it and touches
only the cluster-wide files of the others), then replaced (its container removed and made
again under the same name, a new host key: the others' known_hosts entry replaced, not
added). A smoke job across every node after each. Disruptive: runs after the other modules,
and leaves the cluster whole and provisioned for the disruptive ones after it.
Needs a Docker engine and a provisioned cluster (test_e2e provisions it)."""

from __future__ import annotations

import json
import pathlib
import re
import time

import pytest

from .e2e_cluster import NAME, NODES, docker, dsc

pytestmark = [
    pytest.mark.docker,
    pytest.mark.disruptive,
    # make test runs it on a second cluster of its own, in the molecule lane (e2e-second)
    pytest.mark.second_cluster,
    pytest.mark.usefixtures("provisioned"),  # that session has no test_e2e: provision first
]

WORKER = f"{NAME}-n{NODES}"
OLD = [f"{NAME}-n{i}" for i in range(1, NODES)]
MARKER = "/tmp/dscluster-add-marker"
# What provision --add may write on a node that was there before: the cluster-wide files.
# authorized_keys: the cluster key's from= lists every node's address.
CLUSTER_FILES = {"/etc/hosts", "/etc/ssh/ssh_known_hosts", "/home/ds/.ssh/authorized_keys"}
# Not part of a node's configuration: logs, caches, runtime and temporary files.
PRUNE = (
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/tmp",
    "/var/tmp",
    "/var/log",
    "/var/cache",
    "/root/.ansible",
    # Slurm's daemons' own state (StateSaveLocation, SlurmdSpoolDir): slurmctld saves it
    # whenever a node's state changes (the worker taken out and back), provision or not
    "/var/lib/slurm",
    # systemd's timers and their work, on a calendar of their own: a persistent timer's stamp
    # (e2scrub_all fires Sundays 03:10, dpkg-db-backup at midnight and fills /var/backups)
    "/var/lib/systemd/timers",
    "/var/backups",
)


def sh(host: str, script: str) -> str:
    return docker("exec", f"dsc-{host}", "sh", "-c", script)


def mark(hosts: list[str]) -> None:
    for host in hosts:
        sh(host, f"touch {MARKER}")
    time.sleep(1.1)  # a file written after the marker is newer at the filesystem's resolution


def written_since_mark(host: str) -> set[str]:
    prune = " -o ".join(f"-path {p}" for p in PRUNE)
    out = sh(host, f"find / -xdev \\( {prune} \\) -prune -o -newer {MARKER} -type f -print")
    return set(out.split())


def local_up(cluster: pathlib.Path, nodes: int) -> None:
    """local up --nodes, writing the session's inventory (its home, not the working dir)."""
    home = cluster.parent.parent
    proc = dsc("--home", str(home), "local", "up", "--name", NAME, "--nodes", str(nodes))
    assert proc.returncode == 0, proc.stderr
    assert (cluster / "hosts.yml").read_text().count(f"{NAME}-n") == nodes


def started_at(host: str) -> str:
    return docker("inspect", "-f", "{{.State.StartedAt}}", f"dsc-{host}").strip()


def host_key(host: str) -> str:
    return " ".join(sh(host, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()[:2])


def address(cluster: pathlib.Path, host: str) -> str:
    hosts = (cluster / "hosts.yml").read_text()
    found = re.search(rf"{re.escape(host)}:\s*\n\s*ansible_host: (\S+)", hosts)
    assert found, hosts
    return found.group(1)


def known_lines(host: str, of: str) -> list[str]:
    text = sh(host, "cat /etc/ssh/ssh_known_hosts")
    return [ln for ln in text.splitlines() if ln.split(" ")[0].split(",")[0] == of]


def hosts_block(host: str) -> str:
    text = sh(host, "cat /etc/hosts")
    return text.split("# BEGIN dscluster managed hosts")[1].split("# END")[0]


def add(cluster: pathlib.Path) -> tuple[str, float]:
    started = time.monotonic()
    proc = dsc("provision", "-i", str(cluster), "--add", WORKER, timeout=1800)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    print(f"provision --add {WORKER}: {took:.0f} s")
    return proc.stdout, took


def changes(stdout: str, title: str) -> dict[str, int]:
    """host -> changed, from the summary table printed after the run named `title`."""
    table = stdout.split(title, 1)[1].split("└", 1)[0]
    rows = [r.split("│") for r in table.splitlines() if r.count("│") == 7]
    return {r[1].strip(): int(r[3]) for r in rows}


def smoke_across_every_node(cluster: pathlib.Path) -> None:
    proc = dsc("smoke", "-i", str(cluster), "--steps", "5", "--no-doctor", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((cluster / "reports" / "smoke-latest.json").read_text())
    assert report["ok"] is True and report["world_size"] == NODES
    assert (cluster / "hostfile").read_text().count("slots=") == NODES


def assert_known_everywhere(cluster: pathlib.Path) -> None:
    key, ip = host_key(WORKER), address(cluster, WORKER)
    for host in OLD:
        lines = known_lines(host, WORKER)
        assert len(lines) == 1 and lines[0].endswith(" " + key), (host, lines, key)
        assert re.search(rf"(?m)^{re.escape(ip)} {re.escape(WORKER)}\b", hosts_block(host)), host
        # the cluster key is let in from the new node's address (from=), or its logins fail
        allowed = sh(host, 'grep -o \'^from="[^"]*"\' /home/ds/.ssh/authorized_keys')
        assert ip in allowed.strip().removeprefix('from="').rstrip('"').split(","), (host, allowed)


def test_grow_by_a_node_touches_only_the_cluster_files_of_the_others(cluster: pathlib.Path):
    # Take the last worker out: the others forget it with the cluster_files tag alone.
    local_up(cluster, NODES - 1)
    shrink = dsc("provision", "-i", str(cluster), "--tags", "cluster_files", timeout=900)
    assert shrink.returncode == 0, shrink.stdout[-3000:] + shrink.stderr[-3000:]
    for host in OLD:
        assert known_lines(host, WORKER) == [] and WORKER not in hosts_block(host), host
    # Grow it back: local up starts only the new node.
    before = {h: started_at(h) for h in OLD}
    local_up(cluster, NODES)
    assert {h: started_at(h) for h in OLD} == before
    mark(OLD)  # after local up, which rewrites root's authorized_keys on every node
    stdout, _ = add(cluster)
    assert_known_everywhere(cluster)
    for host in OLD:
        assert written_since_mark(host) <= CLUSTER_FILES, host
    # the old nodes changed in the cluster_files run only (the new node's run leaves them be)
    full = changes(stdout, f"site.yml --limit {WORKER} on")
    assert all(full.get(h, 0) == 0 for h in OLD), full
    assert full[WORKER] > 0
    assert not (cluster / "degraded.json").exists()
    smoke_across_every_node(cluster)


def test_replace_a_dead_worker_replaces_its_host_key(cluster: pathlib.Path):
    old_key = host_key(WORKER)
    docker("rm", "-f", f"dsc-{WORKER}")
    local_up(cluster, NODES)
    assert host_key(WORKER) != old_key  # a new container, a new host key
    mark(OLD)
    add(cluster)
    assert_known_everywhere(cluster)  # one line for the worker, with the new key
    for host in OLD:
        assert old_key not in sh(host, "cat /etc/ssh/ssh_known_hosts"), host
        assert written_since_mark(host) <= CLUSTER_FILES, host
    smoke_across_every_node(cluster)

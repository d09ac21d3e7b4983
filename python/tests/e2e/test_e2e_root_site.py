"""The collection's root as a plain Ansible project: `ansible-playbook site.yml -i
inventories/<name>/hosts.yml` from the clone's root, with no dscluster in between, converges
the provisioned e2e cluster again and changes nothing; the molecule cluster scenario's
verify playbook passes on the same cluster (make test runs it here instead of converging a
cluster of its own: `make molecule-cluster` still runs the whole scenario)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from .. import rolefiles
from .faults import sh

pytestmark = pytest.mark.docker

REPO = rolefiles.REPO
RECAP = re.compile(
    r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
)

TASK = re.compile(r"^TASK \[(.*)\] \**$")
CHANGED = re.compile(r"^changed: \[([^\]]+)\]")


def changed_tasks(stdout: str) -> list[str]:
    """'task: host' for every change the playbook's output shows (for the failure message:
    the recap only counts them, and the task profile after it names none)."""
    found, task = [], ""
    for line in stdout.splitlines():
        if m := TASK.match(line):
            task = m.group(1)
        elif m := CHANGED.match(line):
            found.append(f"{task}: {m.group(1)}")
    return found


def task_hosts(stdout: str, task: str, status: str) -> list[str]:
    """The hosts the playbook's output shows as `status` ("ok", "skipping", ...) for `task`."""
    found, current = [], ""
    for line in stdout.splitlines():
        if m := TASK.match(line):
            current = m.group(1)
        elif current == task and (m := re.match(rf"^{status}: \[([^\]]+)\]", line)):
            found.append(m.group(1))
    return sorted(found)


LOGINS = "cluster_ssh : Log in from this node to every node as the training user"
PDSH_CHECK = "pdsh : Run hostname on every host with pdsh from the head"


def ansible_playbook(
    playbook: str, cluster: pathlib.Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """`ansible-playbook PLAYBOOK -i <cluster>/hosts.yml [ARGS]` from the clone's root, the
    environment without ANSIBLE_* (the root's ansible.cfg applies, as for a user there)."""
    bin_dir = pathlib.Path(sys.executable).parent
    program = shutil.which("ansible-playbook", path=str(bin_dir)) or "ansible-playbook"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        [program, playbook, "-i", str(cluster / "hosts.yml"), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip


def test_ansible_playbook_site_yml_from_the_root(cluster: pathlib.Path):
    proc = ansible_playbook("site.yml", cluster)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recap = {m[0]: [int(x) for x in m[1:]] for m in RECAP.findall(proc.stdout)}
    assert sorted(recap) == sorted(f"{cluster.name}-n{i}" for i in (1, 2, 3)), proc.stdout[-2000:]
    for host, (ok, changed, unreachable, failed) in recap.items():
        assert ok > 0 and unreachable == 0 and failed == 0, (host, proc.stdout[-3000:])
        assert changed == 0, (host, changed_tasks(proc.stdout))
    # The SSH mesh these keys, hosts and known_hosts make was proved by the provision before
    # (recorded on the controller): no node logs in to every node again.
    assert task_hosts(proc.stdout, LOGINS, "skipping") == sorted(recap), proc.stdout[-4000:]
    # Nor does the head run pdsh across the cluster again (its last passing check is recorded).
    head = f"{cluster.name}-n1"
    assert task_hosts(proc.stdout, PDSH_CHECK, "skipping") == [head], proc.stdout[-4000:]


def test_the_cluster_scenarios_verify_passes_on_the_e2e_cluster(cluster: pathlib.Path):
    """extensions/molecule/cluster/verify.yml (SSH between every pair with pinned keys,
    distinct host keys, one stack and wheel set everywhere matching the lock, the wheelhouse on
    shared storage once, pdsh from the head, cpu_adam loads without JIT, facts on the
    controller)."""
    proc = ansible_playbook("extensions/molecule/cluster/verify.yml", cluster)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    recap = {m[0]: [int(x) for x in m[1:]] for m in RECAP.findall(proc.stdout)}
    assert sorted(recap) == sorted(f"{cluster.name}-n{i}" for i in (1, 2, 3)), proc.stdout[-2000:]
    for host, (ok, changed, unreachable, failed) in recap.items():
        # every check ran on every node (13 tasks, 3 of them once, on the head) and none failed
        assert ok >= 10 and unreachable == 0 and failed == 0, (host, proc.stdout[-3000:])
        assert changed == 0, (host, changed_tasks(proc.stdout))


# What each tampering on the second node undoes: the task that must write it again (every
# other write finds its file as it would leave it and reports no change).
TAMPERED = {
    "nccl_env : Write the profile script, nccl.conf and the profile's fact": (
        "echo NCCL_SOCKET_IFNAME=ib9 >> /etc/nccl.conf"
    ),
    "base : List every cluster host in /etc/hosts": (
        # a bind mount in containers: rewritten in place, the managed block left out
        'cp /etc/hosts /root/hosts.t && sed "/# BEGIN dscluster/,/# END dscluster/d" '
        "/root/hosts.t > /etc/hosts && chmod 600 /etc/hosts"
    ),
    "base : Remove the loopback alias of this host from /etc/hosts": (
        'echo "127.0.1.1 $(hostname)" >> /etc/hosts'
    ),
    "base : Create the training user": "usermod --shell /bin/sh ds",
    # writable by others: sshd's StrictModes refuses every key in it, and authorized_key
    # leaves a file that already holds the key as it is (before: "Permission denied" at the
    # login check). The module run closes it (a file task there would follow a link).
    "cluster_ssh : Write the cluster known_hosts and key pair, and authorise the key": (
        "chmod 666 /home/ds/.ssh/authorized_keys"
    ),
    "node_facts : Install the accelerators fact": (
        "echo '# edited' >> /etc/ansible/facts.d/accelerators.fact"
    ),
    "pdsh : Make ssh pdsh's default remote command": "rm /etc/pdsh/rcmd_default",
    "ml_stack : Record the versions manifest as a local fact": (
        'sed -i \'s|"venv": "/opt/dscluster/venv"|"venv": "/opt/other"|\' '
        "/etc/ansible/facts.d/ml_stack.fact"
    ),
}


def test_a_tampered_node_is_written_again_and_only_there(cluster: pathlib.Path):
    """The roles' idempotent writes (base, node_facts, cluster_ssh, nccl_env, ml_stack; the
    base play's tag takes in node_facts and cluster_ssh) write again what was changed by hand
    on one node, and nothing on the others."""
    host = f"{cluster.name}-n2"
    for script in TAMPERED.values():
        sh(f"dsc-{host}", script)
    proc = ansible_playbook("site.yml", cluster, "--tags", "base,nccl_env,ml_stack")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert sorted(changed_tasks(proc.stdout)) == sorted(f"{t}: {host}" for t in TAMPERED)
    # Only the node whose SSH files were written again logs in to every node again.
    assert task_hosts(proc.stdout, LOGINS, "ok") == [host], proc.stdout[-4000:]
    # pdsh was configured again on one node: the head runs the pdsh check across the cluster.
    assert task_hosts(proc.stdout, PDSH_CHECK, "ok") == [f"{cluster.name}-n1"], proc.stdout[-4000:]
    after = sh(
        f"dsc-{host}",
        "stat -c %a /etc/hosts; grep -c '^127.0.1.1' /etc/hosts || true; "
        "grep -c NCCL_SOCKET_IFNAME=ib9 /etc/nccl.conf || true; getent passwd ds | cut -d: -f7; "
        "grep -c '^# edited' /etc/ansible/facts.d/accelerators.fact || true; "
        'grep -o \'"venv": "[^"]*"\' /etc/ansible/facts.d/ml_stack.fact; '
        "stat -c %a /home/ds/.ssh/authorized_keys; cat /etc/pdsh/rcmd_default",
    ).split("\n")
    assert after[:8] == [
        "644",
        "0",
        "0",
        "/bin/bash",
        "0",
        '"venv": "/opt/dscluster/venv"',
        "600",
        "ssh",
    ], after
    block = sh(f"dsc-{host}", "sed -n '/# BEGIN dscluster/,/# END dscluster/p' /etc/hosts")
    assert [line.split()[1] for line in block.splitlines()[1:-1]] == [
        f"{cluster.name}-n{i}" for i in (1, 2, 3)
    ], block

"""Real faults injected into the local cluster's node containers, each with its undo.

Every injector changes the node the way the fault happens in the field (a file edited, a
package gone, a firewall rule, a remount, a different wheel installed with pip) and returns a
callable that puts it back. Firewall rules go into the node's own network namespace from the
host (nsenter), so the nodes need no extra capabilities.
"""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Callable

from .e2e_cluster import docker

Undo = Callable[[], None]


def sh(container: str, script: str, timeout: int = 300) -> str:
    return docker("exec", container, "bash", "-ec", script, timeout=timeout)


def nsenter(container: str, *argv: str) -> None:
    pid = docker("inspect", "-f", "{{.State.Pid}}", container).strip()
    subprocess.run(["nsenter", "-t", pid, "-n", *argv], check=True, timeout=60)


def remove_known_host(container: str, host: str) -> Undo:
    """The cluster's pinned known_hosts loses one node's key (as after a hand edit)."""
    sh(
        container,
        "cp -p /etc/ssh/ssh_known_hosts /root/known_hosts.bak && "
        f"ssh-keygen -R {host} -f /etc/ssh/ssh_known_hosts >/dev/null 2>&1 && "
        f"! ssh-keygen -F {host} -f /etc/ssh/ssh_known_hosts >/dev/null",
    )
    return lambda: sh(container, "cp -p /root/known_hosts.bak /etc/ssh/ssh_known_hosts")


OTHER_DEEPSPEED = r"""
import base64, hashlib, pathlib, re, sys, zipfile
# The node's wheelhouse: on shared storage (the local cluster's volume), else its own copy.
src = next(w for d in ('/shared/dscluster/wheelhouse', '/opt/dscluster/wheelhouse')
           for w in pathlib.Path(d).glob('deepspeed-*.whl'))
old = src.name.split('-')[1]
new = sys.argv[1]
dst = pathlib.Path('/tmp') / src.name.replace(f'-{old}-', f'-{new}-')
records = []
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, 'w', zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        name = item.filename.replace(f'deepspeed-{old}.dist-info', f'deepspeed-{new}.dist-info')
        if name.endswith('.dist-info/RECORD'):
            record = name
            continue
        data = zin.read(item)
        if name.endswith('METADATA') or name == 'deepspeed/git_version_info_installed.py':
            data = data.replace(old.encode(), new.encode())
        zout.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
        records.append(f'{name},sha256={digest},{len(data)}')
    zout.writestr(record, '\n'.join(records + [f'{record},,']) + '\n')
print(dst)
"""


def install_other_deepspeed(container: str, version: str = "0.19.7") -> str:
    """pip-installs into the node's venv a DeepSpeed wheel whose version says `version`
    (the locked wheel, re-versioned): a hand-changed ml_stack on one node."""
    wheel = sh(
        container, f"/opt/dscluster/venv/bin/python - {version} <<'EOF'\n{OTHER_DEEPSPEED}\nEOF"
    ).strip()
    sh(
        container,
        "/opt/dscluster/venv/bin/pip install --quiet --disable-pip-version-check --no-deps "
        f"--no-index --no-compile --force-reinstall {wheel}",
    )
    return sh(
        container,
        "/opt/dscluster/venv/bin/python -c 'import importlib.metadata as m; "
        'print(m.version("deepspeed"))\'',
    ).strip()


def shrink_shm(container: str, size: str = "64m") -> Undo:
    before = sh(container, "findmnt -no OPTIONS /dev/shm | tr , '\\n' | grep '^size=' || true")
    sh(container, f"mount -o remount,size={size} /dev/shm")
    restore = before.strip() or "size=1g"
    return lambda: sh(container, f"mount -o remount,{restore} /dev/shm")


def block_tcp(container: str, ports: str) -> Undo:
    """New inbound TCP connections to `ports` (N or N:M) dropped inside the node."""
    rule = ["-p", "tcp", "--dport", ports, "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"]
    nsenter(container, "iptables", "-w", "-I", "INPUT", *rule)
    return lambda: nsenter(container, "iptables", "-w", "-D", "INPUT", *rule)


def ephemeral_range(container: str) -> str:
    low, high = sh(container, "cat /proc/sys/net/ipv4/ip_local_port_range").split()
    return f"{low}:{high}"


def wrong_nccl_ifname(container: str, spec: str = "ib9") -> Undo:
    sh(
        container,
        "cp -p /etc/nccl.conf /root/nccl.conf.bak && "
        f"echo NCCL_SOCKET_IFNAME={spec} >> /etc/nccl.conf",
    )
    return lambda: sh(container, "cp -p /root/nccl.conf.bak /etc/nccl.conf")


def lower_memlock(container: str, user: str = "ds", kib: int = 16) -> Undo:
    path = "/etc/security/limits.d/99-dscluster-test.conf"
    sh(container, f"printf '{user} soft memlock {kib}\\n{user} hard memlock {kib}\\n' > {path}")
    return lambda: sh(container, f"rm -f {path}")


def stale_hosts_entry(container: str, host: str, address: str = "10.255.255.1") -> Undo:
    """A stale /etc/hosts line sending `host` to an address nothing answers on."""
    # first in the file, so it wins over the managed block; /etc/hosts is a bind mount:
    # written in place, never replaced
    sh(
        container,
        f"cp /etc/hosts /root/hosts.bak && {{ echo '{address} {host}'; cat /root/hosts.bak; }} "
        "> /etc/hosts",
    )
    return lambda: sh(container, "cat /root/hosts.bak > /etc/hosts")


def remove_pdsh(container: str) -> Undo:
    sh(container, "mv /usr/bin/pdsh /usr/bin/pdsh.dscluster-test")
    return lambda: sh(container, "mv /usr/bin/pdsh.dscluster-test /usr/bin/pdsh")


def hide_libaio(container: str) -> Undo:
    """libaio's shared library gone (as after `apt-get remove --force-depends libaio1`)."""
    sh(
        container,
        "mkdir -p /root/libaio.off && mv /usr/lib/x86_64-linux-gnu/libaio.so.1* /root/libaio.off/ "
        "&& ldconfig",
    )
    return lambda: sh(container, "mv /root/libaio.off/* /usr/lib/x86_64-linux-gnu/ && ldconfig")


def edit_hostfile(inventory: pathlib.Path, host: str, slots: int) -> Undo:
    path = inventory / "hostfile"
    before = path.read_text()
    lines = [
        f"{host} slots={slots}" if line.split()[:1] == [host] else line
        for line in before.splitlines()
    ]
    path.write_text("\n".join(lines) + "\n")
    return lambda: path.write_text(before)

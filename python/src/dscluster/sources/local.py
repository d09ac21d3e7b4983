"""A local cluster of systemd node containers on one Docker network.

`start` (this source in sources.describe) is idempotent: it creates what is missing, starts
what is stopped, and describes the cluster; `cluster.write` rewrites the inventory. Trust is
bootstrapped over `docker exec`, a channel that is already trusted: the controller's
bootstrap key goes in that way, and each node's own host key comes out that way into the
cluster's known_hosts. Nothing is scanned blindly and host key checking stays on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
import time

from rich.console import Console

from .. import paths
from ..errors import DsclusterError
from ..paths import state_dir
from ..util import atomic_write, run
from .cluster import Cluster
from .cluster import Node as ClusterNode
from .names import check_cluster_name

LABEL = "dscluster.cluster"
SHARED_PATH = "/shared"
# One Docker volume every local node of every cluster mounts: the base role's apt run takes the
# .debs from it and adds what it downloads (roles/base/files/apt_deb_cache.py), so a new
# cluster or an added node downloads nothing another node already has. Not a cluster's: `down`
# keeps it; `docker volume rm dscluster-debs` empties it.
DEB_CACHE_VOLUME = "dscluster-debs"
DEB_CACHE_PATH = "/var/cache/dscluster/debs"
# The node image's base unless `local up --base` / `image --base` names another.
DEFAULT_BASE = "debian:bookworm"
# Inventory vars by the nodes' OS (ID-VERSION_ID of /etc/os-release). Debian 13's python3 is
# 3.13, and the torch whose hash lock ships for 3.13 is PyPI's own build (ml_stack's
# files/locks): the cpu build's index is not one these test machines reach, so it has none.
OS_VARS: dict[str, dict[str, str]] = {"debian-13": {"ml_stack_torch_variant": "pypi"}}
# Seconds ssh waits for a local node container to answer (the inventory's ansible_ssh_timeout).
LOCAL_SSH_TIMEOUT = 10
RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN",
    "--security-opt", "seccomp=unconfined",
    "--security-opt", "apparmor=unconfined",
    "--cgroupns=host",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--tmpfs", "/run",
    "--tmpfs", "/run/lock",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Node:
    name: str  # inventory host name == container hostname
    container: str
    address: str
    host_key: str


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    return run(["docker", *args], check=check, timeout=timeout).stdout.strip()


def ensure_engine() -> None:
    if shutil.which("docker") is None:
        raise DsclusterError("docker is not installed; run 'make engine' (installs docker.io)")
    if run(["docker", "info"], check=False, timeout=30).returncode != 0:
        raise DsclusterError(
            "no Docker engine answers; run 'make engine' (starts dockerd) or start Docker"
        )


def node_image(base: str = DEFAULT_BASE, console: Console | None = None) -> str:
    """The node image tag for the current docker/node sources; built when missing."""
    docker_dir = paths.docker_dir()
    src = docker_dir / "node"
    digest = hashlib.sha256(base.encode())
    for path in sorted(src.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes())
    tag = f"dscluster/node:{digest.hexdigest()[:12]}"
    if run(["docker", "image", "inspect", tag], check=False).returncode == 0:
        return tag
    if console:
        console.print(f"building node image {tag}")
    run(["bash", str(docker_dir / "base-image.sh"), base], timeout=900)
    run(
        ["docker", "build", "-q", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(src)],
        timeout=1800,
    )
    return tag


def _containers(cluster: str) -> list[str]:
    out = docker("ps", "-a", "--filter", f"label={LABEL}={cluster}", "--format", "{{.Names}}")
    return sorted(n for n in out.splitlines() if n)


def _ensure_keypair(path: pathlib.Path, comment: str) -> str:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)
    return path.with_suffix(".pub").read_text().strip()


def _wait_host_key(container: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = run(
            ["docker", "exec", container, "cat", "/etc/ssh/ssh_host_ed25519_key.pub"], check=False
        )
        if proc.returncode == 0 and proc.stdout.startswith("ssh-ed25519 "):
            return " ".join(proc.stdout.split()[:2])
        time.sleep(1)
    raise DsclusterError(
        f"container {container} made no SSH host key within {timeout:.0f} s; "
        f"see 'docker exec {container} systemctl status ssh-hostkeys ssh'"
    )


def _install_bootstrap_key(container: str, pubkey: str) -> None:
    script = (
        "install -d -m 0700 /root/.ssh && touch /root/.ssh/authorized_keys && "
        "chmod 0600 /root/.ssh/authorized_keys && "
        'grep -qxF "$1" /root/.ssh/authorized_keys || echo "$1" >> /root/.ssh/authorized_keys'
    )
    docker("exec", container, "sh", "-c", script, "sh", pubkey)


def _wait_ssh(
    node: Node, key: pathlib.Path, known_hosts: pathlib.Path, timeout: float = 90
) -> None:
    argv = [
        "ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}", "-o", "ConnectTimeout=5",
        f"root@{node.address}", "true",
    ]  # fmt: skip
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc = run(argv, check=False, timeout=30)
        if proc.returncode == 0:
            return
        last = (proc.stderr.strip().splitlines() or [""])[-1]
        time.sleep(1)
    raise DsclusterError(f"cannot ssh to {node.name} ({node.address}): {last}")


def inventory_dir(name: str) -> pathlib.Path:
    return paths.inventory_dir(name)


def _check_up(name: str, nodes: int, cpu_slots: int) -> None:
    check_cluster_name(name)
    if nodes < 1 or nodes > 64:
        raise DsclusterError(f"--nodes {nodes} is out of range; use 1 to 64")
    if cpu_slots < 1:
        raise DsclusterError(f"--slots {cpu_slots} is out of range; use 1 or more")


def _remembered(sdir: pathlib.Path, what: str) -> str | None:
    """What _remember kept in the cluster's state directory, or None."""
    path = sdir / what
    return (path.read_text().strip() or None) if path.is_file() else None


def _image_for(name: str, given: str | None, base_image: str | None, console: Console) -> str:
    """The image the cluster's nodes run: --image, else the one an earlier `up --image`
    remembered, else the node image (built when missing) on --base, else on the base an
    earlier `up --base` remembered, else on Debian 12."""
    sdir = state_dir(name)
    image = given or (None if base_image else _remembered(sdir, "image"))
    if image is None:
        base = base_image or _remembered(sdir, "base") or DEFAULT_BASE
        return node_image(base, console)
    if run(["docker", "image", "inspect", image], check=False).returncode != 0:
        raise DsclusterError(
            f"no Docker image {image} here"
            + (f" (remembered in {sdir / 'image'})" if given is None else "")
            + "; bake one with 'dscluster image bake -i inventories/<cluster>', or start "
            f"from the plain node image: dscluster local down --name {name}, then local up "
            "without --image"
        )
    return image


def _remember(sdir: pathlib.Path, image: str | None, base_image: str | None) -> None:
    """What _image_for reads on a later `up`: the last --image or --base given ('' image: the
    node image on the remembered base)."""
    if image is None and base_image is None:
        return
    sdir.mkdir(parents=True, exist_ok=True)
    atomic_write(sdir / "image", (image or "") + "\n")
    if base_image is not None:
        atomic_write(sdir / "base", base_image + "\n")


def start(
    name: str,
    nodes: int,
    *,
    cpu_slots: int = 1,
    shm_size: str = "1g",
    base_image: str | None = None,
    image: str | None = None,
    console: Console | None = None,
) -> Cluster:
    """This source in the route (sources.describe): create or reconcile the node containers,
    then describe them as a Cluster for inventories/<name> (not written here). `image`: start
    the nodes from it (a baked image) instead of the node image; `base_image`: build the node
    image on that base (debian:trixie) instead of Debian 12. Each is remembered in the
    cluster's state directory (the last one given wins), so a later `up` without it (e.g. one
    more node) uses it again."""
    _check_up(name, nodes, cpu_slots)
    console = console or Console(stderr=True)
    ensure_engine()
    given = image
    image = _image_for(name, given, base_image, console)
    network, volume = f"dsc-{name}", f"dsc-{name}-shared"
    if run(["docker", "network", "inspect", network], check=False).returncode != 0:
        docker("network", "create", "--label", f"{LABEL}={name}", network)
    if run(["docker", "volume", "inspect", volume], check=False).returncode != 0:
        docker("volume", "create", "--label", f"{LABEL}={name}", volume)
    if run(["docker", "volume", "inspect", DEB_CACHE_VOLUME], check=False).returncode != 0:
        docker("volume", "create", "--label", "dscluster.cache=debs", DEB_CACHE_VOLUME)

    wanted = [f"dsc-{name}-n{i}" for i in range(1, nodes + 1)]
    for extra in sorted(set(_containers(name)) - set(wanted)):
        console.print(f"removing {extra} (cluster now has {nodes} nodes)")
        docker("rm", "-f", extra)
    for container in wanted:
        host = container.removeprefix("dsc-")
        state = run(
            ["docker", "inspect", "-f", "{{.State.Running}} {{.Config.Image}}", container],
            check=False,
        )
        if state.returncode == 0 and state.stdout.split()[1] != image:
            console.print(f"{container} runs {state.stdout.split()[1]}, not {image}; recreating it")
            docker("rm", "-f", container)
            state = run(["docker", "inspect", container], check=False)
        if state.returncode != 0:
            console.print(f"starting {container}")
            docker(
                "run", "-d", "--name", container, "--hostname", host,
                "--label", f"{LABEL}={name}", "--network", network, "--network-alias", host,
                "--shm-size", shm_size, "-v", f"{volume}:{SHARED_PATH}",
                "-v", f"{DEB_CACHE_VOLUME}:{DEB_CACHE_PATH}", *RUN_FLAGS, image,
            )  # fmt: skip
        elif state.stdout.split()[0] != "true":
            console.print(f"starting stopped {container}")
            docker("start", container)

    sdir = state_dir(name)
    _remember(sdir, given, base_image)
    key = sdir / "bootstrap_ed25519"
    pub = _ensure_keypair(key, f"dscluster-bootstrap-{name}")
    result: list[Node] = []
    for container in wanted:
        info = json.loads(docker("inspect", container))[0]
        address = info["NetworkSettings"]["Networks"][network]["IPAddress"]
        _install_bootstrap_key(container, pub)
        host_key = _wait_host_key(container)
        result.append(Node(container.removeprefix("dsc-"), container, address, host_key))
    known_hosts = sdir / "known_hosts"
    atomic_write(
        known_hosts, "".join(f"{n.name},{n.address} {n.host_key}\n" for n in result), mode=0o600
    )
    for node in result:
        _wait_ssh(node, key, known_hosts)
    os_id = docker("exec", wanted[0], "sh", "-c", '. /etc/os-release && echo "$ID-$VERSION_ID"')
    cluster = describe(
        name, nodes=result, key=key, known_hosts=known_hosts, cpu_slots=cpu_slots, sdir=sdir,
        os_vars=OS_VARS.get(os_id.strip(), {}),
    )  # fmt: skip
    return dataclasses.replace(cluster, out=inventory_dir(name))


def describe(
    name: str,
    *,
    nodes: list[Node],
    key: pathlib.Path,
    known_hosts: pathlib.Path,
    cpu_slots: int,
    sdir: pathlib.Path,
    os_vars: dict[str, str] | None = None,
) -> Cluster:
    """The local cluster as its inventory describes it (no hostfile: provision writes it
    from the slots the nodes report); os_vars: what the nodes' OS needs (OS_VARS)."""
    return Cluster(
        name=name,
        nodes=[ClusterNode(n.name, cpu_slots, {"ansible_host": n.address}) for n in nodes],
        vars={
            "dscluster_cluster_name": name,
            "dscluster_state_dir": str(sdir),
            "dscluster_training_user": "ds",
            "dscluster_shared_dir": SHARED_PATH,
            "dscluster_shared_storage": "external",
            "dscluster_cpu_slots": cpu_slots,
            "base_apt_deb_cache": DEB_CACHE_PATH,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes"
            ),
            # ssh's ConnectTimeout for Ansible (ansible.cfg's 30 s is for real networks): a
            # node container on the local bridge answers within milliseconds, and a stopped
            # one is named unreachable after LOCAL_SSH_TIMEOUT seconds instead of 30.
            "ansible_ssh_timeout": LOCAL_SSH_TIMEOUT,
            **(os_vars or {}),
        },
        header=(
            "---\n"
            f"# Written by `dscluster local up --name {name} --nodes {len(nodes)}`: a local "
            "cluster\n"
            f"# of node containers on Docker network dsc-{name}. Host keys were read from each\n"
            f"# container over `docker exec` into {known_hosts}.\n"
        ),
        hostfile=False,
        known_hosts=known_hosts,
    )


def down(name: str, console: Console | None = None) -> list[str]:
    """Remove the cluster's containers, network, volume, inventory and state; returns what went."""
    check_cluster_name(name)
    console = console or Console(stderr=True)
    ensure_engine()
    removed = []
    for container in _containers(name):
        docker("rm", "-f", "-v", container)
        removed.append(container)
    for kind, obj in (("network", f"dsc-{name}"), ("volume", f"dsc-{name}-shared")):
        if run(["docker", kind, "inspect", obj], check=False).returncode == 0:
            docker(kind, "rm", obj)
            removed.append(obj)
    inv = inventory_dir(name)
    if (inv / "hosts.yml").exists():
        for item in ("hosts.yml", "hostfile", ".deepspeed_env"):
            (inv / item).unlink(missing_ok=True)
        shutil.rmtree(inv / "facts", ignore_errors=True)
        shutil.rmtree(inv / "reports", ignore_errors=True)
        shutil.rmtree(inv / "logs", ignore_errors=True)
        if not any(inv.iterdir()):
            inv.rmdir()
        removed.append(str(inv))
    shutil.rmtree(state_dir(name), ignore_errors=True)
    return removed

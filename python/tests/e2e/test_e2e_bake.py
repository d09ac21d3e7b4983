"""`dscluster image bake` for real: a node of the provisioned session cluster becomes a flat
Docker image with none of its identity or secrets, and nothing its training user made there
(tokens, history, ~/.local, authorized_keys2, bytecode in the ranks' prefix, a job's scratch
files, the job secrets: planted before the bake, found in no path and no byte of the image),
the node itself untouched; a new cluster
starts from it (`local up --image`), its provision finds the stack installed (no wheel
reinstalled), gives each node its own host keys, machine id and the new cluster's key, and a
smoke job passes; `local up --nodes 3` later starts the third node from the same image and
`provision --add` joins it. Needs a Docker engine and the provisioned session cluster."""

from __future__ import annotations

import json
import pathlib
import re
import secrets
import subprocess
import tarfile
import time

import pytest

from .e2e_cluster import NAME, docker, dsc, keep_as_cache

pytestmark = [
    pytest.mark.docker,
    # make test runs it on a second cluster of its own, in the molecule lane (e2e-second)
    pytest.mark.second_cluster,
    pytest.mark.usefixtures("provisioned"),  # that session has no test_e2e: provision first
]

SOURCE = f"{NAME}-n2"
TAG = f"dscluster/baked:{NAME}-test"
BAKED = f"{NAME}-bk"
# What must not survive into the image: a node's host keys, the cluster's keys and files.
SECRETS = (
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_known_hosts",
    "/home/ds/.ssh/id_ed25519",
    "/home/ds/.ssh/authorized_keys",
    "/root/.ssh/authorized_keys",
    # what the training user or provision made (planted by the baked fixture)
    "/home/ds/.ssh/authorized_keys2",
    "/home/ds/.cache/huggingface/token",
    "/home/ds/.netrc",
    "/var/lib/dscluster/secrets.env",
)
# What the training user (any job) and provision leave on the source node, planted before the
# bake with this marker in every file, and taken out of the node again after it.
CANARY = f"DSC-BAKE-CANARY-{secrets.token_hex(8)}"
HOME_PLANTED = (
    ".cache/huggingface/token",
    ".netrc",
    ".bash_history",
    ".local/lib/python3.11/site-packages/usercustomize.py",
    ".ssh/authorized_keys2",
)
SECRETS_ENV = "/var/lib/dscluster/secrets.env"


def sh(container: str, script: str) -> str:
    return docker("exec", container, "sh", "-c", script).strip()


def in_image(script: str) -> str:
    return docker("run", "--rm", "--entrypoint", "/bin/sh", TAG, "-c", script).strip()


def planted(facts: dict) -> list[str]:
    """The absolute paths plant() writes on the source node (all the training user's but the
    job secrets): its home's, a bytecode file in the ranks' prefix, one in the torch
    extensions and one in the node-local scratch directory."""
    versions = facts["versions"]
    return [
        *(f"/home/ds/{rel}" for rel in HOME_PLANTED),
        f"{versions['pycache_dir']}/dsc_bake_canary.cpython-311.pyc",
        f"{versions['torch_extensions_dir']}/dsc_bake_canary.so",
        f"{facts['scratch_dir']}/dsc-bake-canary",
    ]


def plant(node: str, facts: dict) -> bool:
    """What a job leaves, written as ds (each file's one line holds CANARY; a key line in
    authorized_keys2 that is no valid key), and the job secrets as provision writes them, as
    root, where the node has none. True when the secrets file was made here."""
    lines = " ".join(f"'{p}'" for p in planted(facts))
    docker(
        "exec", "-u", "ds", node, "sh", "-c",
        f"set -eu; for f in {lines}; do mkdir -p \"$(dirname \"$f\")\"; "
        f"echo '# ssh-ed25519 AAAA{CANARY.replace('-', '')} {CANARY}' >> \"$f\"; done",
    )  # fmt: skip
    made = sh(node, f"test -e {SECRETS_ENV} && echo there || echo made")
    sh(
        node,
        f"set -eu; mkdir -p {pathlib.PurePosixPath(SECRETS_ENV).parent}; "
        f"[ -e {SECRETS_ENV} ] || install -o ds -g ds -m 0600 /dev/null {SECRETS_ENV}; "
        f"echo 'export DSC_BAKE_CANARY={CANARY}' >> {SECRETS_ENV}",
    )
    return made == "made"


def unplant(node: str, facts: dict, secrets_made: bool) -> None:
    """The source node as it was: CANARY's lines out of each planted file, a file (and a
    directory of the home) left empty removed (the session cluster is used after this module)."""
    lines = " ".join(f"'{p}'" for p in planted(facts))
    out = (
        f'for f in {lines}; do [ -f "$f" ] || continue; sed -i \'/{CANARY}/d\' "$f"; '
        '[ -s "$f" ] || rm -f "$f"; done; cd /home/ds && rmdir -p --ignore-fail-on-non-empty '
        ".cache/huggingface .local/lib/python3.11/site-packages 2>/dev/null; true"
    )
    docker("exec", "-u", "ds", node, "sh", "-c", out)
    if secrets_made:
        sh(node, f"rm -f {SECRETS_ENV}")
    else:
        sh(node, f"sed -i '/{CANARY}/d' {SECRETS_ENV}")
    dirs = sorted({str(pathlib.PurePosixPath(p).parent) for p in planted(facts)} - {"/home/ds"})
    left = sh(
        node, f"grep -rlF -e '{CANARY}' /home/ds {SECRETS_ENV} {' '.join(dirs)} 2>/dev/null; true"
    )
    assert left == "", left


def exported(tag: str) -> tuple[dict[str, str], list[str]]:
    """A container of the image, read as `docker export` streams it: each path (no leading
    "/") and its type, and every path whose name, link target or content holds CANARY."""
    made = docker("create", "--entrypoint", "/bin/true", tag).strip()
    paths: dict[str, str] = {}
    found: list[str] = []
    needle = CANARY.encode()
    try:
        with (
            subprocess.Popen(["docker", "export", made], stdout=subprocess.PIPE) as export,
            tarfile.open(fileobj=export.stdout, mode="r|") as tar,
        ):
            for member in tar:
                name = member.name.removeprefix("./").rstrip("/")
                paths[name] = "dir" if member.isdir() else "file" if member.isfile() else "other"
                if needle in (member.name + member.linkname).encode():
                    found.append(name)
                if not member.isfile():
                    continue
                data, tail = tar.extractfile(member), b""
                while chunk := data.read(1 << 20):
                    if needle in tail + chunk:
                        found.append(name)
                        break
                    tail = chunk[-len(needle) :]
            while export.stdout.read(1 << 20):  # the archive's end blocks: docker export ends
                pass
        assert export.returncode == 0 and paths, export.returncode
    finally:
        docker("rm", "-f", made)
    return paths, found


def refused_when_the_venv_was_changed(cluster: pathlib.Path, facts: dict) -> None:
    """A byte appended to a file of the source node's venv and a stray .pth beside it: the bake
    refuses in one line naming the node and the file, before it makes anything; then the node
    is restored (its file as it was, byte for byte and mtime)."""
    site = f"{facts['versions']['venv']}/lib/python3.11/site-packages"
    changed, stray = f"{site}/deepspeed/__init__.py", f"{site}/zz-dsc-bake-stray.pth"
    node = f"dsc-{SOURCE}"
    docker_ok("image", "rm", "-f", TAG)  # one an interrupted session left
    sh(node, f"cp -p {changed} /root/dsc-bake-orig && printf '#' >> {changed} && "
             f"echo 'import os' > {stray}")  # fmt: skip
    try:
        proc = dsc("image", "bake", "-i", str(cluster), "--node", SOURCE, "--name", TAG)
    finally:
        sh(node, f"cp -p /root/dsc-bake-orig {changed} && rm -f /root/dsc-bake-orig {stray}")
    assert proc.returncode != 0, proc.stdout[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("dscluster: error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert (
        f"{SOURCE}'s stack is not what the controller's wheelhouse holds: {changed} "
        "(changed) (2 differences); nothing was baked" in errors[0]
    ), errors[0]
    assert "committing" not in proc.stderr
    assert docker_ok("image", "inspect", TAG) is False
    assert docker_ok("image", "inspect", f"dscluster/bake-scratch:{NAME}") is False


def docker_ok(*args: str) -> bool:
    return subprocess.run(["docker", *args], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def baked(cluster: pathlib.Path, provisioned):
    """The image, baked from the session cluster's second node; removed after the module."""
    home = cluster.parent.parent
    dsc("--home", str(home), "local", "down", "--name", BAKED)
    key_before = sh(f"dsc-{SOURCE}", "cat /etc/ssh/ssh_host_ed25519_key.pub")
    facts = json.loads((cluster / "facts" / f"{SOURCE}.json").read_text())
    refused_when_the_venv_was_changed(cluster, facts)
    secrets_made = plant(f"dsc-{SOURCE}", facts)
    try:
        started = time.monotonic()
        proc = dsc("image", "bake", "-i", str(cluster), "--node", SOURCE, "--name", TAG)
        took = time.monotonic() - started
    finally:
        unplant(f"dsc-{SOURCE}", facts, secrets_made)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"image bake: {took:.0f} s")
    assert f"baked {TAG} from {SOURCE}" in proc.stdout
    # the copy's ranks' bytecode was emptied (what ds planted there goes) and seeded again from
    # the venv, with a job's imports compiled into it (its node runs one rank: its install did
    # not, so before this every node of the image compiled them in its first job)
    assert re.search(
        r"the ranks' bytecode: [1-9]\d* files compiled for a job's imports", proc.stderr
    ), proc.stderr[-2000:]
    # the node it came from is as it was: running, same host key, same cluster key
    assert sh(f"dsc-{SOURCE}", "cat /etc/ssh/ssh_host_ed25519_key.pub") == key_before
    assert sh(f"dsc-{SOURCE}", "test -s /home/ds/.ssh/id_ed25519 && echo key") == "key"
    # A node provisioned in this session, baked: the next make test starts its e2e cluster
    # from it where the inputs are the same (e2e_cluster.cached_image)
    print(f"kept as {keep_as_cache(TAG)}")
    yield home
    dsc("--home", str(home), "local", "down", "--name", BAKED)
    docker("image", "rm", "-f", TAG)


def test_baked_image_is_one_layer_without_the_nodes_identity(cluster: pathlib.Path, baked):
    info = json.loads(docker("image", "inspect", TAG))[0]
    assert len(info["RootFS"]["Layers"]) == 1  # flat: nothing removed hides in a lower layer
    assert info["Config"]["Cmd"] == ["/lib/systemd/systemd"]
    assert info["Config"]["StopSignal"] == "SIGRTMIN+3"
    facts = json.loads((cluster / "facts" / f"{SOURCE}.json").read_text())
    labels = info["Config"]["Labels"]
    assert labels["dscluster.baked.node"] == SOURCE
    assert labels["dscluster.baked.torch"] == facts["versions"]["torch"]
    assert labels["dscluster.baked.deepspeed"] == facts["versions"]["deepspeed"]
    venv = facts["versions"]["venv"]
    found = in_image(
        f"for f in {' '.join(SECRETS)} /etc/munge/munge.key; do test -e $f && echo $f; done; "
        f"wc -c < /etc/machine-id; test -x {venv}/bin/python && echo venv"
    )
    assert found.splitlines() == ["0", "venv"], found
    # Anywhere in the image's files, not only where a node keeps them: no key by its name, and
    # no private key by its content where configuration and state live
    leaked = docker(
        "run", "--rm", "--entrypoint", "/bin/sh", TAG, "-c",
        "find / -xdev \\( -name authorized_keys -o -name 'authorized_keys2' -o -name id_ed25519 "
        "-o -name id_rsa -o -name id_ecdsa -o -name 'ssh_host_*_key' -o -name munge.key \\) "
        "-print 2>/dev/null; grep -rlI -e 'PRIVATE KEY-----' /etc /root /home /var/lib "
        "/var/spool /usr/local/etc /opt/dscluster/bin 2>/dev/null; true",
    )  # fmt: skip
    assert leaked.split() == [], leaked
    # What a rank imports (DeepSpeed's engine, its per-node launcher) is read as the training
    # user from the prefix the image carries: no module compiled from its source
    prefix = facts["versions"]["pycache_dir"]
    python = f"{venv}/bin/python -v -c 'import deepspeed.runtime.engine, deepspeed.launcher.launch'"
    out = docker(
        "run", "--rm", "-u", "ds", "-w", "/tmp", "--entrypoint", "/bin/sh", TAG, "-c",
        f"PYTHONPYCACHEPREFIX={prefix} {python} 2>&1",
    )  # fmt: skip
    read = [ln for ln in out.splitlines() if ln.startswith("# code object from ")]
    assert len(read) > 1000, read[-20:]
    assert [ln for ln in read if not ln.startswith(f"# code object from '{prefix}/")] == []


def test_nothing_the_training_user_made_is_in_the_image(cluster: pathlib.Path, baked):
    """What ds planted on the source node before the bake (a Hugging Face token, ~/.netrc,
    shell history, a usercustomize.py in ~/.local, a key in authorized_keys2, bytecode in the
    ranks' prefix, a torch extension, a scratch file) and the job secrets are in no path of the
    image and CANARY in no byte of it; ds's home is /etc/skel's files, nothing more."""
    facts = json.loads((cluster / "facts" / f"{SOURCE}.json").read_text())
    paths, found = exported(TAG)
    assert found == [], found
    gone = [p for p in [*planted(facts), SECRETS_ENV] if p.lstrip("/") in paths]
    assert gone == [], gone
    assert paths.get(facts["versions"]["pycache_dir"].lstrip("/")) == "dir"  # seeded again
    home = sorted(p.removeprefix("home/ds/") for p in paths if p.startswith("home/ds/"))
    skel = sorted(p.removeprefix("etc/skel/") for p in paths if p.startswith("etc/skel/"))
    assert home == skel, (home, skel)


def test_cluster_from_the_baked_image_provisions_without_reinstalling(cluster: pathlib.Path, baked):
    home = baked
    started = time.monotonic()
    up = dsc("--home", str(home), "local", "up", "--name", BAKED, "--nodes", "2", "--image", TAG)
    assert up.returncode == 0, up.stderr
    inv = home / "inventories" / BAKED
    facts = json.loads((cluster / "facts" / f"{SOURCE}.json").read_text())
    torch_init = f"{facts['versions']['venv']}/lib/python3.11/site-packages/torch/__init__.py"
    stamp = in_image(f"stat -c %Y {torch_init}")
    prov = dsc("provision", "-i", str(inv), timeout=1800)
    ready = time.monotonic() - started
    assert prov.returncode == 0, prov.stdout[-4000:] + prov.stderr[-3000:]
    print(f"local up --image + provision, 2 nodes: {ready:.0f} s")
    # the new cluster's shared storage had no wheelhouse: it was copied, and the venv that
    # came with the image, read again with it in place, needed no install step
    out = prov.stdout + prov.stderr
    assert "Unpack the archive into the node's wheelhouse" in out
    assert "Read the installed stack again, its wheelhouse in place" in out
    assert "Install uv into the tools venv" not in out
    assert "Install the locked wheels with uv" not in out
    nodes = [f"dsc-{BAKED}-n1", f"dsc-{BAKED}-n2"]
    for node in nodes:
        assert docker("inspect", "-f", "{{.Config.Image}}", node).strip() == TAG
        # the stack came with the image: the wheels were not installed again
        assert sh(node, f"stat -c %Y {torch_init}") == stamp
    # every node made its own identity; the new cluster's key replaced nothing of the old
    keys = {sh(n, "cat /etc/ssh/ssh_host_ed25519_key.pub") for n in [*nodes, f"dsc-{SOURCE}"]}
    ids = {sh(n, "cat /etc/machine-id") for n in [*nodes, f"dsc-{SOURCE}"]}
    assert len(keys) == 3 and len(ids) == 3 and "" not in ids
    cluster_key = sh(nodes[0], "cat /home/ds/.ssh/id_ed25519.pub")
    assert cluster_key != sh(f"dsc-{SOURCE}", "cat /home/ds/.ssh/id_ed25519.pub")
    # one line, the new key, let in only from the new cluster's addresses
    authorized = sh(nodes[1], "cat /home/ds/.ssh/authorized_keys").splitlines()
    assert len(authorized) == 1 and authorized[0].startswith('from="127.0.0.0/8,::1,')
    assert authorized[0].endswith(f'" {cluster_key.strip()}'), authorized
    smoke = dsc("smoke", "-i", str(inv), timeout=900)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]


def test_one_more_node_starts_from_the_remembered_image_and_joins(cluster: pathlib.Path, baked):
    home = baked
    inv = home / "inventories" / BAKED
    up = dsc("--home", str(home), "local", "up", "--name", BAKED, "--nodes", "3")
    assert up.returncode == 0, up.stderr
    new = f"{BAKED}-n3"
    assert docker("inspect", "-f", "{{.Config.Image}}", f"dsc-{new}").strip() == TAG
    started = time.monotonic()
    add = dsc("provision", "-i", str(inv), "--add", new, timeout=1800)
    took = time.monotonic() - started
    assert add.returncode == 0, add.stdout[-4000:] + add.stderr[-3000:]
    print(f"provision --add {new} (baked image): {took:.0f} s")
    assert "slots=" in (inv / "hostfile").read_text().split(new)[1].splitlines()[0]
    smoke = dsc("smoke", "-i", str(inv), timeout=900)
    assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]

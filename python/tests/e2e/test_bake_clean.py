"""docker/bake/clean.sh for real, as root in one throw-away container of the node image: what
the training user (`ds`, whose jobs are anyone's code) leaves on a node never reaches an
image, and nothing it planted makes the cleaning follow a link into root's files. No cluster:
the container only holds what a provisioned node would (the user, the directories
provisioning makes, ml_stack's seed script, a venv) and the traps. About 10 s."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import subprocess

import pytest
import yaml

from .. import rolefiles

pytestmark = [pytest.mark.docker, pytest.mark.own_containers]

ROOT = rolefiles.REPO
CLEAN = ROOT / "docker" / "bake" / "clean.sh"
SEED = ROOT / "roles" / "ml_stack" / "files" / "pycache_seed.py"
CANARY = f"DSC-BAKE-CANARY-{secrets.token_hex(8)}"
PREFIX = "/opt/dscluster/pycache"
VENV = "/opt/dscluster/venv"
DIRS = "/opt/dscluster/torch_extensions:/var/lib/dscluster/scratch"
# A stdlib module the node's python compiled at install: its bytecode under the prefix is
# the venv's (here the system python's) after the seed, whatever ds wrote there.
JSON_PYC = "/usr/lib/python3.11/json/__pycache__/__init__.cpython-311.pyc"
# Where the prefix keeps it (PYTHONPYCACHEPREFIX: the source's directory, no __pycache__).
JSON_IN_PREFIX = f"{PREFIX}/usr/lib/python3.11/json/__init__.cpython-311.pyc"

# As root: what provisioning makes (the user, its directories, the seed script, a venv whose
# python is the system's) and what root keeps that a link of ds points at.
SETUP_ROOT = f"""
set -eu
groupadd -g 2000 ds && useradd -m -u 2000 -g ds -s /bin/bash ds
useradd -m -s /bin/bash other
mkdir -p /opt/dscluster/bin {VENV}/bin /var/lib/dscluster /var/spool/cron/crontabs /srv/victim
ln -s /usr/bin/python3 {VENV}/bin/python
install -d -o ds -g ds -m 0755 {PREFIX} /opt/dscluster/torch_extensions
install -d -o ds -g ds -m 0750 /var/lib/dscluster/scratch
install -m 0700 -d /root/.ssh
echo 'root keeps this' > /root/.ssh/keep-me
echo 'ssh-ed25519 AAAA root-bootstrap' > /root/.ssh/authorized_keys
echo 'ssh-ed25519 AAAA {CANARY}' > /root/.ssh/authorized_keys2
install -o ds -g ds -m 0600 /dev/null /var/lib/dscluster/secrets.env
echo 'export HF_TOKEN={CANARY}' > /var/lib/dscluster/secrets.env
install -d -m 0700 /var/lib/dscluster/jobs/launch-20261207T183000123456
echo 'rank 0: token {CANARY}' > /var/lib/dscluster/jobs/launch-20261207T183000123456/launcher.log
install -o ds -g crontab -m 0600 /dev/null /var/spool/cron/crontabs/ds 2>/dev/null \
  || install -o ds -m 0600 /dev/null /var/spool/cron/crontabs/ds
echo '* * * * * curl {CANARY}' > /var/spool/cron/crontabs/ds
# another account: a real ~/.ssh with authorized_keys2, and one whose ~/.ssh is a link
install -d -o other -m 0700 /home/other/.ssh
echo 'ssh-ed25519 AAAA {CANARY}' > /home/other/.ssh/authorized_keys2
echo 'victim keeps this' > /srv/victim/authorized_keys2
useradd -m -s /bin/bash third && ln -s /srv/victim /home/third/.ssh
"""

# As ds: tokens, history, a usercustomize, authorized_keys2 through ~/.ssh, a link to root's
# ~/.ssh and one to /etc, bytecode of its own in the ranks' prefix, a job's files.
SETUP_DS = f"""
set -eu
cd /home/ds
mkdir -p .cache/huggingface .local/lib/python3.11/site-packages
echo 'hf_{CANARY}' > .cache/huggingface/token
echo 'machine example.com login ds password {CANARY}' > .netrc
echo 'export TOKEN={CANARY}' > .bash_history
echo 'print("{CANARY}")' > .local/lib/python3.11/site-packages/usercustomize.py
ln -s /root/.ssh .ssh
ln -s /etc etc-link
mkdir -p {PREFIX}/usr/lib/python3.11/json
echo '{CANARY}' > {JSON_IN_PREFIX}
echo '{CANARY}' > {PREFIX}/evil.cpython-311.pyc
mkdir -p /opt/dscluster/torch_extensions/py311_cpu/cpu_adam /var/lib/dscluster/scratch/job
echo '{CANARY}' > /opt/dscluster/torch_extensions/py311_cpu/cpu_adam/cpu_adam.so
echo '{CANARY}' > /var/lib/dscluster/scratch/job/swap.bin
echo '{CANARY}' > /var/tmp/.hidden
"""


def docker(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *argv], capture_output=True, text=True, check=check, timeout=120, **kw
    )


def in_box(name: str, script: str, user: str = "root") -> str:
    return docker("exec", "-u", user, name, "sh", "-c", script).stdout


@pytest.fixture
def bare():
    """A container of the node image (sleeping: no systemd, no sshd), removed after."""
    from dscluster.sources.local import node_image  # noqa: PLC0415

    name = f"dsc-bakeh-{os.getpid()}"
    docker("rm", "-f", name, check=False)
    docker("run", "-d", "--name", name, "--entrypoint", "sleep", node_image(), "infinity")
    try:
        yield name
    finally:
        docker("rm", "-f", name, check=False)


@pytest.fixture
def box(bare: str) -> str:
    """The container as a provisioned node that ds has used, traps planted."""
    docker("cp", str(SEED), f"{bare}:/tmp/pycache_seed.py")
    in_box(bare, SETUP_ROOT)
    in_box(bare, "install -m 0644 /tmp/pycache_seed.py /opt/dscluster/bin/pycache_seed.py")
    in_box(bare, SETUP_DS, user="ds")
    return bare


def clean(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """clean.sh as bake runs it: its text on stdin of a root shell, the arguments after -s."""
    return docker("exec", "-i", name, "sh", "-s", *args, input=CLEAN.read_text(), check=False)


def listing(name: str, path: str) -> list[str]:
    return sorted(in_box(name, f"cd {path} && find . -mindepth 1 -printf '%P %u\\n'").split("\n"))


def test_what_the_training_user_left_goes_and_its_links_are_never_followed(box: str):
    skel = sorted(f"{line.split()[0]} ds" if line else line for line in listing(box, "/etc/skel"))
    keep = in_box(box, "sha256sum /root/.ssh/keep-me /etc/passwd /etc/shadow")
    proc = clean(box, "ds", "image", PREFIX, VENV, DIRS, "json.tool", "no_such_module_here")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "cleaned", proc.stdout
    # ds's home is /etc/skel, ds's, and nothing else: its ~/.ssh link and ~/etc-link removed
    # as links (root's ~/.ssh and /etc are where they were, unchanged)
    assert listing(box, "/home/ds") == skel
    assert in_box(box, "stat -c '%U %a' /home/ds").split() == ["ds", "755"]
    assert in_box(box, "sha256sum /root/.ssh/keep-me /etc/passwd /etc/shadow") == keep
    # keys that would log in: root's authorized_keys and every authorized_keys2 gone; a
    # user's ~/.ssh that is a link removed as a link, its target's files kept
    left = in_box(
        box,
        "ls -A /root/.ssh /home/other/.ssh; test -L /home/third/.ssh && echo link; "
        "cat /srv/victim/authorized_keys2",
    )
    assert left.split() == ["/home/other/.ssh:", "/root/.ssh:", "keep-me", "victim", "keeps",
                            "this"], left  # fmt: skip
    # the job secrets, root's job records, ds's crontab, what jobs left in the node-local
    # directories: gone; the directories provisioning made stay, as it made them
    gone = in_box(
        box,
        "ls -d /var/lib/dscluster/secrets.env /var/lib/dscluster/jobs /var/spool/cron/crontabs/ds "
        "/var/tmp/.hidden "
        "2>/dev/null; find /opt/dscluster/torch_extensions /var/lib/dscluster/scratch "
        "-mindepth 1; stat -c '%n %U %a' /var/lib/dscluster/scratch "
        "/opt/dscluster/torch_extensions; true",
    )
    assert gone.splitlines() == [
        "/var/lib/dscluster/scratch ds 750",
        "/opt/dscluster/torch_extensions ds 755",
    ], gone
    # the ranks' prefix was made again, as ds, from the venv: ds's bytecode is gone, the
    # stdlib's is the node's own, and the seed imported what it was told to
    verdict = next(
        json.loads(line) for line in reversed(proc.stdout.splitlines()) if line.startswith("{")
    )
    assert verdict["stdlib_copied"] > 100 and verdict["imported"] == ["json.tool"], verdict
    assert list(verdict["not_imported"]) == ["no_such_module_here"], verdict
    assert in_box(box, f"cmp {JSON_PYC} {JSON_IN_PREFIX} && echo same").strip() == "same"
    assert in_box(box, f"ls {PREFIX}/evil.cpython-311.pyc 2>&1; true").count("No such") == 1
    assert in_box(box, f"find {PREFIX} ! -user ds | head -3").strip() == ""
    # and the canary is nowhere in the container's files
    found = in_box(
        box, f"grep -rlF -e '{CANARY}' / --exclude-dir=proc --exclude-dir=sys "
        "--exclude-dir=dev 2>/dev/null | grep -v '^/root/.ssh/keep-me$'; true",
    )  # fmt: skip
    assert found.strip() == "", found


def test_a_home_that_is_a_link_is_made_again_and_its_target_kept(box: str):
    """first-boot (a node started from an AMI): a home that is a link (root's doing) is
    replaced by a directory of the user's; the link's target is not emptied."""
    in_box(
        box,
        "useradd -M -d /home/ds2 -s /bin/bash ds2 && mkdir /srv/target && "
        "echo kept > /srv/target/file && ln -s /srv/target /home/ds2",
    )
    proc = clean(box, "ds2", "first-boot")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = in_box(box, "stat -c '%F %U %a' /home/ds2; cat /srv/target/file; ls -A /home/ds2")
    assert out.split("\n", 1)[0] == "directory ds2 700", out
    assert out.splitlines()[1] == "kept"
    assert sorted(out.splitlines()[2:]) == sorted(in_box(box, "ls -A /etc/skel").splitlines())
    # first-boot leaves the ranks' prefix as the AMI's builder made it (the seed ran there)
    assert in_box(box, f"test -s {PREFIX}/evil.cpython-311.pyc && echo kept").strip() == "kept"


def test_sshd_with_clusters_drop_in_reads_only_authorized_keys(bare: str):
    """cluster_ssh's drop-in, as the role writes it, in the node image's sshd: one
    AuthorizedKeysFile, so a key in authorized_keys2 logs in nowhere; StrictModes on."""
    role_vars = yaml.safe_load((ROOT / "roles/cluster_ssh/vars/main.yml").read_text())
    path = pathlib.PurePosixPath(role_vars["__cluster_ssh_sshd_dropin"])
    assert path.parent == pathlib.PurePosixPath("/etc/ssh/sshd_config.d")
    box = bare
    docker(
        "exec", "-i", box, "sh", "-c", f"cat > {path}",
        input=role_vars["__cluster_ssh_sshd_dropin_content"],
    )  # fmt: skip
    # the node image's own drop-in (10-dscluster.conf) is read after it, and sshd keeps the
    # first value of each keyword
    out = in_box(
        box,
        "useradd ds && mkdir -p /run/sshd && ssh-keygen -A >/dev/null && "
        "sshd -T -C user=ds,host=n1,addr=10.0.0.1",
    )
    found = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert found["authorizedkeysfile"] == ".ssh/authorized_keys", found["authorizedkeysfile"]
    assert found["strictmodes"] == "yes"

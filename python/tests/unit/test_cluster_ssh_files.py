"""cluster_ssh's one-run writer (plugins/modules/cluster_ssh_files.py) run by Ansible
on localhost: ~/.ssh, the key pair, the key added to authorized_keys (other lines kept) and a
whole file, each only where it differs; idempotent; check mode writes nothing; the secret
never printed."""

from __future__ import annotations

import os
import pathlib
import stat
import sys

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "cluster_ssh_files.yml"
SECRET = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIcluster dscluster\n"


def run(tmp_path: pathlib.Path) -> tuple[int, dict | None, str]:
    env = {**os.environ, "ANSIBLE_LIBRARY": str(rolefiles.REPO / "plugins" / "modules")}
    extravars = {
        "dir": str(tmp_path),
        "secret": SECRET,
        "public": PUBLIC,
        "key_id": " ".join(PUBLIC.split()[:2]),
        "known_hosts": "n1 ssh-ed25519 AAAAn1\nn2 ssh-ed25519 AAAAn2\n",
        "ansible_python_interpreter": sys.executable,
    }
    return rolefiles.run_local_play(PLAYBOOK, extravars, "RESULT", env=env)


def mode(path: pathlib.Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def test_writes_what_differs_once_keeps_other_keys_and_never_prints_the_secret(tmp_path):
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o755)  # there, at another mode
    (ssh / "authorized_keys").write_text("ssh-rsa AAAAB3other someone@laptop")  # no newline
    (ssh / "authorized_keys").chmod(0o644)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("n1 ssh-ed25519 AAAAn1\nn2 ssh-ed25519 AAAAn2\n")  # as wanted
    known_hosts.chmod(0o666)  # but open to everyone

    rc, result, out = run(tmp_path)
    assert rc == 0 and result is not None, out[-3000:]
    assert "c2VjcmV0LWtleS1ieXRlcw" not in out  # no_log: the private key is never shown

    first = result["first"]
    assert first["changed"] is True
    assert first["written"] == [
        str(ssh / "id_ed25519.pub"),
        str(ssh / "id_ed25519"),
        str(ssh / "authorized_keys"),
    ]  # ~/.ssh and known_hosts only needed their mode
    assert (ssh / "id_ed25519").read_text() == SECRET
    assert (ssh / "id_ed25519.pub").read_text() == PUBLIC
    assert (ssh / "authorized_keys").read_text() == (
        "ssh-rsa AAAAB3other someone@laptop\n" + PUBLIC
    )
    assert [mode(p) for p in (ssh, ssh / "id_ed25519", ssh / "id_ed25519.pub")] == [
        "0o700",
        "0o600",
        "0o644",
    ]
    assert mode(ssh / "authorized_keys") == "0o600" and mode(known_hosts) == "0o644"

    second = result["second"]
    assert second["changed"] is False and second["written"] == [], second
    assert (ssh / "authorized_keys").read_text().count("AAAAIcluster") == 1

    checked = result["checked"]
    assert checked["changed"] is True and checked["written"] == [str(known_hosts)]
    assert checked["diff"][0]["after"] == "other"
    assert known_hosts.read_text() == "n1 ssh-ed25519 AAAAn1\nn2 ssh-ed25519 AAAAn2\n"

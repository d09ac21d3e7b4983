"""cluster_ssh's one-run writer (plugins/modules/cluster_ssh_files.py) run by Ansible
on localhost: ~/.ssh, the key pair, the key added to authorized_keys (other lines kept) and a
whole file, each only where it differs; idempotent; check mode writes nothing; the secret
never printed."""

from __future__ import annotations

import os
import pathlib
import stat

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "cluster_ssh_files.yml"
SECRET = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)
PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIcluster dscluster\n"


def run(tmp_path: pathlib.Path, **more: str) -> tuple[int, dict | None, str]:
    extravars = {
        "dir": str(tmp_path),
        "secret": SECRET,
        "public": PUBLIC,
        "key_id": " ".join(PUBLIC.split()[:2]),
        "known_hosts": "n1 ssh-ed25519 AAAAn1\nn2 ssh-ed25519 AAAAn2\n",
        **more,
    }
    return rolefiles.run_module_play(PLAYBOOK, extravars)


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


def test_the_key_line_is_replaced_in_place_when_its_from_addresses_change(tmp_path):
    """A cluster whose addresses changed (a node added, an image started elsewhere): the one
    line holding the key gets the new from=, a second copy goes, other lines stay in order."""
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o700)
    key = " ".join(PUBLIC.split()[:2])
    (ssh / "authorized_keys").write_text(
        "ssh-rsa AAAAB3other someone@laptop\n"
        f"{PUBLIC}"
        "# kept\n"
        f'from="10.9.9.9",no-pty {key} old copy\n'
    )
    (ssh / "authorized_keys").chmod(0o600)
    line = f'from="127.0.0.0/8,::1,10.0.0.1,10.0.0.2" {PUBLIC.strip()}'
    rc, result, out = run(tmp_path, authorized_line=line)
    assert rc == 0 and result is not None, out[-3000:]
    assert (ssh / "authorized_keys").read_text() == (
        f"ssh-rsa AAAAB3other someone@laptop\n{line}\n# kept\n"
    )
    assert str(ssh / "authorized_keys") in result["first"]["written"]
    assert result["second"]["changed"] is False, result["second"]


CASES = pathlib.Path(__file__).parent / "playbooks" / "cluster_ssh_files_cases.yml"
ROOT_ONLY = "root:$y$j9T$secrethash:20790:0:99999:7:::\n"


def run_cases(cases: list[dict]) -> list[tuple[str, bool]]:
    _, result, out = rolefiles.run_module_play(CASES, {"cases": cases})
    assert result is not None, out[-3000:]
    assert ROOT_ONLY.split(":")[1] not in out  # the target's content is never read out
    return [tuple(r) for r in result]


def test_links_fifos_hard_links_and_foreign_files_in_ssh_dir_are_refused(tmp_path):
    """The training user owns ~/.ssh, so anything in it may be a trap laid for root: a link to
    /etc/shadow, a FIFO (a read that never returns), a hard link to a root-only file, a file of
    another user, ~/.ssh itself a link. Each write is refused with one line naming the path;
    nothing is read from or written to the target, and the trap is left as it was."""
    secret = tmp_path / "shadow"
    secret.write_text(ROOT_ONLY)
    secret.chmod(0o600)
    elsewhere = tmp_path / "root-only"
    elsewhere.mkdir(mode=0o700)
    cases, expect = [], []
    for i, (kind, name) in enumerate(
        [
            ("symlink", "authorized_keys"),
            ("symlink", "id_ed25519.pub"),
            ("symlink", "id_ed25519"),
            ("fifo", "authorized_keys"),
            ("hardlink", "authorized_keys"),
            ("foreign", "authorized_keys"),
            ("dir-symlink", ".ssh"),
        ]
    ):
        home = tmp_path / f"home{i}"
        home.mkdir()
        ssh = home / ".ssh"
        if kind == "dir-symlink":
            ssh.symlink_to(elsewhere)
        else:
            ssh.mkdir(mode=0o700)
        trap = ssh / name
        if kind == "symlink":
            trap.symlink_to(secret)
        elif kind == "fifo":
            os.mkfifo(trap)
        elif kind == "hardlink":
            os.link(secret, trap)
        elif kind == "foreign":
            trap.write_text("ssh-ed25519 AAAAforeign\n")
            os.chown(trap, 65534, 65534)
        args: dict = {"directory": {"path": str(ssh), "mode": "0700"}}
        if name == "id_ed25519":
            args |= {"secret": {"path": str(trap), "mode": "0600"}, "secret_content": SECRET}
        elif name == "id_ed25519.pub":
            args |= {"files": [{"path": str(trap), "content": PUBLIC, "mode": "0644"}]}
        else:
            line = {"path": str(ssh / "authorized_keys"), "line": PUBLIC, "mode": "0600"}
            args |= {"line": line | {"match": " ".join(PUBLIC.split()[:2])}}
        cases.append(args)
        expect.append((kind, str(ssh if kind == "dir-symlink" else trap)))

    results = run_cases(cases)
    assert len(results) == len(expect)
    for (msg, failed), (kind, path) in zip(results, expect, strict=True):
        assert failed, (kind, msg)
        assert msg.startswith(f"cluster_ssh_files: {path} "), (kind, msg)
        assert "\n" not in msg.strip(), msg
    assert secret.read_text() == ROOT_ONLY and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert secret.stat().st_uid == 0 and secret.stat().st_nlink == 2  # the hard link kept
    assert list(elsewhere.iterdir()) == []
    assert (tmp_path / "home0" / ".ssh" / "authorized_keys").is_symlink()

"""roles/cluster_ssh/files/ssh_state.py: the one reading cluster_ssh takes on a node, from
which it skips the key and known_hosts writes a converged node does not need."""

from __future__ import annotations

import base64
import hashlib
import os
import pwd

import pytest

from tests import rolefiles

ssh_state = rolefiles.load("cluster_ssh", "ssh_state.py")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0 dscluster@demo"


def test_describe_gives_what_copy_compares(tmp_path):
    f = tmp_path / "id_ed25519.pub"
    f.write_text(KEY + "\n")
    f.chmod(0o644)
    about = ssh_state.describe(str(f))
    assert about == {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "mode": "0644",
        "sha1": hashlib.sha1((KEY + "\n").encode()).hexdigest(),
    }
    d = tmp_path / ".ssh"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    assert ssh_state.describe(str(d)) == {
        "uid": os.getuid(), "gid": os.getgid(), "mode": "0700", "isdir": True,
    }  # fmt: skip
    assert ssh_state.describe(str(tmp_path / "missing")) is None


def test_authorized_lists_every_key_line_with_its_key_past_the_options(tmp_path):
    f = tmp_path / "authorized_keys"
    f.write_text(
        "# a comment ssh-rsa AAAAnot\n"
        f"{KEY}\n"
        'from="10.0.0.1,10.0.0.2" ssh-rsa AAAAB3Nza other@host\n'
        'command="echo ssh-dss AAAAfake",no-pty  ecdsa-sha2-nistp256 AAAAE2Vj\n'
        'environment="A=b\\" ssh-rsa AAAAin" sk-ssh-ed25519@openssh.com AAAAsk\n'
        "not a key line\n"
        "\n"
    )
    assert ssh_state.authorized(str(f)) == [
        {"key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0", "line": KEY},
        {
            "key": "ssh-rsa AAAAB3Nza",
            "line": 'from="10.0.0.1,10.0.0.2" ssh-rsa AAAAB3Nza other@host',
        },
        {
            "key": "ecdsa-sha2-nistp256 AAAAE2Vj",
            "line": 'command="echo ssh-dss AAAAfake",no-pty  ecdsa-sha2-nistp256 AAAAE2Vj',
        },
        {
            "key": "sk-ssh-ed25519@openssh.com AAAAsk",
            "line": 'environment="A=b\\" ssh-rsa AAAAin" sk-ssh-ed25519@openssh.com AAAAsk',
        },
    ]
    assert ssh_state.authorized(str(tmp_path / "none")) == []


def test_main_reads_the_account_host_key_and_key_files(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o700)
    (home / ".ssh" / "authorized_keys").write_text(KEY + "\n")
    host_key = tmp_path / "ssh_host_ed25519_key.pub"
    host_key.write_text("ssh-ed25519 AAAAhost root@n1\n")
    entry = pwd.struct_passwd(("ds", "x", 4242, 4243, "", str(home), "/bin/bash"))
    monkeypatch.setattr(ssh_state.pwd, "getpwnam", lambda name: entry)
    state = ssh_state.main(
        {"user": "ds", "host_key": str(host_key), "known_hosts": str(tmp_path / "kh")}
    )
    assert state["account"] == {"uid": 4242, "gid": 4243, "home": str(home)}
    assert base64.b64decode(state["host_key"]).decode() == "ssh-ed25519 AAAAhost root@n1\n"
    assert state["ssh_dir"]["mode"] == "0700" and state["ssh_dir"]["isdir"] is True
    assert state["files"]["id_ed25519"] is None and state["files"]["id_ed25519.pub"] is None
    assert (
        state["files"]["authorized_keys"]["sha1"] == hashlib.sha1((KEY + "\n").encode()).hexdigest()
    )
    assert state["authorized"] == [{"key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0", "line": KEY}]
    assert state["known_hosts"] is None


def test_no_such_user_is_no_account_and_a_missing_host_key_fails_naming_it(tmp_path):
    host_key = tmp_path / "key.pub"
    host_key.write_text("ssh-ed25519 AAAA\n")
    request = {"user": "no-such-user-dsc", "host_key": str(host_key), "known_hosts": "/nonexistent"}
    state = rolefiles.run_inline("cluster_ssh", "ssh_state.py", request)  # as the role runs it
    assert state["account"] is None and state["files"] == {} and state["known_hosts"] is None
    with pytest.raises(SystemExit, match=r"cannot read this node.s public host key .*missing\.pub"):
        ssh_state.main(
            {"user": "x", "host_key": str(tmp_path / "missing.pub"), "known_hosts": "/x"}
        )

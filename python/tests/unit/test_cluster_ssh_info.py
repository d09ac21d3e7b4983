"""plugins/modules/cluster_ssh_info.py (on plugins/module_utils/node_read.py): the one
reading cluster_ssh takes on a node, from which it skips the key and known_hosts writes a
converged node does not need."""

from __future__ import annotations

import base64
import hashlib
import os
import pwd

import pytest

from tests import rolefiles

ssh_info = rolefiles.load_plugin("cluster_ssh_info")
node_read = rolefiles.load_util("node_read")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0 dscluster@demo"


def test_describe_gives_what_copy_compares(tmp_path):
    f = tmp_path / "id_ed25519.pub"
    f.write_text(KEY + "\n")
    f.chmod(0o644)
    about = node_read.describe_no_follow(str(f))
    assert about == {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "mode": "0644",
        "sha1": hashlib.sha1((KEY + "\n").encode()).hexdigest(),
    }
    d = tmp_path / ".ssh"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    assert node_read.describe_no_follow(str(d)) == {
        "uid": os.getuid(), "gid": os.getgid(), "mode": "0700", "isdir": True,
    }  # fmt: skip
    assert node_read.describe_no_follow(str(tmp_path / "missing")) is None


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
    assert ssh_info.authorized(str(f)) == [
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
    assert ssh_info.authorized(str(tmp_path / "none")) == []


def test_main_reads_the_account_host_key_and_key_files(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o700)
    (home / ".ssh" / "authorized_keys").write_text(KEY + "\n")
    host_key = tmp_path / "ssh_host_ed25519_key.pub"
    host_key.write_text("ssh-ed25519 AAAAhost root@n1\n")
    entry = pwd.struct_passwd(("ds", "x", 4242, 4243, "", str(home), "/bin/bash"))
    monkeypatch.setattr(ssh_info.pwd, "getpwnam", lambda name: entry)
    state = ssh_info.read_state("ds", str(host_key), str(tmp_path / "kh"))
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
    missing = {"user": "x", "host_key": str(tmp_path / "missing.pub"), "known_hosts": "/x"}
    state = rolefiles.info_state("ssh", request)  # as the role runs it
    assert state["account"] is None and state["files"] == {} and state["known_hosts"] is None
    assert base64.b64decode(state["host_key"]) == b"ssh-ed25519 AAAA\n"
    no_key = r"cannot read this node.s public host key .*missing\.pub"
    with pytest.raises(ssh_info.NoHostKey, match=no_key):
        ssh_info.read_state("x", str(tmp_path / "missing.pub"), "/x")
    rc, result, out = rolefiles.run_info_modules({"ssh": missing})
    assert rc == 0 and result["ssh"]["failed"] is True, out[-3000:]  # the task fails (ignored here)
    assert result["ssh"]["msg"].startswith(
        f"cannot read this node's public host key {tmp_path / 'missing.pub'}: [Errno 2]"
    ), result["ssh"]


def test_links_fifos_and_hard_links_read_as_unsafe_and_are_never_read(tmp_path):
    """The training user owns ~/.ssh: a link (to a root-only file), a FIFO (a read that would
    never return) or a hard link reads as unsafe, with no sha1, so the write sees it as
    differing; nothing is read through it. The plain reading follows links (root's files)."""
    secret = tmp_path / "shadow"
    secret.write_text("root:secret\n")
    link = tmp_path / "link"
    link.symlink_to(secret)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    hard = tmp_path / "hard"
    os.link(secret, hard)
    for trap in (link, fifo, hard):
        about = node_read.describe_no_follow(str(trap))
        assert about is not None and about["unsafe"] is True and "sha1" not in about, trap
    assert node_read.describe(str(link))["sha1"] == hashlib.sha1(b"root:secret\n").hexdigest()
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    (tmp_path / "home" / ".ssh" / "authorized_keys").symlink_to(secret)
    assert ssh_info.authorized(str(tmp_path / "home" / ".ssh" / "authorized_keys")) == []


def test_the_module_reads_the_users_ssh_files_through_ansible(tmp_path):
    """End to end on localhost, as this user: the account and ~/.ssh as the role reads them."""
    me = pwd.getpwuid(os.getuid())
    host_key = tmp_path / "key.pub"
    host_key.write_text("ssh-ed25519 AAAA\n")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("n1 ssh-ed25519 AAAAn1\n")
    request = {"user": me.pw_name, "host_key": str(host_key), "known_hosts": str(known_hosts)}
    expected = ssh_info.read_state(me.pw_name, str(host_key), str(known_hosts))
    assert rolefiles.info_state("ssh", request) == expected
    assert expected["account"] == {"uid": me.pw_uid, "gid": me.pw_gid, "home": me.pw_dir}
    assert expected["known_hosts"]["sha1"] == hashlib.sha1(b"n1 ssh-ed25519 AAAAn1\n").hexdigest()

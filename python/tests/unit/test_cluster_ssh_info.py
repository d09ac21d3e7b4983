"""plugins/modules/cluster_ssh_info.py: the one reading cluster_ssh takes on a node, the SSH
user's account (where configure.yml writes ~/.ssh) and this node's public host key (the
cluster's known_hosts)."""

from __future__ import annotations

import base64
import os
import pwd

import pytest

from tests import rolefiles

ssh_info = rolefiles.load_plugin("cluster_ssh_info")


def test_main_reads_the_account_and_host_key(tmp_path, monkeypatch):
    home = tmp_path / "home"
    host_key = tmp_path / "ssh_host_ed25519_key.pub"
    host_key.write_text("ssh-ed25519 AAAAhost root@n1\n")
    entry = pwd.struct_passwd(("ds", "x", 4242, 4243, "", str(home), "/bin/bash"))
    monkeypatch.setattr(ssh_info.pwd, "getpwnam", lambda name: entry)
    state = ssh_info.read_state("ds", str(host_key))
    assert state["account"] == {"uid": 4242, "gid": 4243, "home": str(home)}
    assert base64.b64decode(state["host_key"]).decode() == "ssh-ed25519 AAAAhost root@n1\n"
    assert set(state) == {"account", "host_key"}


def test_no_such_user_is_no_account_and_a_missing_host_key_fails_naming_it(tmp_path):
    host_key = tmp_path / "key.pub"
    host_key.write_text("ssh-ed25519 AAAA\n")
    request = {"user": "no-such-user-dsc", "host_key": str(host_key)}
    missing = {"user": "x", "host_key": str(tmp_path / "missing.pub")}
    state = rolefiles.info_state("ssh", request)  # as the role runs it
    assert state["account"] is None
    assert base64.b64decode(state["host_key"]) == b"ssh-ed25519 AAAA\n"
    no_key = r"cannot read this node.s public host key .*missing\.pub"
    with pytest.raises(ssh_info.NoHostKey, match=no_key):
        ssh_info.read_state("x", str(tmp_path / "missing.pub"))
    rc, result, out = rolefiles.run_info_modules({"ssh": missing})
    assert rc == 0 and result["ssh"]["failed"] is True, out[-3000:]  # the task fails (ignored here)
    assert result["ssh"]["msg"].startswith(
        f"cannot read this node's public host key {tmp_path / 'missing.pub'}: [Errno 2]"
    ), result["ssh"]


def test_the_module_reads_the_users_account_through_ansible(tmp_path):
    """End to end on localhost, as this user: the account and host key as the role reads them."""
    me = pwd.getpwuid(os.getuid())
    host_key = tmp_path / "key.pub"
    host_key.write_text("ssh-ed25519 AAAA\n")
    request = {"user": me.pw_name, "host_key": str(host_key)}
    expected = ssh_info.read_state(me.pw_name, str(host_key))
    assert rolefiles.info_state("ssh", request) == expected
    assert expected["account"] == {"uid": me.pw_uid, "gid": me.pw_gid, "home": me.pw_dir}

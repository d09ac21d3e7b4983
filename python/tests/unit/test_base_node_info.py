"""plugins/modules/base_node_info.py, as the base role runs it (the module, its parts from a
var, through Ansible; in check mode the same) and its reading called directly: the parts
this test can read on any machine, the limits file's text and stat included."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd

import pytest

from tests import rolefiles

base_node_info = rolefiles.load_plugin("base_node_info")


def read(request: dict) -> dict:
    state = rolefiles.info_state("base", request)
    assert base_node_info.read_state(request) == state
    return state


def test_limits_file_text_and_stat_for_the_skip_of_its_write(tmp_path):
    limits = tmp_path / "90-dscluster.conf"
    text = "ds hard memlock unlimited\nds soft memlock unlimited\n"
    limits.write_text(text)
    limits.chmod(0o640)
    got = read({"limits_file": str(limits), "stats": [str(limits)], "shared_dir": str(tmp_path)})
    assert got["limits_file"] == text
    assert got["stats"][str(limits)] == {
        "sha1": hashlib.sha1(text.encode()).hexdigest(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "mode": "0640",
    }
    assert got["shared_dir"] == {"exists": True, "isdir": True}
    # only the parts asked for; a missing file is null, not an error
    missing = str(tmp_path / "none.conf")
    assert read({"stats": [missing], "limits_file": missing}) == {
        "stats": {missing: None},
        "limits_file": None,
    }


def test_group_account_and_directory_for_the_skips_of_the_account_writes(tmp_path):
    me = pwd.getpwuid(os.getuid())
    group = grp.getgrgid(os.getgid()).gr_name
    tmp_path.chmod(0o750)
    got = read({"account": me.pw_name, "group": group, "stats": [str(tmp_path)]})
    assert got["account"] == [me.pw_passwd, str(me.pw_uid), str(me.pw_gid), me.pw_gecos,
                              me.pw_dir, me.pw_shell]  # fmt: skip
    assert got["group"] == os.getgid()
    assert got["stats"] == {
        str(tmp_path): {"isdir": True, "uid": os.getuid(), "gid": os.getgid(), "mode": "0750"}
    }
    assert read({"account": "no-such-user-x", "group": "no-such-group-x"}) == {
        "account": None,
        "group": None,
    }


def test_switches_are_read_only_when_true_and_unreadable_sshd_limits_fail_naming_why(
    tmp_path, monkeypatch
):
    """session_limits, etc_hosts and chrony are read only where the request's value is true (a
    template's `| bool`, as vars/main.yml gives them); sshd's limits unreadable fail the task
    with the reason, as the script's exit did."""
    request = {"shared_dir": str(tmp_path)}
    rc, result, out = rolefiles.run_info_modules({"base": request, "etc_hosts": "yes"})
    assert rc == 0, out[-3000:]
    with open("/etc/hosts", encoding="utf-8", errors="replace") as fh:
        assert result["base"]["state"] == {
            "shared_dir": {"exists": True, "isdir": True},
            "etc_hosts": fh.read(),
        }
    assert read({"chrony": False, "session_limits": False, "etc_hosts": False}) == {}
    # sshd's MainPID one that is not running: its limits cannot be read
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\necho 999999999\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    rc, result, out = rolefiles.run_info_modules({"base": {"session_limits": True}})
    assert rc == 0 and result["base"]["failed"] is True, out[-3000:]  # ignored in the play
    assert result["base"]["msg"] == (
        "cannot read the limits of sshd: cat: /proc/999999999/limits: No such file or directory"
    )
    with pytest.raises(base_node_info.Unreadable, match=r"^cannot read the limits of sshd: cat: "):
        base_node_info.read_state({"session_limits": True})

"""roles/base/files/node_state.py, as the base role runs it (python3 -c <file> '<json>'):
the parts this test can read on any machine, the limits file's text and stat included."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd

from tests import rolefiles


def read(request: dict) -> dict:
    return rolefiles.run_inline("base", "node_state.py", request)


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

"""plugins/modules/pdsh_info.py, as the pdsh role runs it (the module, through Ansible, and
in check mode the same) and its reading called directly: the packages dpkg lists as
installed, and how the rcmd file and its directory read."""

from __future__ import annotations

import hashlib
import os

from tests import rolefiles

pdsh_info = rolefiles.load_plugin("pdsh_info")


def read(request: dict) -> dict:
    state = rolefiles.info_state("pdsh", request)
    assert pdsh_info.read_state(request["packages"], request["rcmd_file"]) == state
    return state


def test_rcmd_file_and_directory_read_as_copy_compares(tmp_path):
    conf = tmp_path / "pdsh"
    conf.mkdir()
    conf.chmod(0o755)
    rcmd = conf / "rcmd_default"
    rcmd.write_text("ssh\n")
    rcmd.chmod(0o644)
    got = read({"packages": ["dscluster-no-such-package"], "rcmd_file": str(rcmd)})
    assert got["installed"] == []
    assert got["rcmd_dir"] == {
        "uid": os.getuid(), "gid": os.getgid(), "mode": "0755", "isdir": True,
    }  # fmt: skip
    assert got["rcmd_file"] == {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "mode": "0644",
        "sha1": hashlib.sha1(b"ssh\n").hexdigest(),
    }
    gone = read({"packages": [], "rcmd_file": str(tmp_path / "none" / "rcmd_default")})
    assert gone["rcmd_dir"] is None and gone["rcmd_file"] is None

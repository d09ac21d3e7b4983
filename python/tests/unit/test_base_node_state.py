"""roles/base/files/node_state.py, as the base role runs it (python3 -c <file> '<json>'):
the parts this test can read on any machine, the limits file's text and stat included."""

from __future__ import annotations

import hashlib
import os

from tests import rolefiles


def read(request: dict) -> dict:
    return rolefiles.run_inline("base", "node_state.py", request)


def test_limits_file_text_and_stat_for_the_skip_of_its_write(tmp_path):
    limits = tmp_path / "90-dscluster.conf"
    text = "ds hard memlock unlimited\nds soft memlock unlimited\n"
    limits.write_text(text)
    limits.chmod(0o640)
    got = read(
        {"limits_file": str(limits), "limits_stat": str(limits), "shared_dir": str(tmp_path)}
    )
    assert got["limits_file"] == text
    assert got["limits_stat"] == {
        "sha1": hashlib.sha1(text.encode()).hexdigest(),
        "uid": os.getuid(),
        "gid": os.getgid(),
        "mode": "0640",
    }
    assert got["shared_dir"] == {"exists": True, "isdir": True}
    # only the parts asked for; a missing file is null, not an error
    missing = str(tmp_path / "none.conf")
    assert read({"limits_stat": missing, "limits_file": missing}) == {
        "limits_stat": None,
        "limits_file": None,
    }

"""plugins/module_utils/node_read.py: how a path reads for the *_info modules (pdsh_info,
base_node_info), in the terms copy and template compare."""

from __future__ import annotations

import hashlib
import os

from tests import rolefiles

node_read = rolefiles.load_util("node_read")
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBq0 dscluster@demo"


def test_describe_gives_what_copy_compares(tmp_path):
    f = tmp_path / "id_ed25519.pub"
    f.write_text(KEY + "\n")
    f.chmod(0o644)
    about = node_read.describe(str(f))
    assert about == {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "mode": "0644",
        "sha1": hashlib.sha1((KEY + "\n").encode()).hexdigest(),
    }
    d = tmp_path / ".ssh"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    assert node_read.describe(str(d)) == {
        "uid": os.getuid(), "gid": os.getgid(), "mode": "0700", "isdir": True,
    }  # fmt: skip
    assert node_read.describe(str(tmp_path / "missing")) is None


def test_describe_follows_links(tmp_path):
    # the roles' root-owned files: a link reads as what it points to
    secret = tmp_path / "shadow"
    secret.write_text("root:secret\n")
    link = tmp_path / "link"
    link.symlink_to(secret)
    assert node_read.describe(str(link))["sha1"] == hashlib.sha1(b"root:secret\n").hexdigest()

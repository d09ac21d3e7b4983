"""How a path on a node reads now, for the collection's *_info modules.

A role skips a write whose file already reads as that write would leave it: owner, group,
mode, and a file's sha1 (the checksum Ansible's copy and template compare) or a directory's
isdir. Two readings, named for what they follow:

  describe            os.stat: follows links (what the roles' root-owned files need)
  describe_no_follow  os.lstat and no read through a link: for what another user owns
                      (the training user's ~/.ssh); a link, a FIFO, a device or a file with
                      other hard links reads as {uid, gid, mode, unsafe}

Shared by cluster_ssh_info, pdsh_info and base_node_info.
"""

from __future__ import annotations

import hashlib
import os
import stat


def _owner_and_mode(st: os.stat_result) -> dict:
    return {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}


def _sha1(path: str, opener=None) -> str:
    with open(path, "rb", opener=opener) as fh:
        return hashlib.sha1(fh.read()).hexdigest()


def no_follow(path: str, flags: int) -> int:
    """An opener (open(..., opener=no_follow)) that never follows a link, nor blocks on a FIFO."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


def describe(path: str) -> dict | None:
    """A file's {uid, gid, mode, sha1}, a directory's {uid, gid, mode, isdir}, following links;
    None where the path is missing or cannot be read."""
    try:
        st = os.stat(path)
        about = _owner_and_mode(st)
        if stat.S_ISDIR(st.st_mode):
            return about | {"isdir": True}
        return about | {"sha1": _sha1(path)}
    except OSError:
        return None


def describe_no_follow(path: str) -> dict | None:
    """As describe, but by lstat, and a file is read only where it is a regular file with no
    other hard link, through a descriptor opened without following a link; anything else
    reads as {uid, gid, mode, unsafe: true} (the writes then see it as differing)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    about = _owner_and_mode(st)
    if stat.S_ISDIR(st.st_mode):
        return about | {"isdir": True}
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        return about | {"unsafe": True}
    try:
        return about | {"sha1": _sha1(path, opener=no_follow)}
    except OSError:
        return None

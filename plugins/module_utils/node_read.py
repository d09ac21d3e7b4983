"""How a path on a node reads now, for the collection's *_info modules.

A role skips a write whose file already reads as that write would leave it: owner, group,
mode, and a file's sha1 (the checksum Ansible's copy and template compare) or a directory's
isdir. describe follows links (what the roles' root-owned files need).

Shared by pdsh_info and base_node_info.
"""

from __future__ import annotations

import hashlib
import os
import stat


def _owner_and_mode(st: os.stat_result) -> dict:
    return {"uid": st.st_uid, "gid": st.st_gid, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}


def _sha1(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha1(fh.read()).hexdigest()


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

"""The controller_files action: node_files' directories and whole files, written on the
controller by the task's own worker, with no module run.

A record the controller keeps (what a check proved, a cluster's key directory) cost a copy or
file module run each, two processes for copy; this writes it in the worker, through the same
code (plugins/module_utils/file_writes.py) and the same refusals as node_files.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys

from ansible.plugins.action import ActionBase

# This plugin's own module_utils (a clone's or an installed collection's), never another
# installed version's: file_writes then takes the safe_fs beside it.
_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _UTILS not in sys.path:
    sys.path.insert(0, _UTILS)
import file_writes  # type: ignore[import-not-found]  # noqa: E402

SPEC = {
    "directories": {"type": "list", "elements": "dict", "default": []},
    "files": {"type": "list", "elements": "dict", "default": []},
    "absent": {"type": "list", "elements": "path", "default": []},
}


def remove(path: str, check_mode: bool) -> bool:
    """Remove path (a link itself, not what it names; a directory with all below it), its
    parent reached as the writes reach theirs (safe_fs.walk: no link, no directory of an
    untrusted owner or open to others' writes)."""
    path = path.rstrip("/")
    parent_path, name = os.path.split(path)
    if not path.startswith("/") or name in ("", ".", ".."):
        raise file_writes.safe_fs.UnsafePath(f"{path} is not an absolute path to remove")
    if not os.path.lexists(path):
        return False
    parent, _ = file_writes.safe_fs.walk(parent_path, frozenset({0, os.geteuid()}))
    try:
        st = os.lstat(name, dir_fd=parent)
        if not check_mode:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(name, dir_fd=parent)  # fd-based: follows no link below it
            else:
                os.unlink(name, dir_fd=parent)
    finally:
        os.close(parent)
    return True


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=SPEC)
        writes = file_writes.Writes(self._task.check_mode, self._task.diff)
        # ansible-core before 2.19 turns a templated string that reads as JSON into a dict,
        # as copy's content: written back as to_nice_json writes it.
        files = [
            {**f, "content": json.dumps(f["content"], indent=4, sort_keys=True) + "\n"}
            if isinstance(f.get("content"), (dict, list))
            else f
            for f in args["files"]
        ]
        removed = []
        try:
            writes.apply(args["directories"], files)
            removed = [p for p in args["absent"] if remove(p, self._task.check_mode)]
        except file_writes.ERRORS as exc:
            result.update(failed=True, msg=f"controller_files: {exc}", written=writes.written)
            return result
        result.update(writes.result(), removed=removed)
        result["changed"] = result["changed"] or bool(removed)
        return result

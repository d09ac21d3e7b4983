"""Files and directories root writes on a node in one module run, through safe_fs.

Only what differs is written, atomically; a link, a FIFO, a file with other hard links, or a
file or directory of another owner is refused with one line naming it. Shared by the
collection's modules (cluster_ssh_files, node_files) and, on the controller, by the
controller_files action.
"""

from __future__ import annotations

import os
import sys

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
# On the controller (the controller_files action, which puts this directory on sys.path) the
# safe_fs beside this file, whatever collections are installed.
try:
    from ansible.module_utils import safe_fs  # type: ignore[attr-defined]
except ImportError:
    if os.path.dirname(os.path.abspath(__file__)) in sys.path:
        import safe_fs  # type: ignore[no-redef]
    else:
        from ansible_collections.dscluster.cluster.plugins.module_utils import safe_fs


# What a write refuses or fails on: the module reports it in one line naming the path.
ERRORS = (OSError, ValueError, KeyError, UnicodeDecodeError, safe_fs.UnsafePath)


def need(spec: dict, *keys: str) -> None:
    missing = [k for k in keys if k not in spec or spec[k] is None]
    if missing:
        raise ValueError(f"{spec.get('path', '(no path)')}: missing {', '.join(missing)}")


class Writes:
    """What one run changed: the paths written and the diffs of the public files."""

    def __init__(self, check_mode: bool, diff: bool) -> None:
        self.check = check_mode
        self.diff = diff
        self.changed = False
        self.written: list[str] = []
        self.diffs: list[dict] = []
        self.pending: set[str] = set()  # directories check mode would make

    @staticmethod
    def _who(spec: dict) -> tuple[int, int, int]:
        uid = safe_fs.uid_of(spec.get("owner"))
        return uid, safe_fs.gid_of(spec.get("group"), uid), safe_fs.mode_of(spec.get("mode"), 0o600)

    def _parent(self, path: str, uid: int) -> int | None:
        """The directory holding `path`, opened and checked; None where check mode would make it."""
        parent = os.path.dirname(path)
        if parent in self.pending:
            return None
        fd, _ = safe_fs.walk(parent, frozenset({0, uid}))
        assert fd is not None
        return fd

    def directory(self, spec: dict, make_parents: bool = False) -> None:
        """A directory as `spec` asks; its missing parents made root's (0755) where
        `make_parents`, else refused."""
        need(spec, "path")
        path = spec["path"].rstrip("/")
        uid, gid, mode = self._who(spec)
        parent_path = os.path.dirname(path)
        if parent_path in self.pending:  # check mode: an earlier directory would be its parent
            parent = None
        elif make_parents:
            parent, made = safe_fs.walk(
                parent_path, frozenset({0, uid}), make_mode=0o755, check_mode=self.check
            )
            self.written += made
            self.changed = self.changed or bool(made)
            self.pending.update(made if parent is None else [])
        else:
            parent = self._parent(path, uid)
        if parent is None:  # check mode: it would be made below a directory made first
            self.pending.add(path)
            self.written.append(path)
            self.changed = True
            return
        try:
            fd, made, changed = safe_fs.ensure_dir(
                parent, os.path.basename(path), path, uid, gid, mode, self.check
            )
        finally:
            os.close(parent)
        if fd is None:
            self.pending.add(path)
        else:
            os.close(fd)
        self.changed = self.changed or changed
        if made:
            self.written.append(path)

    def _update(self, spec: dict, after_of, show: bool) -> None:
        """Read the file (refusing what root must not follow), write what after_of(before)
        returns where it differs, then its owner, group and mode."""
        path = spec["path"]
        uid, gid, mode = self._who(spec)
        parent = self._parent(path, uid)
        if parent is None:
            self._wrote(path, b"", after_of(b""), show)
            return
        name = os.path.basename(path)
        # One descriptor for the read and the attributes: a second open by name could find
        # another file (a hard link the training user swapped in) and chown that.
        fd = None
        try:
            fd = safe_fs.open_file(parent, name, path, frozenset({0, uid}))
            before = None
            if fd is not None:
                with os.fdopen(os.dup(fd), "rb") as handle:
                    before = handle.read()
            after = after_of(before or b"")
            if before != after:
                self._wrote(path, before or b"", after, show)
                if not self.check:
                    safe_fs.write_file(parent, name, after, uid, gid, mode)
            elif fd is not None:
                self.changed = safe_fs.attrs(fd, uid, gid, mode, self.check) or self.changed
        finally:
            if fd is not None:
                os.close(fd)
            os.close(parent)

    def _wrote(self, path: str, before: bytes, after: bytes, show: bool) -> None:
        if show and self.diff:
            self.diffs.append(
                {
                    "before_header": path,
                    "after_header": path,
                    "before": before.decode(errors="replace"),
                    "after": after.decode(errors="replace"),
                }
            )
        self.written.append(path)
        self.changed = True

    def whole(self, spec: dict, content: str, show: bool) -> None:
        need(spec, "path")
        self._update(spec, lambda _before: content.encode(), show)

    def line(self, spec: dict) -> None:
        need(spec, "path", "line", "match")
        wanted = spec["line"].rstrip("\n")
        match = f" {spec['match']} "

        def placed(before: bytes) -> bytes:
            lines = before.decode().splitlines()
            holding = [i for i, existing in enumerate(lines) if match in f" {existing} "]
            if [lines[i] for i in holding] == [wanted]:
                return before
            # The first line holding the match becomes the line (its options may have
            # changed: from= when the cluster's addresses do); the others holding it go.
            if holding:
                lines[holding[0]] = wanted
                lines = [x for i, x in enumerate(lines) if i not in holding[1:]]
            else:
                lines.append(wanted)
            return ("\n".join(lines) + "\n").encode()

        self._update(spec, placed, show=True)

    def files(self, specs: list[dict]) -> None:
        """Each file written whole from its content, shown in diff mode."""
        for spec in specs:
            need(spec, "content")
            self.whole(spec, str(spec["content"]), show=True)

    def apply(self, directories: list[dict], files: list[dict]) -> None:
        """The directories (missing parents made), then the files, in order."""
        for spec in directories:
            self.directory(spec, make_parents=True)
        self.files(files)

    def result(self) -> dict:
        """The module's result: changed, the paths written, and the diffs where asked."""
        out: dict = {"changed": self.changed, "written": self.written}
        if self.diffs:
            out["diff"] = self.diffs
        return out

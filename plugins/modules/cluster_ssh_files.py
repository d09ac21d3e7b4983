#!/usr/bin/python
"""cluster_ssh's writes on a node in one module run (one SSH round trip).

copy and template each cost three (a remote stat, the file's transfer, the copy module) and
authorized_key one more: on a node started from a baked image, which gets every one of them,
that was ten round trips per node and about 11 s of a 16-node provision on 2 cores.
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
try:
    from ansible.module_utils import safe_fs  # type: ignore[attr-defined]
except ImportError:
    from ansible_collections.dscluster.cluster.plugins.module_utils import safe_fs

DOCUMENTATION = r"""
module: cluster_ssh_files
short_description: Write the cluster's SSH files on a node in one run
description:
  - Makes a directory, writes files whole (one of them secret, never shown), and adds a line
    to a file where no line holds its match, each with an owner, a group and a mode; only
    what differs is written, atomically (a file made beside it, renamed over it).
  - Root never follows a link there (the training user owns ~/.ssh). Every directory is opened
    from / without following links, and a link, a FIFO, a file with other hard links, or a file
    or directory of another owner is refused with one line naming it.
  - Check mode says what would change and writes nothing; diff mode shows the public files.
options:
  directory:
    description: A directory to make (path, owner, group, mode); parents must exist.
    type: dict
  files:
    description: Files written whole (path, content, owner, group, mode).
    type: list
    elements: dict
    default: []
  secret:
    description: A file written whole from I(secret_content) (path, owner, group, mode).
    type: dict
  secret_content:
    description: The secret file's content (no_log).
    type: str
  line:
    description:
      - Make I(line) (path, line, match, owner, group, mode) the one line of a file that holds
        I(match), a word or words of the line. The first line holding it is replaced, any
        other line holding it removed, and the line appended where none holds it. Other lines
        are kept as they are. The file is made where it is missing.
    type: dict
author: dscluster
"""

EXAMPLES = r"""
- name: Install the cluster key pair and authorise it
  cluster_ssh_files:
    directory: {path: /home/ds/.ssh, owner: ds, group: "2000", mode: "0700"}
    secret: {path: /home/ds/.ssh/id_ed25519, owner: ds, group: "2000", mode: "0600"}
    secret_content: "{{ lookup('ansible.builtin.file', key, rstrip=False) }}"
    files:
      - path: /home/ds/.ssh/id_ed25519.pub
        content: "{{ lookup('ansible.builtin.file', key ~ '.pub', rstrip=False) }}"
        owner: ds
        group: "2000"
        mode: "0644"
    line:
      path: /home/ds/.ssh/authorized_keys
      line: 'from="10.0.0.1,10.0.0.2" ssh-ed25519 AAAA... dscluster'
      match: "ssh-ed25519 AAAA..."
      owner: ds
      group: "2000"
      mode: "0600"
"""

RETURN = r"""
written:
  description: The paths made or written (content) in this run, in the order above.
  type: list
  returned: always
"""


def _need(spec: dict, *keys: str) -> None:
    missing = [k for k in keys if k not in spec or spec[k] is None]
    if missing:
        raise ValueError(f"{spec.get('path', '(no path)')}: missing {', '.join(missing)}")


class Run:
    """What one run changed: the paths written and the diffs of the public files."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.check = module.check_mode
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

    def directory(self, spec: dict) -> None:
        _need(spec, "path")
        path = spec["path"].rstrip("/")
        uid, gid, mode = self._who(spec)
        parent = self._parent(path, uid)
        if parent is None:
            raise ValueError(f"{os.path.dirname(path)} does not exist")
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
        if show and self.module._diff:
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
        _need(spec, "path")
        self._update(spec, lambda _before: content.encode(), show)

    def line(self, spec: dict) -> None:
        _need(spec, "path", "line", "match")
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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directory": {"type": "dict"},
            "files": {"type": "list", "elements": "dict", "default": []},
            "secret": {"type": "dict"},
            "secret_content": {"type": "str", "no_log": True},
            "line": {"type": "dict"},
        },
        required_together=[["secret", "secret_content"]],
        supports_check_mode=True,
    )
    p = module.params
    run = Run(module)
    try:
        if p["directory"]:
            run.directory(p["directory"])
        for spec in p["files"]:
            _need(spec, "content")
            run.whole(spec, str(spec["content"]), show=True)
        if p["secret"]:
            run.whole(p["secret"], p["secret_content"], show=False)
        if p["line"]:
            run.line(p["line"])
    except (OSError, ValueError, KeyError, UnicodeDecodeError, safe_fs.UnsafePath) as exc:
        module.fail_json(msg=f"cluster_ssh_files: {exc}", written=run.written)
    result: dict = {"changed": run.changed, "written": run.written}
    if run.diffs:
        result["diff"] = run.diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()

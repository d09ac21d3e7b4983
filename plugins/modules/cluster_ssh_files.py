#!/usr/bin/python
"""cluster_ssh's writes on a node in one module run (one SSH round trip).

copy and template each cost three (a remote stat, the file's transfer, the copy module) and
authorized_key one more: on a node started from a baked image, which gets every one of them,
that was ten round trips per node and about 11 s of a 16-node provision on 2 cores.
"""

from __future__ import annotations

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: cluster_ssh_files
short_description: Write the cluster's SSH files on a node in one run
description:
  - Makes a directory, writes files whole (one of them secret, never shown), and adds a line
    to a file where no line holds its match, each with an owner, a group and a mode; only
    what differs is written, atomically (Ansible's atomic_move, SELinux contexts kept).
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
      - Add I(line) (path, line, match, owner, group, mode) to a file where no line holds
        I(match); other lines are kept as they are. The file is made where it is missing.
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
      line: "ssh-ed25519 AAAA... dscluster"
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


def _attrs(module: AnsibleModule, path: str, spec: dict, changed: bool) -> bool:
    """Owner, group and mode as `spec` says; True where one differed (check mode: would)."""
    args = {"path": path, "owner": spec.get("owner"), "group": spec.get("group")}
    args["mode"] = spec.get("mode")
    return module.set_fs_attributes_if_different(module.load_file_common_arguments(args), changed)


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _write(module: AnsibleModule, path: str, data: bytes, mode: str | None) -> None:
    """The whole file, atomically: a temporary file beside it, then atomic_move over it. A
    new file is first made empty at its own mode: atomic_move gives a file it creates the
    umask's mode (0644 for a moment, for a private key too) until the attributes are set."""
    if not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, int(mode or "0600", 8)))
    fd, tmp = tempfile.mkstemp(prefix=".cluster_ssh_files.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        module.atomic_move(tmp, path, unsafe_writes=False)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _need(spec: dict, *keys: str) -> None:
    missing = [k for k in keys if k not in spec or spec[k] is None]
    if missing:
        raise ValueError(f"{spec.get('path', '(no path)')}: missing {', '.join(missing)}")


class Run:
    """What one run changed: the paths written and the diffs of the public files."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.changed = False
        self.written: list[str] = []
        self.diffs: list[dict] = []

    def attrs(self, path: str, spec: dict) -> None:
        if os.path.lexists(path):
            self.changed = _attrs(self.module, path, spec, self.changed)

    def directory(self, spec: dict) -> None:
        _need(spec, "path")
        path = spec["path"]
        if not os.path.isdir(path):
            if os.path.lexists(path):
                raise ValueError(f"{path} exists and is not a directory")
            if not self.module.check_mode:
                os.mkdir(path, 0o700)
            self.written.append(path)
            self.changed = True
        self.attrs(path, spec)

    def whole(self, spec: dict, content: str, show: bool) -> None:
        _need(spec, "path")
        path = spec["path"]
        before = _read(path)
        if before != content.encode():
            if show and self.module._diff:
                self.diffs.append(
                    {
                        "before_header": path,
                        "after_header": path,
                        "before": (before or b"").decode(errors="replace"),
                        "after": content,
                    }
                )
            if not self.module.check_mode:
                _write(self.module, path, content.encode(), spec.get("mode"))
            self.written.append(path)
            self.changed = True
        self.attrs(path, spec)

    def line(self, spec: dict) -> None:
        _need(spec, "path", "line", "match")
        path = spec["path"]
        text = (_read(path) or b"").decode()
        if not any(spec["match"] in existing for existing in text.splitlines()):
            after = text + ("" if text == "" or text.endswith("\n") else "\n")
            after += spec["line"].rstrip("\n") + "\n"
            if not self.module.check_mode:
                _write(self.module, path, after.encode(), spec.get("mode"))
            self.written.append(path)
            self.changed = True
        self.attrs(path, spec)


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
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        module.fail_json(msg=f"cluster_ssh_files: {exc}", written=run.written)
    result: dict = {"changed": run.changed, "written": run.written}
    if run.diffs:
        result["diff"] = run.diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()

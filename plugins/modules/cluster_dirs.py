#!/usr/bin/python
"""Directories root makes for the cluster, reached without following links.

The job area, checkpoints and the shared wheelhouse lie where the training user may own the
leaves; root makes them, and sets their owner and mode, only through directories that root
alone can change. Before any is made, the paths root will run programs from or write through
(root_paths: the venvs, the wheelhouses) are checked to be root's all the way up to /.
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
module: cluster_dirs
short_description: Make directories through parents only root can change
description:
  - Makes each directory (and its missing parents, root's at I(parents_mode)) and sets its
    owner, group and mode.
  - Every component is opened from / without following links. A parent that is a link,
    belongs to anyone but root, or that others may write to without the sticky bit, is
    refused with one line naming it, as is a directory that is a link or belongs to another
    user than the one asked for; nothing is made or changed below it.
  - Before anything is made, each of I(root_paths) is checked from / down (links followed,
    their targets checked the same way). Every existing component must belong to root and
    be writable by no one else (a sticky directory such as /tmp excepted). The first that
    is not fails the task in one line naming the path, the component, its owner and the
    fix, and nothing is made. A missing tail is not checked (root makes it later).
  - Check mode says what would change and changes nothing; it checks I(root_paths) the same.
options:
  dirs:
    description:
      - The directories (path, owner, group, mode), made in this order; owner and group
        default to root, mode to 0755.
    type: list
    elements: dict
    required: true
  parents_mode:
    description: The mode of the parents made (root's).
    type: str
    default: '0755'
  root_paths:
    description:
      - Paths root runs programs from or writes through (a venv, its bin/python, a
        wheelhouse), each checked to be root's up to /. Empty strings are left out.
    type: list
    elements: str
    default: []
author: dscluster
"""

EXAMPLES = r"""
- name: Make the job area and the checkpoint directory
  cluster_dirs:
    dirs:
      - {path: /shared/dscluster/jobs, owner: ds, mode: '0755'}
      - {path: /shared/dscluster/checkpoints, owner: ds, mode: '0755'}

- name: Check that root owns the venv up to / (ml_stack_venv), then make the training user's cache
  cluster_dirs:
    root_paths: [/opt/dscluster/venv, /opt/dscluster/venv/bin, /opt/dscluster/venv/bin/python]
    dirs:
      - {path: /opt/dscluster/pycache, owner: ds, mode: '0755'}
"""

RETURN = r"""
made:
  description: The directories made (parents included), or that check mode would make.
  type: list
  returned: always
"""


def ensure(spec: dict, parents_mode: int, check: bool) -> tuple[list[str], bool]:
    """One directory: (directories made, changed)."""
    path = str(spec.get("path") or "").rstrip("/")
    if not path:
        raise ValueError("a directory without a path")
    uid = safe_fs.uid_of(spec.get("owner"))
    # root's group where none is given, as the file module leaves a directory root makes
    gid = safe_fs.gid_of(spec.get("group"), uid) if spec.get("group") not in (None, "") else 0
    mode = safe_fs.mode_of(spec.get("mode"), 0o755)
    parent_path = os.path.dirname(path)
    parent, made = safe_fs.walk(parent_path, make_mode=parents_mode, check_mode=check)
    if parent is None:
        return [*made, path], True
    try:
        fd, leaf_made, changed = safe_fs.ensure_dir(
            parent, os.path.basename(path), path, uid, gid, mode, check
        )
    finally:
        os.close(parent)
    if fd is not None:
        os.close(fd)
    return made + ([path] if leaf_made else []), changed or bool(made)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dirs": {"type": "list", "elements": "dict", "required": True},
            "parents_mode": {"type": "str", "default": "0755"},
            "root_paths": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    made: list[str] = []
    changed = False
    try:
        parents_mode = safe_fs.mode_of(module.params["parents_mode"], 0o755)
        for path in module.params["root_paths"]:
            if path:
                safe_fs.root_chain(path)
        for spec in module.params["dirs"]:
            these, differed = ensure(spec, parents_mode, module.check_mode)
            made += these
            changed = changed or differed
    except (OSError, ValueError, KeyError, safe_fs.UnsafePath) as exc:
        module.fail_json(msg=f"cluster_dirs: {exc}", made=made)
    module.exit_json(changed=changed, made=made)


if __name__ == "__main__":
    main()

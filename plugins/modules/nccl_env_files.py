#!/usr/bin/python
"""A node's NCCL profile computed and written in one module run (the nccl_env role)."""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
try:
    from ansible.module_utils import file_writes, nccl_profile  # type: ignore[attr-defined]
except ImportError:
    from ansible_collections.dscluster.cluster.plugins.module_utils import (
        file_writes,
        nccl_profile,
    )

DOCUMENTATION = r"""
module: nccl_env_files
short_description: Compute a node's NCCL profile and write its script, nccl.conf and fact
description:
  - Computes, on the node, its NCCL / HCCL / gloo profile from its accelerators fact (the
    socket interface checked against the fact's addressed interfaces, the aws-ofi-nccl plugin
    looked for on the node), then writes the profile script, nccl.conf (NCCL_* only) and the
    profile's local fact, in the same run.
  - A profile that cannot work on the node fails the module with one line naming the node,
    and nothing is written.
  - Only what differs is written, atomically, without following links; a link, a FIFO, a
    file with other hard links or a file of another owner is refused with one line naming it.
    The script's and the fact's directories are made (0755) where missing.
  - Check mode computes the profile and says what would change; diff mode shows each file.
options:
  fact:
    description: The node's accelerators fact (C(ansible_facts.ansible_local.accelerators)).
    type: dict
    required: true
  overrides:
    description:
      - C(profile) (auto or a profile name), C(socket_ifname) (an NCCL_SOCKET_IFNAME value)
        and C(env) (variables to set, null to drop one); checked as the profile is computed.
    type: raw
  ofi_nccl_dirs:
    description: Where to look for the aws-ofi-nccl plugin; empty for the EFA installer's.
    type: list
    elements: str
    default: []
  node:
    description: The inventory name, put before an error that does not start with it.
    type: str
    default: ""
  script_path:
    description: Where the profile script (doctor runs it) is installed, mode 0755.
    type: path
    required: true
  script_content:
    description: The profile script's text (the collection's module_utils/nccl_profile.py).
    type: str
    required: true
  conf_path:
    description: NCCL's configuration file, mode 0644.
    type: path
    default: /etc/nccl.conf
  fact_path:
    description: The profile's local fact, mode 0644.
    type: path
    default: /etc/ansible/facts.d/nccl_env.fact
author: dscluster
"""

EXAMPLES = r"""
- name: Compute this node's NCCL profile and write it
  nccl_env_files:
    fact: "{{ ansible_facts.ansible_local.accelerators }}"
    overrides: {profile: auto, env: {}}
    node: "{{ inventory_hostname }}"
    script_path: /opt/dscluster/bin/nccl_profile.py
    script_content: "{{ lookup('file', 'nccl_profile.py') }}"
  register: nccl
"""

RETURN = r"""
profile:
  description: The profile, {profile, env, nccl_conf, socket_ifname, interfaces}.
  type: dict
  returned: success
conf_text:
  description: What nccl.conf holds after the run (or would, in check mode).
  type: str
  returned: success
written:
  description: The paths made or written in this run, or that check mode would.
  type: list
  returned: always
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "fact": {"type": "dict", "required": True},
            "overrides": {"type": "raw"},
            "ofi_nccl_dirs": {"type": "list", "elements": "str", "default": []},
            "node": {"type": "str", "default": ""},
            "script_path": {"type": "path", "required": True},
            "script_content": {"type": "str", "required": True},
            "conf_path": {"type": "path", "default": "/etc/nccl.conf"},
            "fact_path": {"type": "path", "default": "/etc/ansible/facts.d/nccl_env.fact"},
        },
        supports_check_mode=True,
    )
    params = module.params
    state = nccl_profile.node_state(
        params["fact"],
        params["overrides"],
        tuple(params["ofi_nccl_dirs"]) or nccl_profile.OFI_NCCL_DIRS,
    )
    profile = state["profile"]
    if not isinstance(profile, dict):
        module.fail_json(msg=nccl_profile.named(str(state["error"]), params["node"]), written=[])
    conf = nccl_profile.conf_text(profile, params["fact_path"])
    fact = nccl_profile.fact_text(profile, params["conf_path"])
    run = file_writes.Writes(module.check_mode, module._diff)
    try:
        for path in (params["script_path"], params["fact_path"]):
            run.directory({"path": os.path.dirname(path), "mode": "0755"}, make_parents=True)
        script = params["script_content"]
        run.files(
            [
                {"path": params["script_path"], "content": script, "mode": "0755"},
                {"path": params["conf_path"], "content": conf, "mode": "0644"},
                {"path": params["fact_path"], "content": fact, "mode": "0644"},
            ]
        )
    except file_writes.ERRORS as exc:
        module.fail_json(msg=f"nccl_env_files: {exc}", written=run.written)
    module.exit_json(profile=profile, conf_text=conf, **run.result())


if __name__ == "__main__":
    main()

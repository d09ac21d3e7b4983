#!/usr/bin/python
"""The NCCL profile the nccl_env role writes, computed on the node in one round trip."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

# A clone's own first (its ansible.cfg names plugins/module_utils), so that an installed
# collection of another version in ~/.ansible never lends a clone's module its helpers.
try:
    from ansible.module_utils import nccl_profile  # type: ignore[attr-defined]
except ImportError:
    from ansible_collections.dscluster.cluster.plugins.module_utils import nccl_profile

DOCUMENTATION = r"""
module: nccl_env_info
short_description: Compute a node's NCCL profile from its accelerators fact
description:
  - Computes, in one run on the node, its NCCL / HCCL / gloo profile from its accelerators
    fact (the socket interface checked against the fact's addressed interfaces, the
    aws-ofi-nccl plugin looked for on the node).
  - Reads only. A profile that cannot work on the node is not a failure of the module; it is
    returned as C(state.error).
options:
  fact:
    description: The node's accelerators fact (C(ansible_local.accelerators)).
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
author: dscluster
"""

EXAMPLES = r"""
- name: Compute this node's NCCL profile
  nccl_env_info:
    fact: "{{ ansible_local.accelerators }}"
    overrides: {profile: auto, env: {}}
  register: reading
"""

RETURN = r"""
state:
  description:
    - C(profile) is {profile, env, nccl_conf, socket_ifname, interfaces}, or null.
    - C(error) says why there is no profile, naming the node, or is null.
  type: dict
  returned: success
"""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "fact": {"type": "dict", "required": True},
            "overrides": {"type": "raw"},
            "ofi_nccl_dirs": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    state = nccl_profile.node_state(
        params["fact"],
        params["overrides"],
        tuple(params["ofi_nccl_dirs"]) or nccl_profile.OFI_NCCL_DIRS,
    )
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()

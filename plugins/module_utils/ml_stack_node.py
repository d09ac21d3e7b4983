"""ml_stack's side of one node, decided on the controller: what root checks before it runs
anything from the stack's paths, the directories the training user gets, the argv that reads
the installed stack against the controller's, and the argv that seeds the ranks' bytecode.

What vars/main.yml derived in Jinja until issue 75 (__ml_stack_root_paths, __ml_stack_want,
__ml_stack_reading_argv, __ml_stack_node_ranks); the ml_stack_node action (plugins/action)
calls node_plan() once per host at the start of tasks/node.yml. Pure: no Ansible, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# The role variables node_plan() reads (the action passes exactly these).
OPTIONS = (
    "ml_stack_python",
    "ml_stack_venv",
    "ml_stack_tools_venv",
    "ml_stack_node_wheelhouse",
    "ml_stack_node_user_wheelhouse",
    "ml_stack_node_tools_wheelhouse",
    "ml_stack_torch_extensions_dir",
    "ml_stack_pycache_dir",
    "dscluster_training_user",
    "dscluster_cpu_slots",
)
# Where the scripts root runs on the nodes live (record_versions.py, pycache_seed.py).
NODE_BIN = "/opt/dscluster/bin"


def ranks(local: Mapping[str, Any], cpu_slots: Any) -> int:
    """The ranks this node runs (its hostfile slots, as python/src/dscluster/node_facts.py's
    NodeFacts.slots counts them): the accelerators it has, else dscluster_cpu_slots."""
    accelerators = local.get("accelerators") or {}
    if accelerators.get("kind", "cpu") != "cpu":
        return int(accelerators.get("count", 1))
    return int(cpu_slots)


def node_plan(
    plan: Mapping[str, Any],
    local: Mapping[str, Any],
    options: Mapping[str, Any],
    *,
    digests: Mapping[str, Any],
    uv_version: str,
    warm_modules: Sequence[str],
) -> dict:
    """This node's part: plan is the build plan (__ml_stack_plan), local the node's local
    facts (ansible_facts.ansible_local), digests and uv_version the controller's layers
    (layers.yml)."""
    opt = options.get
    venv, tools_venv = str(opt("ml_stack_venv")), str(opt("ml_stack_tools_venv"))
    pycache_dir = str(opt("ml_stack_pycache_dir") or "")
    extensions_dir = str(opt("ml_stack_torch_extensions_dir") or "")
    user = str(opt("dscluster_training_user"))
    node_ranks = ranks(local, opt("dscluster_cpu_slots"))
    # What the controller expects of the node's stack: record_versions.py reads the node and,
    # given this, adds its verdict (for the venv and for the node's wheelhouse).
    want = {
        "torch": plan["torch_version"],
        "deepspeed": plan["deepspeed_version"],
        "ops": list(plan["ops"]),
        "user_layer_key": plan["user_key"] if plan["user_layer"] else "",
        "uv": uv_version,
        "digests": dict(digests),
    }
    recorded_warm = bool((local.get("ml_stack") or {}).get("pycache_warm", False))
    return {
        # Root runs programs from these or writes through them: each must be root's up to /
        # (cluster_dirs) before the reading runs the venv's python.
        "root_paths": [
            str(opt("ml_stack_python")),
            venv,
            f"{venv}/bin",
            f"{venv}/bin/python",
            tools_venv,
            f"{tools_venv}/bin",
            f"{tools_venv}/bin/uv",
            str(opt("ml_stack_node_wheelhouse")),
            str(opt("ml_stack_node_user_wheelhouse")),
            str(opt("ml_stack_node_tools_wheelhouse")),
            NODE_BIN,
        ],
        "dirs": [
            {"path": path, "owner": user, "mode": "0755"}
            for path in (extensions_dir, pycache_dir)
            if path
        ],
        "reading_argv": [
            f"{venv}/bin/python",
            f"{NODE_BIN}/record_versions.py",
            str(opt("ml_stack_node_wheelhouse")),
            str(opt("ml_stack_node_user_wheelhouse")),
            tools_venv,
            "--want",
            json.dumps(want),
            "--pip-check",
        ],
        "ranks": node_ranks,
        # The seed (tasks/node.yml) runs as the training user, by runuser, from root's scripts
        # directory; with several ranks a node it also compiles what a job imports.
        "seed_argv": [
            "runuser",
            "-u",
            user,
            "--",
            "python3",
            "-I",
            f"{NODE_BIN}/pycache_seed.py",
            venv,
            pycache_dir,
            *(list(warm_modules) if node_ranks > 1 else []),
        ],
        "seed_possible": bool(pycache_dir),
        # Several ranks and a prefix the recorded fact says lacks a job's imports (slots raised
        # after the install): seed even on a converged node.
        "seed_for_ranks": node_ranks > 1 and not recorded_warm,
        "pycache_warm_recorded": recorded_warm,
    }

"""Accelerate's config file for `launch --launcher accelerate` and `sbatch --launcher
accelerate`: the user's own (read and checked) or one generated from the cluster's facts, in
accelerate's own format (accelerate/commands/config/config_args.py: ClusterConfig); pure.

How the ranks start (accelerate 1.11, accelerate/commands/launch.py: launch_command): MULTI_GPU,
FSDP and DEEPSPEED (`deepspeed_multinode_launcher: standard`) run torch.distributed.run on each
node with static rendezvous on `--main_process_ip:--main_process_port`, `--num_processes /
--num_machines` ranks per node, node rank `--machine_rank`. MULTI_CPU takes the "simple" path:
ONE process per node with no RANK/WORLD_SIZE (unless accelerate is given an mpirun hostfile),
so every node trains alone at world size 1. On a MULTI_CPU config with more than one rank,
dscluster adds `--multi_gpu`, which takes the torch.distributed.run path instead; on CPU-only
nodes the ranks come up as MULTI_CPU with gloo because the cluster's CPU profile exports
ACCELERATE_USE_CPU=true (launch_env.derive_launch_env; without it accelerate/state.py's
_prepare_backend finds no backend and every rank is alone at world size 1). mpirun is not used: it
would need Intel MPI or a torch built with MPI, and bypasses the per-node agents that
launch_watch.py and lost-node naming expect.

FSDP and DeepSpeed on CPU are refused for the generated config: accelerate 1.x enables its
FSDP plugin only for the GPU-like distributed types (AcceleratorState.__init__), so on CPU
nodes an FSDP config silently trains plain DDP; and it gives DeepSpeed no process-group
backend without a GPU (world size 1) or, with ACCELERATE_USE_CPU, switches DeepSpeed off.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

import yaml

from ..errors import DsclusterError

CONFIG_KINDS = ("ddp", "fsdp", "deepspeed")
# Where the config goes in the job directory (JSON configs keep .json: accelerate picks the
# parser by the file's suffix).
CONFIG_NAME = "accelerate_config.yaml"
CONFIG_SUFFIXES = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
DISTRIBUTED_TYPES = {"cuda": "MULTI_GPU", "hpu": "MULTI_HPU", "cpu": "MULTI_CPU"}
# Seed 003's FSDP block (CSC's guide), as accelerate writes it.
FSDP_CONFIG = {
    "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    "fsdp_backward_prefetch_policy": "BACKWARD_PRE",
    "fsdp_forward_prefetch": False,
    "fsdp_cpu_ram_efficient_loading": True,
    "fsdp_offload_params": False,
    "fsdp_sharding_strategy": "FULL_SHARD",
    "fsdp_state_dict_type": "SHARDED_STATE_DICT",
    "fsdp_sync_module_states": True,
    "fsdp_use_orig_params": True,
}
# accelerate's own DeepSpeed block (`accelerate config`): ZeRO-2, no offload. `standard`: one
# torch.distributed.run per node (what the per-node script starts), not accelerate's own pdsh.
DEEPSPEED_CONFIG = {
    "deepspeed_multinode_launcher": "standard",
    "gradient_accumulation_steps": 1,
    "offload_optimizer_device": "none",
    "offload_param_device": "none",
    "zero3_init_flag": False,
    "zero_stage": 2,
}


def config_name(path: str) -> str:
    """The staged name of a user's config: accelerate_config.yaml or .json, by its suffix."""
    return "accelerate_config.json" if path.endswith(".json") else CONFIG_NAME


def render_config(kind: str, accelerator: str, *, num_machines: int, num_processes: int) -> str:
    """A ClusterConfig YAML for the selected nodes; `accelerator`: cuda, hpu or cpu."""
    if kind not in CONFIG_KINDS:
        raise DsclusterError(
            f"--accelerate-config-kind {kind!r} is unknown; use one of {', '.join(CONFIG_KINDS)}"
        )
    cpu = accelerator == "cpu"
    if kind == "fsdp" and cpu:
        raise DsclusterError(
            "--accelerate-config-kind fsdp: accelerate enables FSDP only on GPU-like devices, so "
            "these CPU-only nodes would train plain DDP; use --accelerate-config-kind ddp here, "
            "FSDP on GPU nodes"
        )
    if kind == "deepspeed" and cpu:
        raise DsclusterError(
            "--accelerate-config-kind deepspeed: accelerate gives DeepSpeed no process group on "
            "CPU-only nodes (each rank would train alone); use --accelerate-config-kind ddp here, "
            "or --launcher deepspeed for a DeepSpeed script"
        )
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": {
            "ddp": DISTRIBUTED_TYPES.get(accelerator, "MULTI_GPU"),
            "fsdp": "FSDP",
            "deepspeed": "DEEPSPEED",
        }[kind],
        "downcast_bf16": "no",
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        # Precision is the training's choice (bf16 fails on GPUs without it): none here.
        "mixed_precision": "no",
        "num_machines": num_machines,
        "num_processes": num_processes,
        "rdzv_backend": "static",
        "same_network": True,
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
        # use_cpu would become ACCELERATE_USE_CPU on some paths, which turns DeepSpeed off.
        "use_cpu": cpu and kind != "deepspeed",
    }
    if kind == "fsdp":
        config["fsdp_config"] = dict(FSDP_CONFIG)
    if kind == "deepspeed":
        config["deepspeed_config"] = dict(DEEPSPEED_CONFIG)
    return "# dscluster: generated for this job (accelerate's ClusterConfig format)\n" + (
        yaml.safe_dump(config, sort_keys=True)
    )


def parse_config(text: str, name: str) -> dict[str, Any]:
    """A user's config (YAML or JSON by `name`'s suffix), checked as far as it can be here."""
    suffix = pathlib.PurePath(name).suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise DsclusterError(
            f"--accelerate-config {name}: accelerate reads .yaml, .yml or .json config files; "
            "rename it or write one with `accelerate config`"
        )
    try:
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DsclusterError(
            f"--accelerate-config {name} is not valid {CONFIG_SUFFIXES[suffix].upper()} "
            f"({first}); fix it or write one with `accelerate config`"
        ) from None
    if not isinstance(data, dict) or not data.get("distributed_type"):
        raise DsclusterError(
            f"--accelerate-config {name} has no distributed_type; write one with "
            "`accelerate config` (e.g. distributed_type: MULTI_GPU)"
        )
    return data


def check_cpu_config(config: Mapping[str, Any], name: str) -> None:
    """A user's config on CPU-only nodes: FSDP and DeepSpeed would not run as configured
    (module doc), so they are refused rather than trained as something else."""
    kind = str(config.get("distributed_type", "")).upper()
    if kind in ("FSDP", "DEEPSPEED"):
        instead = "plain DDP" if kind == "FSDP" else "each rank alone"
        raise DsclusterError(
            f"--accelerate-config {name}: distributed_type {kind} does not run on CPU-only "
            f"nodes (accelerate would train {instead}); "
            "use distributed_type: MULTI_GPU here (dscluster's CPU profile makes it gloo DDP)"
        )


def extra_args(config: Mapping[str, Any], world_size: int) -> list[str]:
    """What `accelerate launch` needs besides the config to start every rank (module doc)."""
    if str(config.get("distributed_type", "")).upper() == "MULTI_CPU" and world_size > 1:
        return ["--multi_gpu"]
    return []

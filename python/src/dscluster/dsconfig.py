"""`dscluster dsconfig`: DeepSpeed config JSON that fits the cluster it will run on.

ZeRO 1/2/3 in the forms of DeepSpeed's ZeRO / ZeRO-Offload / ZeRO-Infinity tutorials, with
what only the cluster knows filled in and checked:

- precision by accelerator: bf16 on Gaudi and on Ampere-or-newer NVIDIA GPUs, fp16 on older
  GPUs (V100, T4, ...), fp32 on CPU nodes; `--precision` overrides;
- the batch: train_batch_size = micro batch x accumulation x every slot of the hostfile;
- NVMe offload (ZeRO-Infinity): `nvme_path` on node-local scratch (dscluster_scratch_dir, or
  --nvme-path), never on shared storage; the `aio` block; pinned buffers only on GPU/Gaudi;
- checkpoints by storage kind: on shared storage every rank writes one directory and tags
  must agree (tag_validation Fail); without it, `use_node_local_storage` (each node keeps its
  own ranks' files in dscluster_checkpoint_dir).

Before the file is written, playbooks/dsconfig.yml runs the cluster's own DeepSpeed over it:
`DeepSpeedConfig` on the head with the cluster's data-parallel world size, and on every node
the NVMe path (exists, writable by the training user, free space) and the async_io op (loads
without compiling). Any problem is one line naming the node and the fix; nothing is written.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from rich.console import Console

from . import storage
from .degraded import read_degraded
from .errors import DsclusterError
from .inventory import Inventory
from .node_facts import NodeFacts, load_facts
from .paths import cache_dir
from .util import atomic_write

ZERO_STAGES = (1, 2, 3)
OFFLOADS = ("none", "cpu", "nvme")
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
# NVIDIA GPUs before Ampere (compute capability < 8.0) have no bf16: DeepSpeed's
# ZeRO-Offload/Infinity tutorials use fp16 there.
PRE_AMPERE = re.compile(
    r"\b(V100|T4|P100|P40|P4|K80|K40|M60|M40|Titan V|Titan RTX|Quadro RTX|RTX 20\d0|GTX)\b", re.I
)
# DeepSpeed's documented aio defaults (deepspeed/runtime/swap_tensor/constants.py AIO_FORMAT)
# with the block size and queue depth of the ZeRO-Infinity tutorial for NVMe.
AIO = {
    "block_size": 1048576,
    "queue_depth": 8,
    "intra_op_parallelism": 1,
    "single_submit": False,
    "overlap_events": True,
    "use_gds": False,
}
MIN_NVME_FREE = 1 << 30


def precision_for(facts: Sequence[NodeFacts]) -> tuple[str, str]:
    """(precision, why) from what the nodes recorded."""
    kinds = {f.accelerator for f in facts}
    if len(kinds) != 1:
        raise DsclusterError(
            "nodes have different accelerators ("
            + ", ".join(f"{f.host}: {f.accelerator}" for f in facts)
            + "); one DeepSpeed config needs one kind: leave the odd nodes out (launch --exclude)"
        )
    kind = kinds.pop()
    if kind == "hpu":
        return "bf16", "Gaudi"
    if kind == "cpu":
        return "fp32", "CPU nodes (no mixed precision)"
    old = sorted({m for f in facts for m in f.models if PRE_AMPERE.search(m)})
    if old:
        return "fp16", f"GPUs without bf16 ({', '.join(old)})"
    return "bf16", "GPUs with bf16 (Ampere or newer)"


def build_config(  # noqa: PLR0913 - one keyword per DeepSpeed config knob the command exposes
    *,
    zero: int,
    offload: str,
    precision: str,
    accelerator: str,
    world_size: int,
    paths: storage.Paths,
    nvme_path: str = "",
    micro_batch: int = 1,
    grad_accum: int = 1,
    lr: float = 1e-4,
    nvme_buffer_size: int = 100_000_000,
    hf: bool = False,
) -> dict[str, Any]:
    """The DeepSpeed config (a pure function of its arguments); `hf`: in the HF Trainer's
    form (hf_form)."""
    if zero not in ZERO_STAGES:
        raise DsclusterError(f"--zero {zero} is not a ZeRO stage; use 1, 2 or 3")
    if offload not in OFFLOADS:
        raise DsclusterError(f"--offload {offload} is unknown; use none, cpu or nvme")
    if offload == "nvme" and zero != 3:
        raise DsclusterError(
            f"--offload nvme needs --zero 3 (ZeRO-Infinity; stage {zero}'s optimizer treats "
            "nvme as cpu and only ZeRO-3 offloads parameters): use --zero 3, or --offload cpu"
        )
    if micro_batch < 1 or grad_accum < 1 or world_size < 1:
        raise DsclusterError("--micro-batch and --grad-accum must be 1 or more")
    pin = accelerator != "cpu"  # pinned host memory needs memlock; CPU ranks gain nothing
    zero_cfg: dict[str, Any] = {"stage": zero, "contiguous_gradients": True, "overlap_comm": True}
    if zero in (1, 2):
        zero_cfg.update(
            allgather_partitions=True,
            allgather_bucket_size=200_000_000,
            reduce_scatter=True,
            reduce_bucket_size=200_000_000,
        )
    else:
        zero_cfg.update(
            reduce_bucket_size=10_000_000,
            sub_group_size=1_000_000_000,
            stage3_prefetch_bucket_size=10_000_000,
            stage3_param_persistence_threshold=100_000,
            stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000,
            stage3_gather_16bit_weights_on_model_save=precision != "fp32",
        )
    if offload == "cpu":
        zero_cfg["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
        if zero == 3:
            zero_cfg["offload_param"] = {"device": "cpu", "pin_memory": pin}
    elif offload == "nvme":
        zero_cfg["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": nvme_path,
            "pin_memory": pin,
            "buffer_count": 4,
            "fast_init": False,
        }
        zero_cfg["offload_param"] = {
            "device": "nvme",
            "nvme_path": nvme_path,
            "pin_memory": pin,
            "buffer_count": 5,
            "buffer_size": nvme_buffer_size,
            "max_in_cpu": 1_000_000_000,
        }
    config: dict[str, Any] = {
        "train_batch_size": micro_batch * grad_accum * world_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01},
        },
        "zero_optimization": zero_cfg,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
        # Shared storage: every rank writes one directory, and a rank saving under another
        # tag is an error. Node-local: each node keeps its own ranks' files.
        "checkpoint": (
            {"tag_validation": "Fail", "use_node_local_storage": False}
            if paths.shared
            else {"tag_validation": "Warn", "use_node_local_storage": True}
        ),
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        }
    if offload == "nvme":
        config["aio"] = dict(AIO)
    return hf_form(config) if hf else config


# Where the HF Trainer's form of a config (the HF DeepSpeed guide's examples) says "auto":
# the Trainer fills these from its TrainingArguments (transformers' HfTrainerDeepSpeedConfig).
HF_AUTO_KEYS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
)
HF_AUTO_ZERO3 = (
    "reduce_bucket_size",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
)


def hf_form(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as the HF Trainer takes it: the batch, clipping, optimizer and scheduler
    values, the precision switches and ZeRO-3's model-size buckets "auto" (the Trainer fills
    them from its own arguments and the model), ZeRO stage, offload and checkpoints as built."""
    hf = json.loads(json.dumps(config))
    for key in HF_AUTO_KEYS:
        hf[key] = "auto"
    hf["optimizer"]["params"] = dict.fromkeys(("lr", "betas", "eps", "weight_decay"), "auto")
    hf["scheduler"] = {
        "type": "WarmupLR",
        "params": dict.fromkeys(("warmup_min_lr", "warmup_max_lr", "warmup_num_steps"), "auto"),
    }
    # Both switches: the Trainer turns on the one its --bf16 / --fp16 asks for.
    fp16 = hf.pop("fp16", None) or {
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    }
    hf["fp16"] = {**fp16, "enabled": "auto"}
    hf["bf16"] = {"enabled": "auto"}
    zero = hf["zero_optimization"]
    if zero["stage"] == 3:
        zero.update(dict.fromkeys(HF_AUTO_ZERO3, "auto"))
    return hf


def auto_keys(config: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose value is "auto" (the HF Trainer's form)."""
    if isinstance(config, dict):
        return [k for key, v in config.items() for k in auto_keys(v, f"{prefix}{key}.")]
    return [prefix[:-1]] if config == "auto" else []


def check_nvme_path(nvme_path: str, paths: storage.Paths) -> None:
    """NVMe offload swaps each rank's state to local disk: refuse shared storage."""
    if not nvme_path.startswith("/"):
        raise DsclusterError(f"--nvme-path {nvme_path} is not an absolute path")
    inside = nvme_path == paths.shared_dir or nvme_path.startswith(paths.shared_dir + "/")
    if paths.shared and inside:
        raise DsclusterError(
            f"--nvme-path {nvme_path} is on shared storage ({paths.kind} at {paths.shared_dir}); "
            "NVMe offload swaps every rank's state to node-local disk: use an NVMe mount or "
            "dscluster_scratch_dir"
        )


def locked_bytes(config: Mapping[str, Any]) -> int:
    """Memory DeepSpeed locks per rank for ZeRO-Infinity's parameter swap buffers
    (buffer_count x buffer_size elements of the training dtype)."""
    param = (config.get("zero_optimization") or {}).get("offload_param") or {}
    if param.get("device") != "nvme":
        return 0
    half = (config.get("bf16") or {}).get("enabled") or (config.get("fp16") or {}).get("enabled")
    return (
        int(param.get("buffer_count", 5)) * int(param.get("buffer_size", 1e8)) * (2 if half else 4)
    )


def judge(  # noqa: C901 - one branch per check result the config is judged on
    results: Mapping[str, Mapping[str, Any]],
    *,
    hosts: Sequence[str],
    head: str,
    offload: str,
    precision: str,
    precision_auto: bool,
    locked: int = 0,
    buffer_size: int = 0,
) -> tuple[list[str], list[str]]:
    """(problems, notes) from the per-node check results; pure. `locked` is what one rank
    locks (locked_bytes) with offload_param's `buffer_size`; ulimit -l applies per process."""
    problems: list[str] = []
    notes: list[str] = []
    memlock = (results.get(head) or {}).get("memlock") or {}
    for host in hosts if locked else ():
        limit = (memlock.get("bytes") or {}).get(host)
        if limit is None:
            why = (memlock.get("errors") or {}).get(host, "not measured")
            problems.append(
                f"{host}: locked-memory limit unknown ({why}); run 'dscluster doctor' (pdsh)"
            )
        elif 0 <= limit < locked:
            fits = buffer_size * limit // locked
            problems.append(
                f"{host}: NVMe offload locks {locked / 2**20:.0f} MiB per rank for its swap "
                f"buffers but ulimit -l is {limit / 2**20:.0f} MiB; raise memlock to unlimited "
                "(base role limits; docker --ulimit memlock=-1) or use a smaller "
                f"--nvme-buffer-size (at most {fits} here, and at least the largest "
                "parameter's element count)"
            )
    for host in hosts:
        res = results.get(host)
        if res is None or "error" in res:
            why = (res or {}).get("error") or "no check result"
            problems.append(
                f"{host}: the check did not run ({why[:300]}); run 'dscluster doctor -i "
                "<inventory>' to find what is wrong with the node"
            )
            continue
        if offload == "nvme":
            nvme = res.get("nvme") or {}
            if not nvme.get("writable"):
                problems.append(
                    f"{host}: NVMe path {nvme.get('path')} {nvme.get('error') or 'is unusable'}; "
                    "create it, writable by the training user, on local NVMe (or set "
                    "dscluster_scratch_dir and provision)"
                )
            elif (nvme.get("free_bytes") or 0) < MIN_NVME_FREE:
                problems.append(
                    f"{host}: NVMe path {nvme.get('path')} has only "
                    f"{(nvme.get('free_bytes') or 0) / 2**30:.1f} GiB free; free space or use "
                    "a larger disk"
                )
            aio = res.get("async_io") or {}
            if not aio.get("usable"):
                problems.append(
                    f"{host}: DeepSpeed's async_io op does not load ({aio.get('error')}); NVMe "
                    "offload needs it: install libaio (base role) and a DeepSpeed built with "
                    "DS_BUILD_AIO=1 (provision again), or use --offload cpu"
                )
    val = (results.get(head) or {}).get("validate")
    # (no `validate` at all: the head's own failure is reported above)
    if val is not None and not val.get("ok"):
        problems.append(
            f"{head}: DeepSpeed rejects the config: {val.get('error')}; fix the options "
            "(or report a dscluster bug if the defaults were used)"
        )
    elif val is not None:
        if precision == "bf16" and val.get("bf16_supported") is False:
            problems.append(
                f"{head}: bf16 is not supported by the {val.get('accelerator')} accelerator"
                + (
                    "; use --precision fp16"
                    if not precision_auto
                    else " although the recorded GPU models suggested it; use --precision fp16"
                )
            )
        notes += _accepted(val)
    return problems, notes


def _accepted(val: Mapping[str, Any]) -> list[str]:
    """The notes on a config DeepSpeed accepted (and the "auto" values filled to check it)."""
    notes: list[str] = []
    filled = val.get("auto_filled") or []
    if filled:
        notes.append(
            f'{len(filled)} "auto" value(s) filled as the HF Trainer would with its default '
            "arguments (per-device batch 1, no accumulation) for the check: " + ", ".join(filled)
        )
    notes.append(
        f"DeepSpeed (torch {val.get('torch')}) accepts it: ZeRO-{val.get('zero_stage')}, "
        f"train_batch_size {val.get('train_batch_size')} = {val.get('micro_batch')} x "
        f"{val.get('grad_accum')} x world, optimizer offload {val.get('offload_optimizer')}, "
        f"param offload {val.get('offload_param')}, "
        + (
            "precision from the Trainer's --bf16/--fp16"
            if {"bf16.enabled", "fp16.enabled"} & set(filled)
            else "bf16"
            if val.get("bf16")
            else "fp16"
            if val.get("fp16")
            else "fp32"
        )
        + f", use_node_local_storage {val.get('use_node_local_storage')}"
    )
    return notes


def default_out(inv: Inventory, zero: int, offload: str, *, hf: bool = False) -> pathlib.Path:
    suffix = ("" if offload == "none" else f"_{offload}") + ("_hf" if hf else "")
    return inv.directory / "dsconfig" / f"ds_config_zero{zero}{suffix}.json"


def check_on_cluster(
    inv: Inventory,
    config: Mapping[str, Any],
    *,
    hosts: Sequence[str],
    world_size: int,
    nvme_path: str,
    console: Console,
) -> dict[str, dict[str, Any]]:
    """Run playbooks/dsconfig.yml; per-host results."""
    from .runner import run_playbook  # noqa: PLC0415

    work = pathlib.Path(tempfile.mkdtemp(prefix="dsconfig-", dir=cache_dir()))
    try:
        config_file = work / "ds_config.json"
        config_file.write_text(json.dumps(config, indent=2) + "\n")
        script = resources.files("dscluster.jobs") / "dsconfig_check.py"
        skipped = [h for h in inv.hosts if h not in hosts]
        result = run_playbook(
            "dsconfig.yml",
            inv,
            extravars={
                "dsconfig_script": str(script),
                "dsconfig_config": str(config_file),
                "dsconfig_world_size": world_size,
                "dsconfig_nvme_path": nvme_path,
            },
            limit=",".join(hosts) if skipped else None,
            console=console,
            timeout=600,
        )
        results: dict[str, dict[str, Any]] = {}
        # {host: the check's JSON line}
        for host, line in sorted(result.handed("dsconfig_results").items()):
            try:
                results[host] = json.loads(line)
            except (TypeError, json.JSONDecodeError) as exc:
                results[host] = {"error": f"unreadable check output ({exc})"}
        for host, task, message in result.failures:
            # A failure of the whole run (host "-": it ended, timed out, or reached no node
            # before any task) is every unanswered node's reason: named, never "no result".
            for name in hosts if host == "-" else [host]:
                results.setdefault(name, {"error": f"{task}: {message}"})
        for name in hosts:
            ran = result.hosts.get(name)
            if name not in results and not (ran and ran.ok + ran.failed + ran.skipped):
                results[name] = {
                    "error": f"dsconfig.yml ({result.status}, rc {result.rc}) ran no task on it"
                }
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_dsconfig(  # noqa: PLR0913 - the dsconfig command's options, each a keyword
    inv: Inventory,
    *,
    zero: int,
    offload: str = "none",
    precision: str = "auto",
    micro_batch: int = 1,
    grad_accum: int = 1,
    lr: float = 1e-4,
    nvme_path: str | None = None,
    nvme_buffer_size: int = 100_000_000,
    out: pathlib.Path | None = None,
    check: bool = True,
    hf: bool = False,
    console: Console | None = None,
) -> tuple[pathlib.Path, dict[str, Any], list[str]]:
    """Build, check on the cluster and write the config; (path, config, notes)."""
    console = console or Console(stderr=True)
    if precision not in PRECISIONS:
        raise DsclusterError(f"--precision {precision} is unknown; use {', '.join(PRECISIONS)}")
    paths = storage.inventory_paths(inv)
    degraded = read_degraded(inv)
    facts = load_facts(inv, exclude=degraded)
    hosts = [f.host for f in facts]
    world_size = sum(f.slots for f in facts)
    auto_precision, why = precision_for(facts)
    chosen = auto_precision if precision == "auto" else precision
    accelerator = facts[0].accelerator
    nvme = ""
    if offload == "nvme":
        nvme = (nvme_path or paths.scratch_dir).rstrip("/") or "/"
        check_nvme_path(nvme, paths)
    config = build_config(
        zero=zero,
        offload=offload,
        precision=chosen,
        accelerator=accelerator,
        world_size=world_size,
        paths=paths,
        nvme_path=nvme,
        micro_batch=micro_batch,
        grad_accum=grad_accum,
        lr=lr,
        nvme_buffer_size=nvme_buffer_size,
        hf=hf,
    )
    notes = [
        f"{len(hosts)} nodes, {world_size} ranks, {accelerator}; precision {chosen}"
        + (f" ({why})" if precision == "auto" else " (--precision)"),
        f"storage {paths.kind}: checkpoints in {paths.checkpoint_dir}"
        + (" (one shared directory)" if paths.shared else " (node-local, use_node_local_storage)"),
    ]
    if hf:
        notes.append(
            'HF Trainer form: batch, clipping, optimizer, scheduler and precision are "auto"; '
            f"pass --deepspeed <this file>{' --' + chosen if chosen != 'fp32' else ''} and your "
            "batch and learning-rate arguments to the Trainer"
        )
    if check:
        results = check_on_cluster(
            inv, config, hosts=hosts, world_size=world_size, nvme_path=nvme, console=console
        )
        problems, more = judge(
            results,
            hosts=hosts,
            head=inv.head,
            offload=offload,
            precision=chosen,
            precision_auto=precision == "auto",
            locked=locked_bytes(config),
            buffer_size=nvme_buffer_size,
        )
        if problems:
            raise DsclusterError(
                f"{len(problems)} problem(s), nothing written: " + " | ".join(problems)
            )
        notes += more
    target = out or default_out(inv, zero, offload, hf=hf)
    atomic_write(target, json.dumps(config, indent=2, allow_nan=False) + "\n")
    return target, config, notes

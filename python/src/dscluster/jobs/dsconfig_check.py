#!/usr/bin/env python3
"""Check a DeepSpeed config on one node with the cluster's own DeepSpeed (run by
playbooks/dsconfig.yml through the cluster venv, as the training user).

    dsconfig_check.py --config FILE --world-size N [--nvme-path DIR] [--validate]
                      [--memlock-hosts h1,h2]

Prints one JSON object:
  nvme:      {"path", "exists", "is_dir", "writable", "free_bytes", "error"} (with --nvme-path)
  async_io:  {"installed", "usable", "error"} (with --nvme-path: NVMe offload swaps through it)
  validate:  (with --validate, on the head) DeepSpeed's own DeepSpeedConfig over the file with
             the cluster's data-parallel world size: {"ok", "error", "zero_stage",
             "train_batch_size", "micro_batch", "grad_accum", "bf16", "fp16",
             "offload_optimizer", "offload_param", "aio", "use_node_local_storage",
             "bf16_supported", "auto_filled"}; a config in the HF Trainer's form ("auto"
             values, `dscluster dsconfig --hf`) is checked with the values the Trainer would
             put there (hf_auto_values), the keys filled listed in auto_filled
  memlock:   (with --memlock-hosts, on the head) `ulimit -l` each host gives a session opened
             the way DeepSpeed's launcher opens ranks (pdsh -R ssh as the training user), in
             bytes, -1 for unlimited: {"bytes": {host: n}, "errors": {host: text}}
Exit 0 whenever the JSON was printed; the controller judges it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def nvme_state(path: str) -> dict:
    state = {"path": path, "exists": os.path.exists(path), "is_dir": os.path.isdir(path)}
    state["writable"] = False
    state["free_bytes"] = None
    state["error"] = ""
    if state["is_dir"]:
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".dscluster-dsconfig-") as fh:
                fh.write(b"x" * 4096)
                fh.flush()
            state["writable"] = True
        except OSError as exc:
            state["error"] = f"cannot write there: {exc.strerror}"
        state["free_bytes"] = shutil.disk_usage(path).free
    elif state["exists"]:
        state["error"] = "not a directory"
    else:
        state["error"] = "does not exist"
    return state


def async_io_state() -> dict:
    """Whether DeepSpeed's pre-built async_io op loads here (importing the built module runs
    the dynamic loader, so a missing libaio shows; nothing is compiled)."""
    try:
        from deepspeed.git_version_info import installed_ops  # noqa: PLC0415
    except Exception as exc:
        return {"installed": False, "usable": False, "error": f"deepspeed: {exc}"}
    try:
        from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

        accel = get_accelerator()
    except Exception as exc:
        return {"installed": False, "usable": False, "error": f"deepspeed: {exc}"}
    # On CPU the op resolves its pinned-memory manager from the pin_memory op, which its
    # builder loads first; both must be pre-built or load() would JIT-compile.
    needed = ["async_io"] + (["pin_memory"] if accel.device_name() == "cpu" else [])
    missing = [op for op in needed if not installed_ops.get(op)]
    if missing:
        return {
            "installed": False,
            "usable": False,
            "error": f"the DeepSpeed build has no pre-built {', '.join(missing)} op",
        }
    try:
        accel.create_op_builder("AsyncIOBuilder").load(verbose=False)
    except Exception as exc:
        return {"installed": True, "usable": False, "error": str(exc).splitlines()[0][:300]}
    return {"installed": True, "usable": True, "error": ""}


def memlock(hosts: list[str], timeout: int = 10) -> dict:
    """Locked-memory limits of rank sessions on each host (NVMe offload locks its buffers)."""
    if shutil.which("pdsh") is None:
        return {"bytes": {}, "errors": {h: "pdsh is not installed on the head" for h in hosts}}
    argv = ["pdsh", "-S", "-R", "ssh", "-t", str(timeout), "-u", str(timeout * 2)]
    argv += ["-w", ",".join(hosts), "echo memlock=$(ulimit -l)"]
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout * 3 + 10,
            env=dict(os.environ, PDSH_RCMD_TYPE="ssh"),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"bytes": {}, "errors": {h: "pdsh timed out" for h in hosts}}
    found: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        if m := re.match(r"^(\S+): memlock=(\S+)$", line.strip()):
            found[m[1]] = -1 if m[2] == "unlimited" else int(m[2]) * 1024
    errors = {}
    for host in hosts:
        if host not in found:
            lines = [ln for ln in proc.stderr.splitlines() if host in ln]
            errors[host] = (lines[0] if lines else "no answer through pdsh")[:200]
    return {"bytes": found, "errors": errors}


# What transformers' HfTrainerDeepSpeedConfig puts where a config says "auto"
# (trainer_config_process / trainer_config_finalize), for TrainingArguments' defaults but the
# batch: per-device batch 1, no accumulation (dscluster dsconfig's own defaults); the
# model-size values (ZeRO-3 buckets) for a hidden size of HF_HIDDEN_SIZE; the scheduler's
# total steps, which the Trainer computes from the data, HF_TOTAL_STEPS.
HF_HIDDEN_SIZE = 1024
HF_TOTAL_STEPS = 1000


def hf_auto_values(world_size: int, micro_batch: int = 1, grad_accum: int = 1) -> dict:
    """Dotted key -> the value the Trainer fills for "auto" (defaults as above)."""
    lr, hidden = 5e-5, HF_HIDDEN_SIZE
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": world_size * micro_batch * grad_accum,
        "gradient_clipping": 1.0,
        "optimizer.params.lr": lr,
        "optimizer.params.betas": [0.9, 0.999],
        "optimizer.params.eps": 1e-8,
        "optimizer.params.weight_decay": 0.0,
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": lr,
        "scheduler.params.warmup_num_steps": 0,
        "scheduler.params.total_num_steps": HF_TOTAL_STEPS,
        "fp16.enabled": False,
        "bf16.enabled": False,
        "amp.enabled": False,
        "amp.opt_level": "O1",
        "zero_optimization.reduce_bucket_size": hidden * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
    }


def fill_auto(config: dict, values: dict) -> tuple[dict, list[str], list[str]]:
    """(a copy with every "auto" the Trainer fills replaced from `values`, the dotted keys
    filled, the dotted keys left "auto" that the Trainer does not fill)."""
    filled: list[str] = []
    unknown: list[str] = []

    def walk(node, prefix: str):
        if isinstance(node, dict):
            return {k: walk(v, f"{prefix}{k}.") for k, v in node.items()}
        key = prefix[:-1]
        if node == "auto":
            if key in values:
                filled.append(key)
                return values[key]
            unknown.append(key)
        return node

    return walk(config, ""), filled, unknown


class _DataParallel:
    """The one thing DeepSpeedConfig asks an mpu: the data-parallel world size."""

    def __init__(self, world_size: int):
        self.world_size = world_size

    def get_data_parallel_world_size(self) -> int:
        return self.world_size


def validate(config_path: str, world_size: int) -> dict:
    import io  # noqa: PLC0415
    from contextlib import redirect_stdout  # noqa: PLC0415

    out: dict = {"ok": False, "error": ""}
    # DeepSpeed logs to stdout on import and while parsing; keep stdout one JSON document.
    with redirect_stdout(io.StringIO()):
        try:
            import deepspeed  # noqa: PLC0415
            import torch  # noqa: PLC0415
            import torch.distributed as tdist  # noqa: PLC0415
            from deepspeed.runtime.config import DeepSpeedConfig  # noqa: PLC0415

            # DeepSpeedConfig asks the mpu for the world size only inside an initialized
            # process group: a one-process gloo group over an in-memory store (no network).
            if not tdist.is_initialized():
                tdist.init_process_group(
                    backend="gloo", store=tdist.HashStore(), rank=0, world_size=1
                )
            deepspeed.init_distributed(dist_backend="gloo")
            with open(config_path) as fh:
                raw = json.load(fh)
            config, filled, unknown = fill_auto(raw, hf_auto_values(world_size))
            if unknown:
                out["error"] = (
                    f'{", ".join(unknown)} "auto": the HF Trainer fills no such key; give a value'
                )
                return out
            out["auto_filled"] = filled
            cfg = DeepSpeedConfig(config, mpu=_DataParallel(world_size))
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            return out
        zero = cfg.zero_config
        opt = zero.offload_optimizer
        par = zero.offload_param
        out.update(
            ok=True,
            zero_stage=int(cfg.zero_optimization_stage),
            train_batch_size=cfg.train_batch_size,
            micro_batch=cfg.train_micro_batch_size_per_gpu,
            grad_accum=cfg.gradient_accumulation_steps,
            bf16=bool(cfg.bfloat16_config.enabled),
            fp16=bool(cfg.float16_config.enabled),
            offload_optimizer=str(opt.device) if opt is not None else "none",
            offload_param=str(par.device) if par is not None else "none",
            aio=dict(cfg.aio_config),
            use_node_local_storage=bool(cfg.use_node_local_storage),
            tag_validation_fail=bool(cfg.checkpoint_tag_validation_fail),
        )
        try:
            from deepspeed.accelerator import get_accelerator  # noqa: PLC0415

            accel = get_accelerator()
            out["accelerator"] = accel.device_name()
            out["bf16_supported"] = bool(accel.is_bf16_supported())
            out["fp16_supported"] = bool(accel.is_fp16_supported())
        except Exception as exc:
            out["accelerator_error"] = str(exc)[:200]
        out["torch"] = torch.__version__
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--nvme-path", default="")
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--memlock-hosts", default="")
    args = parser.parse_args(argv)
    result: dict = {"user": os.environ.get("USER") or str(os.getuid())}
    if args.nvme_path:
        result["nvme"] = nvme_state(args.nvme_path)
        result["async_io"] = async_io_state()
    if args.validate:
        result["validate"] = validate(args.config, args.world_size)
    if args.memlock_hosts:
        result["memlock"] = memlock([h for h in args.memlock_hosts.split(",") if h])
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

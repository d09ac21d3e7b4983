"""The smoke job's checks: its configuration matrix and DeepSpeed configs, what each node can
run (async_io, the NVMe directory), what a configuration must show to pass, and the straggler
rules on bandwidth.

Staged beside smoke_job.py and imported there as a top-level module; stdlib only (torch and
deepspeed are passed in). dscluster imports the rules from here too (dscluster.smoke.stragglers
reports what they name), as dscluster.jobs.smoke_checks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import statistics
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

# --- pure: the configuration matrix -----------------------------------------------------------


def config_name(stage: int, offload: str) -> str:
    return f"zero{stage}" + ("" if offload == "none" else f"+{offload}")


def plan_configs(stages: list[int], offload: str, aio: dict[str, dict] | None = None) -> list[dict]:
    """The configurations to run, in order, each {name, zero_stage, offload, skip}.

    Each stage runs without offload; with --offload it runs again with the offload where
    DeepSpeed allows it, else it is listed with `skip` saying why:
    - any offload needs ZeRO (stage >= 1): stage 0 has no ZeRO optimizer to offload from;
    - NVMe needs ZeRO-3: only stage 3 swaps optimizer state and parameters to NVMe
      (deepspeed/runtime/zero/stage3.py `_configure_tensor_swapping`); the stage 1/2
      optimizer takes device "nvme" as plain CPU offload (stage_1_and_2.py `cpu_offload`),
      and `offload_param` is ZeRO-3 only;
    - NVMe needs the async_io op usable on every node: aio maps host -> {usable, reason}.
    """
    configs = []
    for stage in stages:
        configs.append({"name": config_name(stage, "none"), "zero_stage": stage, "offload": "none"})
        if offload == "none":
            continue
        skip = ""
        if stage == 0:
            skip = f"{offload} offload needs ZeRO stage 1, 2 or 3"
        elif offload == "nvme" and stage != 3:
            skip = (
                "NVMe offload needs ZeRO-3 (DeepSpeed's stage 1/2 optimizer treats device "
                "nvme as cpu; offload_param is ZeRO-3 only)"
            )
        elif offload == "nvme":
            skip = async_io_skip(aio)
        entry = {"name": config_name(stage, offload), "zero_stage": stage, "offload": offload}
        if skip:
            entry["skip"] = skip
        configs.append(entry)
    return configs


def file_entry(path: str, config: dict) -> dict:
    """The one configuration of a --ds-config run, named after the file."""
    zero = config.get("zero_optimization") or {}
    keys = ("offload_optimizer", "offload_param")
    devices = {(zero.get(key) or {}).get("device", "none") for key in keys}
    offload = "nvme" if "nvme" in devices else "cpu" if "cpu" in devices else "none"
    return {
        "name": os.path.basename(path),
        "zero_stage": int(zero.get("stage", 0)),
        "offload": offload,
        "config": config,
    }


def with_nvme_dir(config: dict, nvme_dir: str) -> dict:
    """A copy of config whose NVMe offload swaps under nvme_dir (one directory per run)."""
    out = json.loads(json.dumps(config))
    zero = out.get("zero_optimization") or {}
    for key in ("offload_optimizer", "offload_param"):
        if (zero.get(key) or {}).get("device") == "nvme":
            zero[key]["nvme_path"] = nvme_dir
    return out


def async_io_skip(aio: dict[str, dict] | None) -> str:
    """Why NVMe offload cannot run ('' when async_io is usable on every node); nodes that
    fail for the same reason are named together."""
    if not aio:
        return "async_io op state unknown on the nodes"
    by_reason: dict[str, list[str]] = {}
    for host, state in aio.items():
        if not state.get("usable"):
            by_reason.setdefault(state.get("reason") or "unknown", []).append(host)
    return "; ".join(
        f"async_io op not usable on {', '.join(hosts)}: {reason}"
        for reason, hosts in by_reason.items()
    )


def ds_config(stage: int, offload: str, nvme_dir: str, *, bf16: bool) -> dict:
    """The DeepSpeed config of one configuration (small buffers: the model is tiny)."""
    zero: dict = {"stage": stage}
    if stage == 3:
        # Partition every parameter (the default keeps tensors below 1e5 elements whole,
        # which is all of this model's).
        zero["stage3_param_persistence_threshold"] = 0
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        if stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    elif offload == "nvme":
        zero["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": nvme_dir,
            "pin_memory": False,
            "buffer_count": 4,
        }
        zero["offload_param"] = {
            "device": "nvme",
            "nvme_path": nvme_dir,
            "pin_memory": False,
            "buffer_count": 5,
            "buffer_size": 1 << 16,  # >= the largest parameter (256 x 256); under memlock
            "max_in_cpu": 0,
        }
    config = {
        "train_micro_batch_size_per_gpu": 32,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-3}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if bf16:
        config["bf16"] = {"enabled": True}
    return config


def node_leaders(hosts_by_rank: list[str]) -> tuple[list[str], list[int]]:
    """(hosts in order of their first rank, the lowest rank on each)."""
    hosts: list[str] = []
    leaders: list[int] = []
    for rank, host in enumerate(hosts_by_rank):
        if host not in hosts:
            hosts.append(host)
            leaders.append(rank)
    return hosts, leaders


def config_checks(ranks: list[dict], world: int, *, checkpoint: bool) -> dict[str, bool]:
    """What one configuration must show, from every rank's summary (run_config's): all ranks
    reported, the loss fell on each, their parameter checksums agree, and (with checkpoint)
    each got its weights back from the checkpoint."""
    checks = {
        "all_ranks_reported": len(ranks) == world,
        "loss_decreased_on_every_rank": all(r["loss_decreased"] for r in ranks),
        "checksums_agree": len({r["checksum"] for r in ranks}) == 1,
    }
    if checkpoint:
        checks["checkpoint_restored_on_every_rank"] = all(
            (r.get("checkpoint") or {}).get("restored") for r in ranks
        )
    return checks


# --- the node's own: async_io, the NVMe directory ---------------------------------------------


def async_io_state(accel, installed_ops: dict, built_for: str) -> dict:
    """Whether this node can run DeepSpeed's async_io op without compiling it at launch
    (DeepSpeed JIT-compiles an op not pre-built for this accelerator: minutes per node)."""
    try:
        builder = accel.create_op_builder("AsyncIOBuilder")
    except Exception as exc:  # an accelerator without the op
        builder, why = None, f": {exc}"
    else:
        why = ""
    if builder is None or getattr(builder, "name", "") != "async_io":
        return {"usable": False, "reason": f"no async_io op for {accel.device_name()}{why}"}
    if not installed_ops.get("async_io") or built_for != accel._name:
        compatible = builder.is_compatible(verbose=False)
        return {
            "usable": False,
            "reason": f"async_io is not pre-built for {accel._name} in the installed DeepSpeed"
            + (
                " (libaio is present: build the wheel with DS_BUILD_AIO=1)"
                if compatible
                else " and libaio-dev is missing"
            ),
        }
    try:
        builder.load(verbose=False)
    except Exception as exc:
        return {"usable": False, "reason": f"pre-built async_io fails to load: {exc}"[:300]}
    return {"usable": True, "reason": "pre-built"}


def private_dir(path: str) -> None:
    """Make `path` this user's own (0700) where it is missing; refuse one that is a link or
    another user's: the default lies in a /tmp every local user can write to first."""
    parent = os.path.dirname(path.rstrip("/"))
    if parent:
        os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    link = stat.S_ISLNK(st.st_mode)
    if link or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        what = "a symbolic link" if link else f"not a directory of this user's (uid {st.st_uid})"
        raise SystemExit(
            f"--nvme-dir {path} is {what}; remove it or pass --nvme-dir with a directory of "
            "your own"
        )


# --- pure: the straggler rules on bandwidth ---------------------------------------------------


RECHECK_WINDOW_S = 1.0  # how long each direction is measured again, at most
RECHECK_BUDGET_S = 10.0  # ... and all of them together, however many
RECHECK_MAX_ITERS = 1024


def measured(gbps: list[list[float | None]]) -> list[tuple[int, int, float]]:
    """Every measured direction of a node x node matrix: (i, j, GB/s from node i to node j)."""
    return [(i, j, v) for i, row in enumerate(gbps) for j, v in enumerate(row) if i != j and v]


def suspects(gbps: list[list[float | None]], factor: float) -> list[tuple[int, int]]:
    """The directions below the fastest / factor. Whatever dscluster's straggler rules can
    name has such a direction (a slow link's slower one, a slow node's own); exactly at the
    boundary is not one, as there."""
    directions = measured(gbps)
    fastest = max((v for _, _, v in directions), default=0.0)
    return [(i, j) for i, j, v in directions if v < fastest / factor]


def link_bandwidths(
    hosts: Sequence[Hashable], gbps: Sequence[Sequence[float | None]]
) -> dict[tuple[Any, Any], float]:
    """Each measured link's bandwidth: the slower of its two directions (gbps[i][j] is
    node i -> node j). A link with a direction not measured is left out."""

    def at(i: int, j: int) -> float | None:
        return gbps[i][j] if i < len(gbps) and j < len(gbps[i]) else None

    links = {}
    for i, a in enumerate(hosts):
        for j in range(i + 1, len(hosts)):
            there, back = at(i, j), at(j, i)
            if there is not None and back is not None:
                links[(a, hosts[j])] = min(there, back)
    return links


class SlowBandwidth(NamedTuple):
    """What the bandwidth rules name (bandwidth_stragglers), with the medians they used."""

    nodes: list[tuple[Any, float]]  # (host, its median link GB/s)
    node_median: float
    links: list[tuple[tuple[Any, Any], float]]  # ((host, host), the link's GB/s)
    link_median: float


def bandwidth_stragglers(
    hosts: Sequence[Hashable], gbps: Sequence[Sequence[float | None]], factor: float
) -> SlowBandwidth:
    """The straggler rules on bandwidth (dscluster.smoke.stragglers.find_stragglers reports
    what they name; the job asks them before measuring again):

    - a node whose median link bandwidth is below the median of the nodes' medians / factor;
    - a link whose bandwidth is below the median link bandwidth / factor, unless one of its
      nodes is a bandwidth straggler already (that node's line names the cause: one slow
      NIC slows every link it is on, and those are not reported once more each).
    Exactly at the threshold is not a straggler. With two nodes every measure is shared by
    both (one link): nothing is named."""
    links = link_bandwidths(hosts, gbps)
    if not links:
        return SlowBandwidth([], 0.0, [], 0.0)
    per_node = {
        host: statistics.median(bw for pair, bw in links.items() if host in pair)
        for host in hosts
        if any(host in pair for pair in links)
    }
    node_median = statistics.median(per_node.values())
    nodes = [(host, bw) for host, bw in per_node.items() if bw < node_median / factor]
    explained = {host for host, _ in nodes}
    link_median = statistics.median(links.values())
    slow_links = [
        (pair, bw)
        for pair, bw in links.items()
        if bw < link_median / factor and not explained & set(pair)
    ]
    return SlowBandwidth(nodes, node_median, slow_links, link_median)


def recheck_plan(
    gbps: list[list[float | None]],
    *,
    factor: float,
    nbytes: int,
    iters: int,
    window_s: float = RECHECK_WINDOW_S,
    budget_s: float = RECHECK_BUDGET_S,
) -> list[tuple[int, int, int]]:
    """What to measure again before any direction is called slow: (i, j, timed messages).

    A pass measures a direction for a few milliseconds (5 messages of 8 MiB); on a shared,
    busy host both passes can land in moments when a rank waits for a core. Nothing to do
    while the straggler rules name nothing (bandwidth_stragglers): measuring again only
    raises figures, and the report names only what they name. A direction below the fastest
    / factor alone (a suspect) is not enough: about one 3-node run in five on a 2-core host
    had one with nothing to name, and its recheck cost the job some 10 CPU-seconds of
    full-speed messages. Otherwise every direction is measured again (the suspects
    and the ones they are compared with, alike: the best of more messages is faster, so
    the suspects alone would be judged against shorter measurements), each with as many
    messages as fill the same time at the speed it showed: `window_s`, or `budget_s` shared
    among them (at least `iters`, at most RECHECK_MAX_ITERS). A rate-limited direction is slow
    in every message and costs `iters` of them. Every rank computes the same plan from the
    same gathered matrix (the ranks must agree on it)."""
    slow = bandwidth_stragglers(range(len(gbps)), gbps, factor)
    if not (slow.nodes or slow.links):
        return []
    directions = measured(gbps)
    window = min(window_s, budget_s / len(directions))
    return [
        (i, j, max(iters, min(RECHECK_MAX_ITERS, math.ceil(window * v * 1e9 / nbytes))))
        for i, j, v in directions
    ]


def faster_pass(
    first: list[list[float | None]], second: list[list[float | None]]
) -> list[list[float | None]]:
    """Each direction's faster of two passes (GB/s, None where a pass did not measure it).

    The passes are minutes apart (the training configurations run between them): a link
    slowed for a while by other work on a shared host is fast in one of them, a slow link
    (a bad cable, a rate limit, the wrong NIC) is slow in both."""
    return [
        [
            max((v for v in (a, b) if v is not None), default=None)
            for a, b in zip(ra, rb, strict=True)
        ]
        for ra, rb in zip(first, second, strict=True)
    ]

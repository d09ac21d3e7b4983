"""Slurm as an inventory source: `dscluster inventory slurm`.

It runs inside an allocation (salloc / sbatch) or takes --nodelist: the node list
(`gpu-[001-004,010],cpu7`) is checked (names, brackets, at most validate.MAX_NODES
nodes, before expanding) and expanded with python-hostlist (Slurm's own `scontrol show
hostnames` where no list is given but scontrol is there), slots per node come from what
Slurm says about the allocation, and the cluster (head = the first node) is described for
`inventories/<name>/hosts.yml` + `hostfile` (`describe_allocation`, in sources.describe).

The pure parts (`expand_nodelist`, `parse_cpus_per_node`, `slots_from_env`) do no I/O, so
tests and scripts/bench_nodelist.py call them directly. Batch scripts are a job, not a
source: dscluster/sbatch.py.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import hostlist

from ..errors import DsclusterError
from ..hostfile import SLOTS_RULE
from ..text import show
from ..validate import MAX_NODES, MAX_SLOTS, check_out_dir
from . import static
from .cluster import Cluster
from .names import check_host_name, check_inventory_name

# One item of SLURM_JOB_CPUS_PER_NODE / SLURM_TASKS_PER_NODE: `72`, or `36(x2)` (two nodes).
CPUS_ITEM_RE = re.compile(r"(?P<count>[0-9]{1,9})(?:\(x(?P<repeat>[0-9]{1,12})\))?")
POSINT_RE = re.compile(r"[0-9]{1,9}")

# ---- Node lists and slots (pure) ---------------------------------------------------------


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed node list -> host names, in Slurm's order, with python-hostlist.

    `gpu-[001-004,010],cpu7` -> gpu-001 … gpu-004, gpu-010, cpu7. A repeated node is an error
    (Slurm never lists one twice; a hand-written --nodelist might); so is a list of more than
    validate.MAX_NODES nodes (refused before it is expanded).
    """
    if not (nodelist or "").strip():
        raise DsclusterError(
            "the node list is empty; run inside an allocation (salloc/sbatch) or pass --nodelist"
        )
    text = static.check_one_line(nodelist, "node list").strip()
    parts = static.split_top_level(text, "node list")
    if not all(parts):
        raise DsclusterError(
            f"node list {show(text)} has an empty entry; pass it as Slurm prints it, "
            "e.g. gpu-[001-004,010],cpu7"
        )
    nodes = [n for group in static.expand_list(parts, text, "node list") for n in group]
    seen: set[str] = set()
    for node in nodes:
        check_host_name(node)
        if node in seen:
            raise DsclusterError(
                f"node {node} appears twice in node list {show(text)}; list it once"
            )
        seen.add(node)
    return nodes


def parse_counts(value: str, variable: str = "SLURM_JOB_CPUS_PER_NODE") -> list[int]:
    """Slurm's per-node count format (SLURM_JOB_CPUS_PER_NODE, SLURM_TASKS_PER_NODE):
    `2(x3),1` -> [2, 2, 2, 1]; more than validate.MAX_NODES nodes refused before expanding."""
    items: list[tuple[int, int]] = []
    for item in (value or "").split(","):
        m = CPUS_ITEM_RE.fullmatch(item.strip())
        if not m or (m["repeat"] is not None and int(m["repeat"]) == 0):
            raise DsclusterError(
                f"cannot read per-node counts {variable}={show(value)}: {show(item)} is not "
                "N or N(xM); pass --slots instead"
            )
        items.append((int(m["count"]), int(m["repeat"] or 1)))
    if sum(repeat for _, repeat in items) > MAX_NODES:
        raise DsclusterError(
            f"{variable}={show(value)} describes more than {MAX_NODES} nodes, the most one "
            "inventory holds; pass --slots N and a shorter --nodelist"
        )
    return [count for count, repeat in items for _ in range(repeat)]


def parse_cpus_per_node(value: str) -> list[int]:
    """SLURM_JOB_CPUS_PER_NODE: `2(x3),1` -> [2, 2, 2, 1] (see parse_counts)."""
    return parse_counts(value, "SLURM_JOB_CPUS_PER_NODE")


def gpu_count(value: str, variable: str = "SLURM_GPUS_PER_NODE") -> int:
    """GPUs in SLURM_GPUS_PER_NODE / gres form: `4`, `a100:4`, `gpu:a100:4`, `a100:2,v100:2`."""
    total = 0
    for item in value.split(","):
        # gres may carry an index suffix: gpu:a100:4(IDX:0-3)
        last = item.split("(")[0].strip().split(":")[-1]
        if not POSINT_RE.fullmatch(last):
            raise DsclusterError(
                f"cannot read a GPU count from {variable}={show(value)}; pass --slots instead"
            )
        total += int(last)
    return total


def _positive(env: Mapping[str, str], key: str) -> int | None:
    """A count Slurm set: None when unset, empty or 0; anything but a whole number refused."""
    value = env.get(key, "").strip()
    if not value:
        return None
    if not POSINT_RE.fullmatch(value):
        raise DsclusterError(
            f"{key}={show(value)} is not a whole number of slots per node; fix the variable "
            "or pass --slots N"
        )
    return int(value) or None


def _bounded(counts: list[int], variable: str, raw: str) -> list[int]:
    if counts and max(counts) > MAX_SLOTS:
        raise DsclusterError(
            f"{variable}={show(raw)} gives a node {max(counts)} slots; {SLOTS_RULE}: pass --slots N"
        )
    return counts


def slots_and_source(env: Mapping[str, str], nodes: Sequence[str]) -> tuple[list[int], str]:
    """Slots per node from Slurm's environment, and the variable they came from.

    GPUs first (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, SLURM_GPUS_PER_NODE), then tasks per
    node, then CPUs per node (SLURM_JOB_CPUS_PER_NODE, heterogeneous where Slurm says so),
    else one slot per node. Each count is checked (1..validate.MAX_SLOTS) naming its variable.
    """
    counts, source = _slots_and_source(env, nodes)
    return _bounded(counts, source, env.get(source, "")), source


def _slots_and_source(env: Mapping[str, str], nodes: Sequence[str]) -> tuple[list[int], str]:
    count = len(nodes)
    if n := _positive(env, "SLURM_GPUS_ON_NODE"):
        return [n] * count, "SLURM_GPUS_ON_NODE"
    job_gpus = env.get("SLURM_JOB_GPUS", "").strip()
    if job_gpus:
        ids = [g for g in job_gpus.split(",") if g.strip()]
        if ids:
            return [len(ids)] * count, "SLURM_JOB_GPUS"
    per_node = env.get("SLURM_GPUS_PER_NODE", "").strip()
    if per_node and (gpus := gpu_count(per_node)) > 0:
        return [gpus] * count, "SLURM_GPUS_PER_NODE"
    if tasks := _positive(env, "SLURM_NTASKS_PER_NODE"):
        return [tasks] * count, "SLURM_NTASKS_PER_NODE"
    cpus = env.get("SLURM_JOB_CPUS_PER_NODE", "").strip()
    if cpus:
        per = parse_cpus_per_node(cpus)
        if len(per) != count:
            raise DsclusterError(
                f"SLURM_JOB_CPUS_PER_NODE={cpus} describes {len(per)} nodes but the node list "
                f"has {count}; pass --slots N"
            )
        if min(per) < 1:
            raise DsclusterError(
                f"SLURM_JOB_CPUS_PER_NODE={cpus} gives a node 0 CPUs; pass --slots"
            )
        return per, "SLURM_JOB_CPUS_PER_NODE"
    return [1] * count, "default"


def slots_from_env(env: Mapping[str, str], nodes: Sequence[str]) -> list[int]:
    """Slots per node (one entry per node, in order); see slots_and_source."""
    return slots_and_source(env, nodes)[0]


def nodelist_from_env(env: Mapping[str, str]) -> str | None:
    return env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or None


# ---- dscluster inventory slurm -----------------------------------------------------------


def scontrol_hostnames(nodelist: str | None) -> list[str]:
    """Slurm's own expansion (`scontrol show hostnames`), where scontrol is installed."""
    scontrol = shutil.which("scontrol")
    if not scontrol:
        raise DsclusterError("scontrol is not installed")
    argv = [scontrol, "show", "hostnames", *([nodelist] if nodelist else [])]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DsclusterError(f"'scontrol show hostnames' failed: {exc}") from exc
    hosts = proc.stdout.split()
    if proc.returncode != 0 or not hosts:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise DsclusterError(f"'scontrol show hostnames' failed: {last}")
    return hosts


def discover_nodes(nodelist: str | None, env: Mapping[str, str]) -> list[str]:
    """--nodelist, else SLURM_JOB_NODELIST/SLURM_NODELIST, else `scontrol show hostnames`."""
    text = nodelist or nodelist_from_env(env)
    if text:
        # Refused here, never handed to scontrol: a list these rules refuse cannot go in a
        # hostfile or a pdsh list anyway.
        return expand_nodelist(text)
    if shutil.which("scontrol"):
        try:
            return scontrol_hostnames(None)
        except DsclusterError:
            pass
    raise DsclusterError(
        "no Slurm node list: run inside an allocation (salloc or sbatch) or pass "
        "--nodelist 'gpu-[001-004]'"
    )


def slurm_spec(
    name: str,
    *,
    nodes: list[str],
    slots: list[int],
    source: str,
    env: Mapping[str, str],
    ssh: Mapping[str, Any],
) -> static.ClusterSpec:
    all_vars: dict[str, Any] = {}
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job_id:
        all_vars["dscluster_slurm_job_id"] = str(job_id)
    all_vars.update(ssh)
    return static.ClusterSpec(
        name=name,
        source="slurm",
        entries=list(zip(nodes, slots, strict=True)),
        all_vars=all_vars,
        # GPU counts are detected on the nodes; CPU slot counts must be configured.
        cpu_slots="GPU" not in source,
    )


@dataclasses.dataclass(frozen=True)
class Allocation:
    """What the Slurm source learnt beyond the inventory (Cluster.found)."""

    nodes: list[str]
    slots: list[int]
    slots_source: str  # what the slot counts came from (--slots, SLURM_JOB_GPUS...)


def describe_allocation(
    name: str,
    *,
    nodelist: str | None,
    slots: int | None,
    ssh: static.SshOptions,
    out: pathlib.Path | None,
    env: Mapping[str, str],
) -> Cluster:
    """This source in the route (sources.describe): the allocation's (or `nodelist`'s) nodes
    as a Cluster for inventories/<name> (or `out`), with found = Allocation."""
    check_inventory_name(name)
    if slots is not None and not 1 <= slots <= MAX_SLOTS:
        raise DsclusterError(
            f"--slots {slots} is out of range; use 1 or more (at most {MAX_SLOTS})"
        )
    target = check_out_dir(out or static.default_out(name))
    ssh_vars = ssh.vars()
    nodes = discover_nodes(nodelist, env)
    if slots is not None:
        counts, source = [slots] * len(nodes), "--slots"
    else:
        counts, source = slots_and_source(env, nodes)
    spec = slurm_spec(name, nodes=nodes, slots=counts, source=source, env=env, ssh=ssh_vars)
    job = spec.all_vars.get("dscluster_slurm_job_id")
    header = (
        "---\n"
        f"# Written by `dscluster inventory slurm`{f' in Slurm job {job}' if job else ''}: "
        f"{len(nodes)} nodes\n"
        f"# ({hostlist.collect_hostlist(nodes)}), head {nodes[0]}; slots from {source}.\n"
        "# Host keys are checked (StrictHostKeyChecking=yes): the nodes of a Slurm site usually\n"
        "# know each other already; --known-hosts FILE points UserKnownHostsFile at a file.\n"
    )
    described = static.describe(spec, header)
    return dataclasses.replace(described, out=target, found=Allocation(nodes, counts, source))

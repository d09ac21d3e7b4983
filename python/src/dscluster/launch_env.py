"""The environment every rank gets, derived from the nodes' recorded facts.

PATH and TORCH_EXTENSIONS_DIR from the venv every node recorded alike, PYTHONPYCACHEPREFIX,
and on CPU-only nodes OMP_NUM_THREADS and ACCELERATE_USE_CPU. The communication environment
(NCCL / HCCL / libfabric / gloo) comes from each node's `nccl_env` fact (roles/nccl_env). The
pdsh launcher exports one `.deepspeed_env` to every node, so only keys whose value is the same
on every node go there. A differing `NCCL_*` key is left to each node's /etc/nccl.conf, which
NCCL reads itself; any other differing key (GLOO_*, HCCL_*, FI_*) is left out and reported as
a warning. Pure: launch_files.py writes the result.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from .errors import DsclusterError
from .node_facts import NodeFacts

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _one_path(facts: list[NodeFacts], field: str, variable: str) -> str:
    """A path every node recorded alike; the pdsh launcher exports one value to all."""
    paths = {getattr(f, field) for f in facts}
    if len(paths) != 1:
        raise DsclusterError(
            f"nodes record different {field} paths ({', '.join(sorted(paths))}); the pdsh "
            f"launcher needs one path on every node: set {variable} once for the whole inventory"
        )
    return paths.pop()


def _pycache_dir(facts: list[NodeFacts]) -> tuple[str, str]:
    """The ranks' PYTHONPYCACHEPREFIX when every node recorded the same one ("" when none
    did), and a warning when only some did: each rank then compiles what it imports again."""
    without = [f.host for f in facts if not f.pycache_dir]
    if len(without) == len(facts):
        return "", ""
    if without:
        return "", (
            f"no pycache_dir recorded for {', '.join(without)}: PYTHONPYCACHEPREFIX is left "
            "out, so every rank compiles what it imports again; run 'dscluster provision'"
        )
    return _one_path(facts, "pycache_dir", "ml_stack_pycache_dir"), ""


def _fabric_env(facts: list[NodeFacts]) -> tuple[dict[str, str], list[str]]:
    """The nccl_env keys every node shares, and a warning per other key left out."""
    env: dict[str, str] = {}
    warnings: list[str] = []
    without = [f.host for f in facts if not f.nccl_env]
    if without:
        warnings.append(
            f"no nccl_env fact for {', '.join(without)}: NCCL/gloo settings are exported only "
            "where every node agrees; run 'dscluster provision' so the nccl_env role records it"
        )
    per_node = {
        f.host: {str(k): str(v) for k, v in f.nccl_env.get("env", {}).items()} for f in facts
    }
    for key in sorted({k for node_env in per_node.values() for k in node_env}):
        values = {host: node_env.get(key) for host, node_env in per_node.items()}
        distinct = set(values.values())
        if len(distinct) == 1 and None not in distinct:
            env[key] = str(distinct.pop())
        elif not key.startswith("NCCL_"):
            # NCCL_* keys are in each node's /etc/nccl.conf already; nothing to report.
            shown = ", ".join(
                f"{h}: {v if v is not None else '(unset)'}" for h, v in values.items()
            )
            warnings.append(
                f"{key} differs between nodes ({shown}); left out of .deepspeed_env because the "
                "pdsh launcher exports one value to every node, so each node uses its own default"
            )
    return env, warnings


def omp_threads(facts: list[NodeFacts]) -> int:
    """OMP threads a rank on CPU-only nodes: each machine's cores over the ranks of every node
    on it, the least of them (.deepspeed_env has one value for all), at least 1.

    Nodes that report the same kernel boot id are containers of one machine (a local
    cluster, or containers on one remote Docker host): each sees all of its cores, so its own
    cpus // slots would put cores x nodes threads on them, the idle ones spinning on the
    cores the other nodes' ranks work on (3 local nodes on 2 cores beside other work: a smoke
    job 20 % less node CPU and 11 % sooner with 1 thread a rank than with 2). A node without
    a boot id counts as a machine of its own."""
    machine = {f.host: f.boot_id or f"host {f.host}" for f in facts}
    ranks: collections.Counter[str] = collections.Counter()
    for f in facts:
        ranks[machine[f.host]] += max(1, f.slots)
    return min(max(1, f.cpus // ranks[machine[f.host]]) for f in facts)


def derive_launch_env(
    facts: list[NodeFacts], extra: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The launcher environment every rank gets, from the recorded facts, and warnings."""
    venv = _one_path(facts, "venv", "ml_stack_venv")
    env = {
        "PATH": f"{venv}/bin:{SYSTEM_PATH}",
        "TORCH_EXTENSIONS_DIR": _one_path(
            facts, "torch_extensions_dir", "ml_stack_torch_extensions_dir"
        ),
        "PYTHONUNBUFFERED": "1",
    }
    warnings: list[str] = []
    if any(f.nccl_env for f in facts):
        fabric, warnings = _fabric_env(facts)
        env.update(fabric)
    else:
        # Facts from before the nccl_env role: pin the interface the nodes reach each other on
        # when every node names it alike (gloo and NCCL pick "the first" one by themselves).
        ifaces = {f.interface for f in facts}
        if len(ifaces) == 1 and "" not in ifaces:
            iface = ifaces.pop()
            env["GLOO_SOCKET_IFNAME"] = iface
            env["NCCL_SOCKET_IFNAME"] = iface
    pycache, note = _pycache_dir(facts)
    if pycache:
        env["PYTHONPYCACHEPREFIX"] = pycache
    warnings += [note] if note else []
    kinds = {f.accelerator for f in facts}
    if kinds == {"cpu"}:
        env["OMP_NUM_THREADS"] = str(omp_threads(facts))
        # Accelerate (1.x) makes a process group on CPU-only nodes only when told the run is
        # on CPU: without this, every rank of an Accelerate script or an HF Trainer under
        # torchrun, mpi, srun or `accelerate launch` finds no backend and trains alone at world
        # size 1 (accelerate/state.py: PartialState, _prepare_backend). The deepspeed launcher's
        # ds_rank.sh unsets it again: with it, accelerate switches its DeepSpeed plugin off
        # (AcceleratorState enables DEEPSPEED only `and not cpu`), and an HF Trainer given
        # --deepspeed would train plain DDP without a word.
        env["ACCELERATE_USE_CPU"] = "true"
    if extra:
        env.update(extra)
    return env, warnings


def derive_env(facts: list[NodeFacts], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher environment every rank gets (see derive_launch_env for the warnings)."""
    return derive_launch_env(facts, extra)[0]

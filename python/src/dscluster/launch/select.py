"""Resource selection by DeepSpeed's rules: --include/--exclude/--num-nodes/--num-gpus
(deepspeed/launcher/runner.py: parse_node_config, parse_resource_filter,
parse_inclusion_exclusion, apply_num_nodes_and_gpus), pure.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from ..errors import DsclusterError
from ..validate import MAX_SLOTS


def parse_node_specs(text: str, flag: str) -> dict[str, list[int]]:
    """`NAME[:SLOT[,SLOT ...]][@NAME...]` -> {name: sorted slots}; [] means the whole host.

    As DeepSpeed's parse_node_config_list: a host named twice gets the union of its slots.
    """
    specs: dict[str, list[int]] = collections.defaultdict(list)
    for spec in text.split("@"):
        if not spec.split(":")[0].strip():
            raise DsclusterError(
                f"{flag} {text!r}: a host name is empty; write NAME[:SLOT[,SLOT...]], hosts "
                "joined by '@' (e.g. n1:0,1@n2)"
            )
        if ":" not in spec:
            specs[spec] += []
            continue
        parts = spec.split(":")
        if len(parts) != 2:
            raise DsclusterError(
                f"{flag} {text!r}: {spec!r} has more than one ':'; write NAME[:SLOT[,SLOT...]], "
                "hosts joined by '@'"
            )
        words = parts[1].split(",")
        if not all(w.strip().isascii() and w.strip().isdigit() for w in words):
            raise DsclusterError(
                f"{flag} {text!r}: slots in {spec!r} are not integers (slots count from 0); "
                "write NAME:0,1"
            )
        slots = [int(w) for w in words]
        if max(slots) >= MAX_SLOTS:
            raise DsclusterError(
                f"{flag} {text!r}: slot {max(slots)} is beyond any node ({MAX_SLOTS} slots at "
                "most); slots count from 0, e.g. NAME:0,1"
            )
        specs[parts[0]] += slots
    return {host: sorted(set(slots)) for host, slots in specs.items()}


def select_resources(  # noqa: C901, PLR0912 - mirrors DeepSpeed's runner.parse_inclusion_exclusion step by step
    pool: Mapping[str, int],
    *,
    include: str = "",
    exclude: str = "",
    num_nodes: int | None = None,
    num_gpus: int | None = None,
) -> dict[str, list[int]]:
    """The slots each host runs, in hostfile order, as DeepSpeed's launcher resolves them.

    pool: host -> slots, in hostfile order (head first). Raises DsclusterError, naming the
    host or slot, where DeepSpeed raises ValueError; also where DeepSpeed would go on with
    nothing (everything excluded) or with more ranks than a host has slots (--num-gpus).
    """
    include, exclude = include or "", exclude or ""
    if include and exclude:
        raise DsclusterError("--include and --exclude are mutually exclusive; pass one of them")
    if (include or exclude) and (num_nodes is not None or num_gpus is not None):
        raise DsclusterError(
            "--num-nodes/--num-gpus cannot be combined with --include/--exclude; pass one kind"
        )
    hosts = {host: list(range(slots)) for host, slots in pool.items()}
    flag, text = ("--include", include) if include else ("--exclude", exclude)
    if text:
        chosen: dict[str, list[int]] = {} if include else {h: list(s) for h, s in hosts.items()}
        for host, slots in parse_node_specs(text, flag).items():
            if host not in hosts:
                known = ", ".join(hosts)
                raise DsclusterError(
                    f"{flag} names host {host!r}, which is not in the hostfile ({known})"
                )
            for slot in slots:
                if slot not in hosts[host]:
                    raise DsclusterError(
                        f"{flag} names slot {slot} on {host}, which has slots "
                        f"0-{len(hosts[host]) - 1}; use a slot the host has"
                    )
            if include:
                chosen[host] = slots or list(hosts[host])
            elif slots:
                chosen[host] = [s for s in chosen[host] if s not in slots]
            else:
                chosen[host] = []
        hosts = {h: chosen[h] for h in hosts if chosen.get(h)}
    if num_nodes is not None:
        if num_nodes < 1:
            raise DsclusterError(f"--num-nodes {num_nodes}: run on at least one node")
        hosts = dict(list(hosts.items())[:num_nodes])
    if num_gpus is not None:
        if num_gpus < 1:
            raise DsclusterError(f"--num-gpus {num_gpus}: run at least one rank per node")
        short = [f"{h} ({len(s)})" for h, s in hosts.items() if len(s) < num_gpus]
        if short:
            raise DsclusterError(
                f"--num-gpus {num_gpus} is more than the slots of {', '.join(short)}; "
                "lower it or exclude those hosts"
            )
        hosts = {h: list(range(num_gpus)) for h in hosts}
    if not hosts:
        raise DsclusterError(f"{flag} {text!r} leaves no slot to run on; keep at least one host")
    return hosts

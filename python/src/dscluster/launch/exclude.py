"""`--exclude-unhealthy` on the launch side: the run's own site and request without the nodes
doctor left out (doctor/exclude.py decides which); pure.

The job's own `hostfile` (staged in its job directory, never the inventory's) loses their
lines, and every launcher renders from the site's pool alone: DeepSpeed reads that hostfile,
torchrun and accelerate count its nodes (--nnodes, --num_machines) and start them by name
(pdsh -w), mpirun and gaudi_spawn get their own hostfiles written from it. `.deepspeed_env`
stays as doctor checked it. The user's own filters are read against what is left: an
--include or --exclude naming a node left out drops that node, and --num-nodes N with fewer
than N nodes left refuses the run; so does torchrun's --nnodes MIN:MAX with fewer than MIN
left (with MIN or more, MAX becomes the count left: the elastic job starts on those).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..errors import DsclusterError
from ..hostfile import render_hostfile
from .render import Plan, build_plan
from .request import JobSite, LaunchRequest
from .select import parse_node_specs


def plan_on(site: JobSite, request: LaunchRequest, left_out: Mapping[str, str]) -> Plan:
    """build_plan of `request` on `site` without the hosts of `left_out` (host -> why)."""
    if left_out:
        site = site_without(site, left_out)
        request = request_without(request, site.pool, left_out)
    return build_plan(request, site)


def site_without(site: JobSite, left_out: Mapping[str, str]) -> JobSite:
    """The site with the hosts of `left_out` (host -> the checks it failed) gone."""
    if site.head in left_out:
        raise DsclusterError(
            f"the head {site.head} cannot be left out ({left_out[site.head]}): jobs start "
            "from it; fix it and run again"
        )
    pool = {h: n for h, n in site.pool.items() if h not in left_out}
    return dataclasses.replace(
        site,
        pool=pool,
        accelerators={h: a for h, a in site.accelerators.items() if h in pool},
        hostfile_text=render_hostfile(pool.items()),
    )


def _who(left_out: Mapping[str, str]) -> str:
    return ", ".join(f"{h} ({why})" for h, why in left_out.items())


def request_without(
    request: LaunchRequest, pool: Mapping[str, int], left_out: Mapping[str, str]
) -> LaunchRequest:
    """The request's own filters read against `pool`, the hosts left (module doc)."""
    include = _kept("--include", request.include, left_out)
    exclude = _kept("--exclude", request.exclude, left_out)
    if request.include and not include:
        raise DsclusterError(
            f"--include {request.include!r} names only nodes doctor leaves out "
            f"({_who(left_out)}); nothing is left to run on: include a healthy node or fix them"
        )
    if request.num_nodes is not None and request.num_nodes > len(pool):
        raise DsclusterError(
            f"--num-nodes {request.num_nodes} needs {request.num_nodes} nodes and "
            f"{len(pool)} are left once doctor leaves out {_who(left_out)}; lower --num-nodes "
            "or fix them"
        )
    nnodes = request.nnodes
    if nnodes is not None and nnodes[1] > len(pool):
        low, high = nnodes
        if low > len(pool) or low == high:
            given = str(low) if low == high else f"{low}:{high}"
            raise DsclusterError(
                f"--nnodes {given} needs {low} nodes and {len(pool)} are left once doctor "
                f"leaves out {_who(left_out)}; lower MIN or fix them"
            )
        nnodes = (low, len(pool))
    return dataclasses.replace(request, include=include, exclude=exclude, nnodes=nnodes)


def _kept(flag: str, text: str, left_out: Mapping[str, str]) -> str:
    """A filter without the nodes left out, in DeepSpeed's syntax ("" when none is left)."""
    if not text:
        return ""
    specs = parse_node_specs(text, flag)
    if not any(h in left_out for h in specs):
        return text  # verbatim, as the user wrote it
    return "@".join(
        f"{h}:{','.join(map(str, s))}" if s else h for h, s in specs.items() if h not in left_out
    )

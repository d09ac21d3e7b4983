"""The launch files beside an inventory: `hostfile` and `.deepspeed_env`, derived and written.

From the inventory and the nodes' recorded facts (node_facts.py), leaving out the nodes in
the degraded-nodes record (degraded.py): the hostfile (hostfile.py) and the environment
(launch_env.py, rendered by deepspeed_env.py). Both are rendered and validated before either
is written; `write_launch_files` is the one place that does I/O.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping

from .deepspeed_env import extra_env_texts, render_env
from .degraded import check_degraded, degraded_warning, read_degraded
from .hostfile import render_hostfile
from .inventory import Inventory
from .launch_env import derive_launch_env
from .node_facts import NodeFacts, load_facts
from .storage import inventory_paths
from .util import write_files


@dataclasses.dataclass(frozen=True)
class LaunchFiles:
    hostfile: pathlib.Path
    env_file: pathlib.Path
    facts: list[NodeFacts]
    # One line each: environment keys left out of .deepspeed_env because nodes differ.
    warnings: list[str] = dataclasses.field(default_factory=list)
    # What goes into (or went into) the two files.
    hostfile_text: str = ""
    env_text: str = ""

    def write(self) -> None:
        """Both files as one transaction (util.write_files)."""
        write_files({self.hostfile: self.hostfile_text, self.env_file: self.env_text})

    @property
    def world_size(self) -> int:
        return sum(f.slots for f in self.facts)


def write_launch_files(
    inv: Inventory,
    extra_env: Mapping[str, str] | None = None,
    *,
    excluded: Mapping[str, object] | None = None,
) -> LaunchFiles:
    """Derive and write `hostfile` and `.deepspeed_env` beside the inventory, atomically.

    Nodes recorded in degraded.json (or `excluded`, which replaces that record) are left out,
    with a warning naming them. Both files are rendered and validated before either is
    written, then written as one transaction: on any error nothing changes.
    """
    files = render_launch_files(inv, extra_env, excluded=excluded)
    files.write()
    return files


def render_launch_files(
    inv: Inventory,
    extra_env: Mapping[str, str] | None = None,
    *,
    excluded: Mapping[str, object] | None = None,
) -> LaunchFiles:
    """What write_launch_files writes, rendered and validated, nothing written."""
    if excluded is None:
        excluded = read_degraded(inv)
    excluded = {h: why for h, why in excluded.items() if h in inv.hosts}
    if excluded:
        check_degraded(inv.hosts, inv.head, excluded)
    facts = load_facts(inv, exclude=excluded)
    hostfile_text = render_hostfile((f.host, f.slots) for f in facts)
    # Where a job keeps checkpoints and NVMe swap files (the inventory's path set); a job
    # reads them from its environment. dscluster_extra_env may override them.
    paths = inventory_paths(inv)
    extra = {
        "DSCLUSTER_CHECKPOINT_DIR": paths.checkpoint_dir,
        "DSCLUSTER_SCRATCH_DIR": paths.scratch_dir,
        "DSCLUSTER_SHARED_STORAGE": paths.kind,
    }
    extra.update(
        extra_env_texts(
            inv.var(inv.head, "dscluster_extra_env"), f"dscluster_extra_env in {inv.source}"
        )
    )
    extra.update(extra_env_texts(extra_env, "the extra environment"))
    env, warnings = derive_launch_env(facts, extra)
    env_file_text = render_env(env)
    if excluded:
        warnings = [degraded_warning(inv, excluded), *warnings]
    return LaunchFiles(
        hostfile=inv.directory / "hostfile",
        env_file=inv.directory / ".deepspeed_env",
        facts=facts,
        warnings=warnings,
        hostfile_text=hostfile_text,
        env_text=env_file_text,
    )

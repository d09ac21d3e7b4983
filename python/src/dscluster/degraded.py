"""The degraded-nodes record: nodes a provision run left out (`--allow-degraded`).

A provision run with `--allow-degraded` records the nodes it failed on in
`inventories/<name>/degraded.json`; every hostfile written afterwards leaves them out (and
says so in a warning) until a provision that succeeds on them clears the record.
"""

from __future__ import annotations

import datetime as dt
import json
import pathlib
from collections.abc import Iterable, Mapping, Sequence

from .errors import DsclusterError
from .inventory import Inventory
from .util import atomic_write
from .validate import read_text

DEGRADED_FILE = "degraded.json"


def degraded_path(inv: Inventory) -> pathlib.Path:
    return inv.directory / DEGRADED_FILE


def read_degraded(inv: Inventory) -> dict[str, dict[str, str]]:
    """host -> {"reason", "since"} of the nodes left out of the launch files; {} when none."""
    path = degraded_path(inv)
    if not path.is_file():
        return {}
    try:
        data = json.loads(read_text(path, "degraded-nodes record"))
        excluded = data["excluded"]
        if not isinstance(excluded, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("reason"), str) for v in excluded.values()
        ):
            raise TypeError("'excluded' is not a mapping of host -> {reason, since}")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise DsclusterError(
            f"{path} is not a degraded-nodes record ({exc}); delete it and run "
            "'dscluster provision' again"
        ) from exc
    return {str(host): {str(k): str(v) for k, v in why.items()} for host, why in excluded.items()}


def update_degraded(
    previous: Mapping[str, Mapping[str, str]],
    *,
    failed: Mapping[str, str],
    succeeded: Iterable[str],
    now: str,
) -> dict[str, dict[str, str]]:
    """Pure: the record after a provision run. Nodes that failed now are (re)recorded with
    the reason; nodes it succeeded on leave the record; the others stay as they were."""
    result = {h: dict(v) for h, v in previous.items()}
    for host in succeeded:
        result.pop(host, None)
    for host, reason in failed.items():
        since = result.get(host, {}).get("since", now)
        result[host] = {"reason": reason, "since": since}
    return result


def check_degraded(hosts: Sequence[str], head: str, excluded: Mapping[str, object]) -> None:
    """A degraded cluster still needs its head (it launches every job) and one node."""
    if head in excluded:
        raise DsclusterError(
            f"the head {head} failed ({_reason(excluded[head])}); jobs are launched from it, so "
            "it cannot be left out: fix it and run 'dscluster provision' again"
        )
    if not [h for h in hosts if h not in excluded]:
        raise DsclusterError("every node failed; fix them and run 'dscluster provision' again")


def _reason(why: object) -> str:
    return str(why.get("reason", "")) if isinstance(why, Mapping) else str(why)


def degraded_warning(inv: Inventory, excluded: Mapping[str, object]) -> str:
    """The one warning line naming the nodes left out and how to bring them back."""
    who = "; ".join(f"{host}: {_reason(why)}" for host, why in excluded.items())
    return (
        f"degraded cluster: {', '.join(excluded)} left out of the hostfile and .deepspeed_env "
        f"({who}); recorded in {degraded_path(inv)}; bring the node(s) back and run "
        f"'dscluster provision -i {inv.source}' to include them again"
    )


def write_degraded(inv: Inventory, excluded: Mapping[str, Mapping[str, str]]) -> None:
    """Record the excluded nodes atomically; an empty record removes the file."""
    path = degraded_path(inv)
    if not excluded:
        path.unlink(missing_ok=True)
        return
    data = {
        "excluded": {h: dict(v) for h, v in excluded.items()},
        "note": "nodes left out of hostfile and .deepspeed_env by "
        "'dscluster provision --allow-degraded'; a full provision (site.yml, no --tags) "
        "that succeeds on them clears them",
    }
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

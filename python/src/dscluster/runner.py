"""Drive playbooks through ansible-runner: live progress, a per-host summary, clear failures."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from . import paths
from .errors import DsclusterError
from .inventory import Inventory
from .paths import cache_dir
from .text import squeeze
from .util import atomic_write


@dataclasses.dataclass
class HostSummary:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclasses.dataclass
class PlaybookResult:
    status: str
    rc: int
    hosts: dict[str, HostSummary]
    failures: list[tuple[str, str, str]]  # host, task, message
    # The play's custom stats (set_stats, per_host false): what a play hands the controller
    # without a module run per host; {} when the run ended without its stats.
    artifacts: dict[str, Any] = dataclasses.field(default_factory=dict)

    def handed(self, key: str) -> dict[str, Any]:
        """What the play's hosts handed over under `key` (set_stats, aggregate: one entry per
        host), {} when nothing or not a mapping came back."""
        data = self.artifacts.get(key)
        return data if isinstance(data, dict) else {}

    @property
    def failed_hosts(self) -> list[str]:
        return sorted({h for h, s in self.hosts.items() if s.failed or s.unreachable})

    @property
    def changed_total(self) -> int:
        return sum(s.changed for s in self.hosts.values())


class Progress:
    """Tracks runner events and renders plays/tasks/hosts for rich.Live."""

    def __init__(self, playbook: str, hosts: list[str]) -> None:
        self.playbook = playbook
        self.play = ""
        self.task = ""
        self.tasks_done = 0
        self.hosts = {h: HostSummary() for h in hosts}
        self.current: dict[str, str] = {}
        self.failures: list[tuple[str, str, str]] = []
        self.stats: dict[str, Any] = {}
        # (play, task) -> host -> seconds: what each task cost on each host (the profile).
        self.durations: dict[tuple[str, str], dict[str, float]] = {}

    def handle(self, event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data", {}) or {}
        host = data.get("host") or ""
        if kind == "playbook_on_stats":
            self.stats = data
        elif kind == "playbook_on_play_start":
            self.play = data.get("play", "")
        elif kind == "playbook_on_task_start":
            self.task = data.get("task", "")
            self.tasks_done += 1
        elif kind.startswith("runner_on_") and host:
            summary = self.hosts.setdefault(host, HostSummary())
            res = data.get("res", {}) or {}
            if kind == "runner_on_ok":
                summary.ok += 1
                summary.changed += 1 if res.get("changed") else 0
            elif kind == "runner_on_failed" and not data.get("ignore_errors"):
                summary.failed += 1
                self.failures.append((host, data.get("task", ""), _message(res)))
            elif kind == "runner_on_unreachable":
                summary.unreachable += 1
                self.failures.append((host, data.get("task", ""), _message(res)))
            elif kind == "runner_on_skipped":
                summary.skipped += 1
            self.current[host] = data.get("task", "")
            self._time(data, host)
        return False

    @property
    def artifacts(self) -> dict[str, Any]:
        """The play's custom stats (set_stats, per_host false) from the run's stats event."""
        data = self.stats.get("artifact_data")
        return dict(data) if isinstance(data, dict) else {}

    def _time(self, data: dict[str, Any], host: str) -> None:
        duration = data.get("duration")
        if isinstance(duration, (int, float)) and not isinstance(duration, bool):
            key = (data.get("play", "") or self.play, data.get("task", "") or self.task)
            per_host = self.durations.setdefault(key, {})
            per_host[host] = per_host.get(host, 0.0) + float(duration)

    def profile(self, top: int = 15) -> dict[str, Any]:
        """The tasks that cost most, summed across hosts (seconds), and the totals."""
        rows: list[dict[str, Any]] = [
            {
                "play": play,
                "task": task,
                "total_s": round(sum(hosts.values()), 3),
                "hosts": len(hosts),
                "max_s": round(max(hosts.values()), 3),
            }
            for (play, task), hosts in self.durations.items()
        ]
        rows.sort(key=lambda r: r["total_s"], reverse=True)
        per_host: dict[str, float] = {}
        per_play: dict[str, dict[str, float]] = {}
        for (play, _), hosts in self.durations.items():
            for host, seconds in hosts.items():
                per_host[host] = per_host.get(host, 0.0) + seconds
                in_play = per_play.setdefault(play, {})
                in_play[host] = in_play.get(host, 0.0) + seconds
        return {
            "playbook": self.playbook,
            "tasks": len(rows),
            "results": sum(len(h) for h in self.durations.values()),
            "task_seconds_per_host": {h: round(s, 1) for h, s in sorted(per_host.items())},
            # the slowest host's task time in each play, in play order
            "play_seconds_max_host": {p: round(max(h.values()), 1) for p, h in per_play.items()},
            "top": rows[:top],
            "all": rows,
        }

    def render(self) -> Table:
        table = Table(title=f"{self.playbook} — play: {self.play}", title_justify="left")
        table.add_column("host")
        table.add_column("ok", justify="right")
        table.add_column("changed", justify="right")
        table.add_column("failed", justify="right")
        table.add_column("unreachable", justify="right")
        table.add_column("last task")
        for host, s in self.hosts.items():
            table.add_row(
                host,
                str(s.ok),
                Text(str(s.changed), style="yellow" if s.changed else ""),
                Text(str(s.failed), style="red" if s.failed else ""),
                Text(str(s.unreachable), style="red" if s.unreachable else ""),
                self.current.get(host, ""),
            )
        table.caption = f"task {self.tasks_done}: {self.task}"
        return table


def _message(res: dict[str, Any]) -> str:
    msg = res.get("msg") or res.get("stderr") or res.get("reason") or ""
    if isinstance(msg, list):
        msg = " ".join(map(str, msg))
    msg = squeeze(msg)
    # A loop's failure says only "One or more items failed": name the first failed item and
    # what it said, which is the cause the user needs.
    items = res.get("results")
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and item.get("failed"):
                label = item.get("_ansible_item_label") or item.get("item") or ""
                if isinstance(label, dict):
                    label = label.get("name") or json.dumps(label, sort_keys=True)
                said = _message({k: v for k, v in item.items() if k != "results"})
                msg = f"{msg}; first: {label}: {said}" if label else f"{msg}; first: {said}"
                break
    return msg[:400]


MITOGEN_STRATEGY = "mitogen_linear"


def env_switch(name: str, default: bool, fix: str) -> bool:
    """A 0/1 switch from the environment (unset or empty: default); any other value is
    refused, naming it and `fix`."""
    value = os.environ.get(name, "")
    if value == "":
        return default
    if value not in ("0", "1"):
        raise DsclusterError(f"{name}={value!r} is neither 1 nor 0; {fix}")
    return value == "1"


# The collection's callbacks that patch private ansible-core 2.19 internals: off unless their
# switch is 1 (an opt-in, as DSCLUSTER_MITOGEN), never enabled by ansible.cfg. A bad value
# cannot be refused inside ansible-playbook: dscluster refuses it first.
# Switch -> (the callback it enables, what 1 does).
CALLBACK_SWITCHES = {
    "DSCLUSTER_JINJA_CACHE": ("jinja_cache", "share compiled templates between the workers"),
    "DSCLUSTER_FACTS_MEMO": ("facts_memo", "decode cached facts once per change"),
}
# ansible.cfg's callbacks_enabled (a test holds them equal): ANSIBLE_CALLBACKS_ENABLED, set
# when a switch is on, replaces it.
CALLBACKS_ENABLED = "ansible.posix.profile_tasks"


def callback_switches() -> dict[str, str]:
    """Each callback switch as the playbook run gets it ("1" or "0"); a bad value is refused,
    naming it and what 1 does."""
    return {
        name: "1" if env_switch(name, False, f"set {name}=1 to {on}, or unset it") else "0"
        for name, (_, on) in CALLBACK_SWITCHES.items()
    }


def callbacks_enabled(switches: dict[str, str]) -> str | None:
    """ANSIBLE_CALLBACKS_ENABLED with the opted-in callbacks; None where none is."""
    opted = [CALLBACK_SWITCHES[name][0] for name, on in switches.items() if on == "1"]
    return ",".join([CALLBACKS_ENABLED, *opted]) if opted else None


def mitogen_strategy_dir() -> pathlib.Path | None:
    """DSCLUSTER_MITOGEN=1: the strategy plugins of the installed mitogen; None when unset.

    Mitogen runs each host's modules in one persistent interpreter instead of one SSH exec
    per task (a changed=0 re-converge of 3 nodes took 70 s instead of 95 s here). It is an
    option, not the default: install it with `pip install 'dscluster[mitogen]'`."""
    if not env_switch(
        "DSCLUSTER_MITOGEN",
        False,
        "set DSCLUSTER_MITOGEN=1 to run playbooks with mitogen, or unset it",
    ):
        return None
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        raise DsclusterError(
            "DSCLUSTER_MITOGEN=1 but mitogen is not installed in this Python; run "
            "pip install 'dscluster[mitogen]', or unset DSCLUSTER_MITOGEN"
        )
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / "plugins" / "strategy"


def _ours_first(ours: pathlib.Path, var: str) -> str:
    """A path list: the collection's own directory, then what the user's `var` names."""
    return os.pathsep.join(p for p in (str(ours), os.environ.get(var, "")) if p)


def ansible_env() -> dict[str, str]:
    """The environment every playbook runs with: the collection this client belongs to, and
    the settings dscluster relies on (host keys checked, caches under the user's cache dir),
    whatever ansible.cfg the user's working directory has."""
    root = paths.collection_root()
    cache = cache_dir()
    config = root / "ansible.cfg"
    switches = callback_switches()
    env = {
        "ANSIBLE_COLLECTIONS_PATH": _ours_first(
            paths.collections_path(), "ANSIBLE_COLLECTIONS_PATH"
        ),
        "ANSIBLE_ROLES_PATH": str(root / "roles"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_GATHERING": "implicit",
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(cache / "facts"),
        "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "600",
        "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
        # facts only under ansible_facts: a returned fact never shadows a role parameter
        "ANSIBLE_INJECT_FACT_VARS": "False",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "ANSIBLE_TIMEOUT": "30",
        "ANSIBLE_PIPELINING": "True",
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=120s "
        "-o ServerAliveInterval=15 -o ServerAliveCountMax=4",
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(cache / "cp"),
        "PATH": str(pathlib.Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_FORCE_COLOR": "0",
        # ansible-runner sets this variable (adding its own), so ansible.cfg's is not read:
        # the collection's callbacks (jinja_cache, facts_memo: opted in by their switches)
        # are found here
        "ANSIBLE_CALLBACK_PLUGINS": str(root / "plugins" / "callback"),
        # the collection's modules (cluster_ssh_files) by the short names its roles use, as
        # ansible.cfg's `library`; a user's own module path after them
        "ANSIBLE_LIBRARY": _ours_first(root / "plugins" / "modules", "ANSIBLE_LIBRARY"),
        # and its actions (controller_files), as ansible.cfg's `action_plugins`
        "ANSIBLE_ACTION_PLUGINS": _ours_first(
            root / "plugins" / "action", "ANSIBLE_ACTION_PLUGINS"
        ),
        **switches,
    }
    if enabled := callbacks_enabled(switches):
        env["ANSIBLE_CALLBACKS_ENABLED"] = enabled
    if config.is_file():
        env["ANSIBLE_CONFIG"] = str(config)
    strategies = mitogen_strategy_dir()
    if strategies is not None:
        env["ANSIBLE_STRATEGY_PLUGINS"] = str(strategies)
        env["ANSIBLE_STRATEGY"] = MITOGEN_STRATEGY
    return env


@contextlib.contextmanager
def signals_kept() -> Iterator[None]:
    """SIGINT and SIGTERM handled as before once the block ends: ansible-runner sets its own
    handlers (for its cancel callback) and never puts the old ones back, which left Ctrl-C
    doing nothing for the rest of the command (a job's live output could not be left)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def run_playbook(
    playbook: str,
    inv: Inventory,
    *,
    extravars: dict[str, Any] | None = None,
    limit: str | None = None,
    tags: str | None = None,
    timeout: int | None = None,
    console: Console | None = None,
    live: bool | None = None,
) -> PlaybookResult:
    """Run playbooks/<playbook> against the inventory; returns the summary (never raises on
    a failed play: callers decide)."""
    import ansible_runner  # noqa: PLC0415 - slow import, only when a playbook runs

    root = paths.collection_root()
    path = paths.playbook(playbook)
    console = console or Console(stderr=True)
    if live is None:
        live = console.is_terminal
    runs = cache_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    private = pathlib.Path(tempfile.mkdtemp(prefix="run-", dir=runs))
    hosts = inv.hosts
    progress = Progress(playbook, hosts)
    envvars = ansible_env()
    view: Live | None = None

    def on_event(event: dict[str, Any]) -> bool:
        progress.handle(event)
        if view is not None:
            view.update(progress.render())
        elif event.get("event") == "playbook_on_task_start":
            console.print(f"[{progress.play}] {progress.task}", highlight=False, markup=False)
        return False  # keep no event files: progress is all we need

    kwargs: dict[str, Any] = {
        "private_data_dir": str(private),
        "project_dir": str(root / "playbooks"),
        "playbook": str(path),
        "inventory": str(inv.source),
        "extravars": extravars or {},
        "envvars": envvars,
        "forks": max(5, min(64, len(hosts))),
        "quiet": True,
        "event_handler": on_event,
        "timeout": timeout,
    }
    if limit:
        kwargs["limit"] = limit
    if tags:
        kwargs["tags"] = tags
    try:
        display = (
            Live(progress.render(), console=console, refresh_per_second=4)
            if live
            else contextlib.nullcontext()
        )
        with display as view, signals_kept():
            result = ansible_runner.run(**kwargs)
        stdout = result.stdout.read() if result.stdout else ""
        recover_lost_events(progress, pathlib.Path(result.config.artifact_dir) / "job_events")
    finally:
        if not os.environ.get("DSCLUSTER_KEEP_RUNS"):
            shutil.rmtree(private, ignore_errors=True)
    _write_profile(progress)
    stats = progress.stats
    for field, attr in (
        ("ok", "ok"),
        ("changed", "changed"),
        ("failures", "failed"),
        ("dark", "unreachable"),
        ("skipped", "skipped"),
    ):
        for host, count in (stats.get(field) or {}).items():
            setattr(progress.hosts.setdefault(host, HostSummary()), attr, count)
    if result.status == "timeout":
        progress.failures.append(("-", playbook, f"did not finish within {timeout} s"))
    if result.rc != 0 and not progress.failures:
        tail = [ln for ln in stdout.splitlines() if ln.strip()][-3:]
        progress.failures.append(("-", playbook, " ".join(tail)[:400] or result.status))
    return PlaybookResult(
        status=result.status,
        rc=result.rc,
        hosts=progress.hosts,
        failures=progress.failures,
        artifacts=progress.artifacts,
    )


def recover_lost_events(progress: Progress, job_events: pathlib.Path) -> int:
    """Hand `progress` the events whose stdout marker never reached ansible-runner.

    Ansible's side of ansible-runner writes each event's data to job_events/<uuid>-partial.json
    and only a marker to its stdout; runner reads the markers through a pty and merges (then
    deletes) the partial file. A pty can lose the output written just before the child exits
    (ansible/ansible-runner#1330, #640): on a busy machine the last events, the play's stats
    among them, never come, and `doctor` then saw every node as not reporting. A partial file
    left after the run is such an event: it is handed over here, in the order it was made.
    Returns how many were recovered."""
    leftovers = []
    with contextlib.suppress(OSError):
        for path in job_events.glob("*-partial.json"):
            try:
                event = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(event, dict) and event.get("event"):
                leftovers.append(event)
    leftovers.sort(key=lambda e: str(e.get("created", "")))
    for event in leftovers:
        progress.handle(event)
    return len(leftovers)


def _write_profile(progress: Progress) -> None:
    """DSCLUSTER_PROFILE=FILE: the run's task profile as JSON (make bench reads it)."""
    target = os.environ.get("DSCLUSTER_PROFILE")
    if target:
        atomic_write(pathlib.Path(target), json.dumps(progress.profile(), indent=1) + "\n")


def summary_table(result: PlaybookResult, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("host", "ok", "changed", "failed", "unreachable", "skipped"):
        table.add_column(col, justify="left" if col == "host" else "right")
    for host, s in sorted(result.hosts.items()):
        table.add_row(
            host, str(s.ok), str(s.changed), str(s.failed), str(s.unreachable), str(s.skipped)
        )
    return table


def raise_for_failures(result: PlaybookResult, what: str) -> None:
    if result.rc == 0 and not result.failed_hosts:
        return
    if result.failures:
        host, task, msg = result.failures[0]
        more = f" (+{len(result.failures) - 1} more)" if len(result.failures) > 1 else ""
        hosts = ", ".join(result.failed_hosts) or host
        raise DsclusterError(f"{what} failed on {hosts}: task '{task}' on {host}: {msg}{more}")
    raise DsclusterError(f"{what} failed ({result.status}, rc={result.rc})")

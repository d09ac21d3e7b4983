"""`dscluster launch --max-restarts N`: a job that lost nodes is launched again on the nodes
that are left, from its last complete checkpoint, until it ends by itself, N restarts are
used or fewer than --min-nodes nodes are left; the run record of its attempts.

Each attempt is a run of its own: a new run id (`<launch id>`, then `<launch id>-r1`, ...)
and job directory, so each attempt's log, hostfile and `.deepspeed_env` stay as they ran;
what carries over lives in the checkpoint directory, the same for every attempt of a launch.
Every rank of every launcher gets, through the job's own `.deepspeed_env` (JobSite.job_env):

    DSCLUSTER_RESTART          0 on the first attempt, then 1, 2, ...
    DSCLUSTER_CHECKPOINT_DIR   the launch's checkpoint directory (below)
    DSCLUSTER_CHECKPOINT_TAG   the tag to resume from; empty when there is none

The checkpoint directory is `<dscluster_checkpoint_dir>/<launch id>` (on shared storage by
default, `{dscluster_shared_dir}/dscluster/checkpoints/...`), or --checkpoint-dir. The tag is
the one DeepSpeed's `latest` file there names (engine.py, DeepSpeedEngine.save_checkpoint:
global rank 0 writes `latest` after its own _save_checkpoint/_save_zero_checkpoint and the
checkpoint engine's commit, then all ranks meet in dist.barrier()); a tag directory `latest`
does not name (a save cut half-way) is never used, and a `latest` naming a missing or empty
directory means no checkpoint. The head's launch_watch.py reads it as the training user,
without following a link, once the launcher ended (checkpoint_state.json).

Without shared storage (dscluster_shared_storage: none) checkpoints are node-local
(DeepSpeed's use_node_local_storage): each node holds its own ranks' ZeRO shards, and a lost
node's shards are lost with it, so the survivors never hold a complete checkpoint. A restart
then starts over (DSCLUSTER_CHECKPOINT_TAG empty), said on the console; --checkpoint-dir
names a directory every node sees as the same files, and the tag is then found as on shared
storage.

The job says it trained a step by printing `DSCLUSTER_STEP <n>` from rank 0 after each
optimizer step (STEP_MARKER); the watcher notes, on the head's clock, when it first saw it and
when it noticed a lost node, and the record holds the seconds from the loss to the next
attempt's first step (recovery_s). Steps done are read from DeepSpeed's default tag form,
`global_step<n>`.

The attempts run under the head's job supervisor, which decides and restarts with no
controller attached (roles/deepspeed_launcher/files/dscluster_job.py: decide, from the exit
code and its own probe of each node's sshd) and plans each restart as the training user
(replan.py). Stopping: a script error (every node answers, ranks exited non-zero) is not
retried unless --retry-on-error; the time limit (--timeout: exit 124/137) never is; the head's
loss ends the job (the supervisor runs there). attempts_from reads the supervisor's record of
the attempts back into the run record.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pathlib
import re
from collections.abc import Collection, Mapping, Sequence

from ..deepspeed_env import ENV_SAFE_VALUE_RE
from ..errors import DsclusterError
from ..util import atomic_write

STEP_MARKER = "DSCLUSTER_STEP"
CHECKPOINT_STATE = "checkpoint_state.json"  # launch_watch.py's, fetched from the job dir
RESTART_ENV = ("DSCLUSTER_RESTART", "DSCLUSTER_CHECKPOINT_DIR", "DSCLUSTER_CHECKPOINT_TAG")
GLOBAL_STEP_RE = re.compile(r"global_step(\d+)")
# launch_watch.py's lines, head clock: the first step marker and a loss it noticed.
FIRST_STEP_RE = re.compile(rf"^dscluster: first {STEP_MARKER} (?P<step>\d+) at (?P<t>\d+\.\d+)")
LOSS_NOTICED_RE = re.compile(r"^dscluster: noticed the loss at (?P<t>\d+\.\d+)")
NODE_LOCAL_NOTE = (
    "launch: no shared storage: checkpoints in {dir} are node-local and a lost node's "
    "shards are lost with it, so a restart after a lost node starts over (no "
    "DSCLUSTER_CHECKPOINT_TAG); give --checkpoint-dir on a mount every node shares to resume"
)


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """launch's restart flags: max_restarts 0 is one attempt, today's launch exactly."""

    max_restarts: int = 0
    min_nodes: int = 1
    retry_on_error: bool = False
    checkpoint_dir: str = ""  # "" -> <dscluster_checkpoint_dir>/<launch id>

    @property
    def active(self) -> bool:
        return self.max_restarts > 0 or bool(self.checkpoint_dir)


def check_checkpoint_dir(path: str) -> str:
    """--checkpoint-dir as given, or one line saying what to give instead."""
    if (
        not path.startswith("/")
        or path.rstrip("/") == ""
        or not ENV_SAFE_VALUE_RE.match(path)
        or ":" in path
        or ".." in path.split("/")
    ):
        raise DsclusterError(
            f"--checkpoint-dir {path!r}: give an absolute path on the nodes other than '/', "
            "of letters, digits and _ . - / only, e.g. /shared/ckpt/run1"
        )
    return path.rstrip("/")


def check_min_nodes(min_nodes: int, nodes: Collection[str]) -> None:
    """--min-nodes against the nodes the run selects, before anything is written."""
    if min_nodes > len(nodes):
        raise DsclusterError(
            f"--min-nodes {min_nodes}: this run has {len(nodes)} node(s) ({', '.join(nodes)}); "
            f"give --min-nodes {len(nodes)} or fewer"
        )


def complete_tag(latest: str | None, listing: Mapping[str, int]) -> str:
    """The tag of the last complete checkpoint: the one DeepSpeed's `latest` names (its text,
    None when there is no such file), when `listing` (tag directory -> its entry count) has
    it with at least one entry; "" otherwise. Tag directories `latest` does not name are
    never chosen: a save cut before `latest` was written left them."""
    tag = (latest or "").strip()
    if not tag or "/" in tag or tag in (".", "..") or "\n" in tag:
        return ""
    return tag if listing.get(tag, 0) > 0 else ""


def shards_complete(shards: object, world_size: int | None) -> bool:
    """Whether a tag's ZeRO optimizer shards ([dp rank, mp rank, bytes] each, from
    launch_watch.py) are all there: DeepSpeed's rank 0 writes `latest` after its own save but
    before the other ranks' are done (engine.py, save_checkpoint: the closing dist.barrier()
    comes after), so a node lost in that window leaves `latest` naming a tag without its
    shard. Complete: every (dp, mp) pair of the grid, none under half the median size (a
    save cut short), and, given the world size of the attempt that wrote the tag, one shard
    per rank (pipeline-parallel jobs, whose ranks are not all ZeRO shards, then read as
    incomplete and resume from the checkpoint before). No shards (ZeRO off): complete."""
    if not isinstance(shards, list) or not shards:
        return True
    try:
        cells = {(int(dp), int(mp)): int(size) for dp, mp, size in shards}
    except (TypeError, ValueError):
        return False
    dps, mps = {dp for dp, _ in cells}, {mp for _, mp in cells}
    if dps != set(range(len(dps))) or mps != set(range(len(mps))):
        return False
    if len(cells) != len(dps) * len(mps):
        return False
    if world_size is not None and len(cells) != world_size:
        return False
    sizes = sorted(cells.values())
    return sizes[0] * 2 >= sizes[len(sizes) // 2]


def tag_from_state(text: str, world_size: int | None = None) -> str:
    """complete_tag of launch_watch.py's checkpoint_state.json ("" when unreadable, or when its
    ZeRO shards are not all there: shards_complete, against `world_size` when the tag was
    written by the attempt of that size)."""
    try:
        state = json.loads(text)
    except ValueError:
        return ""
    if not isinstance(state, dict):
        return ""
    latest, entries = state.get("latest"), state.get("tag_entries")
    if not isinstance(latest, str):
        return ""
    if not shards_complete(state.get("zero_shards"), world_size):
        return ""
    count = entries if isinstance(entries, int) else 0
    return complete_tag(latest, {latest.strip(): count})


def steps_of(tag: str) -> int | None:
    """The step count of DeepSpeed's default tag (`global_step120` -> 120); None otherwise."""
    m = GLOBAL_STEP_RE.fullmatch(tag.strip())
    return int(m[1]) if m else None


def _watch_time(lines: Sequence[str], pattern: re.Pattern[str]) -> float | None:
    for line in lines:
        if m := pattern.match(line):
            return float(m["t"])
    return None


@dataclasses.dataclass
class Attempt:
    """One attempt of a launch, as the run record keeps it (times: seconds since the epoch)."""

    restart: int
    run_id: str
    nodes: list[str]
    started: float
    resumed_from: str = ""
    ended: float = 0.0
    rc: int | None = None
    ended_why: str = ""
    tag_at_end: str = ""
    steps: int | None = None
    log: str = ""
    first_step_at: float | None = None  # head clock (launch_watch.py)
    loss_at: float | None = None  # when this attempt noticed its lost node (head clock, or ours)
    recovery_s: float | None = None  # from the previous attempt's loss to this first step

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        for key in ("started", "ended", "first_step_at", "loss_at"):
            if data[key] is not None:
                data[key + "_utc"] = _utc(data[key])
        return data


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds")


@dataclasses.dataclass
class RunRecord:
    launch_id: str
    checkpoint_dir: str
    checkpoints_shared: bool
    max_restarts: int
    min_nodes: int
    retry_on_error: bool
    attempts: list[Attempt] = dataclasses.field(default_factory=list)
    stopped: str = ""  # why the launch stopped short of the job's own end ("" when it did not)
    path: str = ""

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["attempts"] = [a.to_json() for a in self.attempts]
        return data

    def write(self, reports: pathlib.Path) -> pathlib.Path:
        path = reports / f"{self.launch_id}.json"
        self.path = str(path)
        atomic_write(path, json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        return path


def attempts_from(
    states: Sequence[Mapping], lines: Sequence[Sequence[str]], logs: Sequence[str], last: str
) -> list[Attempt]:
    """The run record's attempts from the supervisor's (state.json `attempts`), each with its
    own log `lines` and the controller's `logs` path; `last`: the last attempt's
    checkpoint_state.json (the tag it left: the others' the planner read). The watcher's
    times come from each attempt's lines (head clock); recovery_s from a loss to the next
    attempt's first step."""
    out: list[Attempt] = []
    loss_at: float | None = None
    for n, (state, own, log) in enumerate(zip(states, lines, logs, strict=True)):
        a = Attempt(
            restart=int(state.get("restart", n)),
            run_id=str(state.get("run_id", "")),
            nodes=[str(h) for h in state.get("nodes", [])],
            started=float(state.get("started") or 0),
            resumed_from=str(state.get("resumed_from") or ""),
            ended=float(state.get("ended") or 0),
            rc=state.get("rc"),
            ended_why=str(state.get("ended_why") or ""),
            tag_at_end=str(state.get("tag_at_end") or ""),
            steps=state.get("steps"),
            log=log,
        )
        if n == len(states) - 1:
            ranks = int(state.get("ranks") or 0) or None
            written = tag_from_state(last) not in ("", a.resumed_from)
            a.tag_at_end = tag_from_state(last, ranks if written else None)
            a.steps = steps_of(a.tag_at_end) if a.tag_at_end else None
        a.first_step_at = _watch_time(own, FIRST_STEP_RE)
        if state.get("lost"):
            # the watcher's notice on the head's clock; else when the attempt ended
            a.loss_at = _watch_time(own, LOSS_NOTICED_RE) or a.ended
        if loss_at is not None and a.first_step_at is not None:
            a.recovery_s = round(a.first_step_at - loss_at, 3)
        loss_at = a.loss_at
        out.append(a)
    return out

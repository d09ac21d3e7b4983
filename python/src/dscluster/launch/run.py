"""Running a launch: the plan from an inventory, staging and running the job through
playbooks/launch.yml (the one place with I/O), the dry-run description.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from rich.console import Console

from .. import storage
from ..errors import DsclusterError
from ..inventory import Inventory
from ..launch_files import LaunchFiles, render_launch_files
from ..paths import cache_dir
from ..runner import PlaybookResult, run_playbook
from ..util import atomic_write, print_warnings, write_files
from . import jobs
from .exclude import plan_on
from .launchers.mpi import render_mpi_hostfile
from .render import Plan
from .replan import SPEC, ZIPAPP, plan_next, spec_of, zipapp_bytes
from .request import JobSite, LaunchRequest
from .restart import (
    CHECKPOINT_STATE,
    NODE_LOCAL_NOTE,
    RestartPolicy,
    RunRecord,
    attempts_from,
    check_min_nodes,
)
from .signatures import Match, match_signatures
from .watch import ScriptFailure, lost_nodes, script_failure
from .workdir import JOB_FILE_NAMES, JOB_TAR, Project, check_names, project_for, write_job_tar

# Seconds for staging and starting a job (launch.yml); the job itself has no bound.
STAGE_TIMEOUT = 900
# A job output brought back: one plain name in the job directory.
FETCH_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


class LeftOut(Protocol):
    """What a preflight hands back per node it leaves out (doctor.exclude.Excluded)."""

    @property
    def host(self) -> str: ...
    @property
    def checks(self) -> Sequence[str]: ...
    @property
    def why(self) -> str: ...


# The doctor run before a job (doctor.preflight): the nodes it leaves out of the run, if any.
Preflight = Callable[[], Sequence[LeftOut] | None]


def run_preflight(preflight: Preflight | None) -> list[LeftOut]:
    """Run the preflight (doctor, unless --no-doctor): the nodes it leaves out of the run."""
    return list((preflight() or ()) if preflight is not None else ())


def left_out_of(excluded: Sequence[LeftOut]) -> dict[str, str]:
    """host -> the checks it failed, of the nodes left out (plan_for's `left_out`)."""
    return {e.host: ", ".join(e.checks) for e in excluded}


def new_run_id(prefix: str) -> str:
    return dt.datetime.now(dt.UTC).strftime(f"{prefix}-%Y%m%dT%H%M%S%f")


def job_dir_for(inv: Inventory, run_id: str) -> str:
    return f"{storage.inventory_paths(inv).jobs_dir}/{run_id}"


def site_for(
    inv: Inventory, files: LaunchFiles, run_id: str, job_env: Mapping[str, str] | None = None
) -> JobSite:
    """Where run `run_id` runs: the inventory's launch files (rendered, maybe not written) and
    this run's own `.deepspeed_env` variables `job_env` (restart.py)."""
    head_facts = files.facts[0]
    interfaces = {f.interface for f in files.facts}
    return JobSite(
        run_id=run_id,
        job_dir=job_dir_for(inv, run_id),
        head=inv.head,
        venv=head_facts.venv,
        pool={f.host: f.slots for f in files.facts},
        accelerators={f.host: f.accelerator for f in files.facts},
        hostfile_text=files.hostfile_text,
        env_text=files.env_text,
        interface=interfaces.pop() if len(interfaces) == 1 else "",
        job_env=dict(job_env or {}),
    )


def plan_for(
    inv: Inventory,
    files: LaunchFiles,
    request: LaunchRequest,
    run_id: str,
    *,
    left_out: Mapping[str, str] | None = None,
    job_env: Mapping[str, str] | None = None,
) -> Plan:
    """build_plan of `request` on the inventory and its launch files (site_for). `left_out`
    (host -> its failed checks): the nodes --exclude-unhealthy leaves out of this run alone
    (exclude.py), gone from the job's own hostfile, never from the inventory's."""
    return plan_on(site_for(inv, files, run_id, job_env), request, left_out or {})


@dataclasses.dataclass
class JobResult:
    rc: int
    log_lines: list[str]
    log_path: pathlib.Path
    fetched: dict[str, str]  # name -> text of each file fetched besides the log
    lost_nodes: dict[str, str]
    playbook: PlaybookResult
    project: str = ""  # "N files from DIR" when the job shipped a project (--workdir)
    # ranks exited non-zero with every node reachable (then lost_nodes is empty)
    failure: ScriptFailure | None = None
    # known failure signatures in the log of a failed job (signatures.SIGNATURES)
    signatures: list[Match] = dataclasses.field(default_factory=list)
    # the nodes --exclude-unhealthy left out of this run: host -> the checks it failed
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    # launch --max-restarts: every attempt, written beside the logs (restart.py)
    record: RunRecord | None = None
    # the supervisor's state of the job when it ended (jobs.STATE_KEYS); {} if it never ran
    state: dict = dataclasses.field(default_factory=dict)
    # each line's end in the supervisor's log (a byte offset), as log_lines
    offsets: list[int] = dataclasses.field(default_factory=list)


def run_job(  # noqa: PLR0913 - the job, where its output goes, each a keyword
    inv: Inventory,
    plan: Plan,
    *,
    stage_files: Mapping[str, pathlib.Path] | None = None,
    project: Project | None = None,
    fetch: Sequence[str] = (),
    timeout: int | None = None,
    console: Console | None = None,
    playbook: str = "launch.yml",
    on_line: Callable[[str, float], None] | None = None,
    on_state: Callable[[dict], None] | None = None,
    detach: bool = False,
    restart: Mapping | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> JobResult:
    """Stage the plan's files (+ stage_files: name -> local path, + the `project` unpacked
    from one tarball) into the job directory, start launch.sh on the head under root's job
    supervisor (cut after `timeout` seconds when given), and follow its record until it
    ends: every line to on_line(text, head time) as it comes, the state's changes to
    on_state; then its exit status and the job's own outputs (`fetch`) from the record.
    Ctrl-C while following, or `detach`, raises jobs.Detached: the job runs on. `restart`:
    the supervisor's restart policy (launch --max-restarts), with `extra_files` (name ->
    bytes, the restart planner) staged beside the job's own."""
    console = console or Console(stderr=True)
    if timeout is not None and timeout < 1:
        raise DsclusterError(f"--timeout {timeout}: give the job at least one second, e.g. 600")
    for name in fetch:
        # The supervisor copies each into the head's job record under this name.
        if not FETCH_NAME.fullmatch(name) or name in jobs.RECORD_FILES:
            raise DsclusterError(
                f"output {name!r}: name a file in the job directory itself, e.g. report.json"
            )
    stage = pathlib.Path(tempfile.mkdtemp(prefix="launch-", dir=cache_dir()))
    try:
        files = {name: (text.encode(), int(mode, 8)) for name, (text, mode) in plan.files.items()}
        for name, path in (stage_files or {}).items():
            files[name] = (path.read_bytes(), 0o644)
        for name, data in (extra_files or {}).items():
            files[name] = (data, 0o644)
        write_job_tar(stage / JOB_TAR, pathlib.PurePosixPath(plan.job_dir).name, files, project)
        result = run_playbook(
            playbook,
            inv,
            extravars={
                "launch_stage_dir": str(stage),
                "launch_job_dir": plan.job_dir,
                "launch_job_tar": JOB_TAR,
                "launch_spec": _spec(plan, timeout, fetch, restart),
            },
            # Only the job's nodes: a node left out (--exclude, degraded.json) is not touched.
            limit=",".join(dict.fromkeys([plan.head, *plan.resources])),
            timeout=STAGE_TIMEOUT,
            console=console,
        )
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    lines: list[str] = []
    offsets: list[int] = []
    end: jobs.JobEnd | None = None
    if result.rc == 0:
        if detach:
            raise jobs.Detached(inv, plan.run_id)

        def line(text: str, at: float) -> None:
            lines.append(text)
            if on_line is not None:
                on_line(text, at)

        try:
            end = jobs.follow(
                inv, plan.run_id, on_line=line, on_state=on_state, on_at=offsets.append
            ).end
        except KeyboardInterrupt:
            raise jobs.Detached(inv, plan.run_id) from None
    log_text = "".join(f"{text}\n" for text in lines)
    # .txt: Ansible reads every other file under an inventory directory as inventory.
    log_path = inv.directory / "logs" / f"{plan.run_id}.log.txt"
    atomic_write(log_path, log_text)
    # Root's record of the exit status (the supervisor's), never a file of the job's.
    texts = dict(end.files) if end is not None else {}
    status = texts.pop("exit_status", "").strip()
    rc = int(status) if status.lstrip("-").isdigit() else 1
    if result.rc != 0 and rc == 0:
        rc = 1  # the play failed around a job that did not (staging, starting)
    return judged(
        JobResult(
            rc=rc,
            log_lines=lines,
            log_path=log_path,
            fetched=texts,
            lost_nodes={},
            playbook=result,
            project=project.describe() if project is not None else "",
            state=end.state if end is not None else {},
            offsets=offsets,
        ),
        plan,
    )


def _spec(plan: Plan, timeout: int | None, fetch: Sequence[str], restart: Mapping | None) -> dict:
    """The supervisor's spec of the job (launch.yml's launch_spec)."""
    spec = {
        "launcher": plan.launcher,
        "nodes": list(plan.resources),
        "ranks": plan.world_size,
        "timeout": timeout or 0,
        "fetch": list(fetch),
    }
    if restart is not None:
        spec["restart"] = dict(restart)
    return spec


def judged(result: JobResult, plan: Plan, lost: Mapping[str, str] | None = None) -> JobResult:
    """The result with what its log says of a failure on `plan`'s ranks: the script error,
    else the lost nodes (`lost`: root's own finding, when it has one), the known signatures."""
    rc, lines = result.rc, result.log_lines
    cut = rc in (124, 137)  # the time limit ended it: no one rank's failure
    failure = script_failure(lines, plan.rank_hosts) if rc and not cut else None
    if rc and failure is None:
        lost = dict(lost) if lost else lost_nodes(lines, plan.rank_hosts)
    return dataclasses.replace(
        result,
        failure=failure,
        lost_nodes=dict(lost or {}) if rc and failure is None else {},
        signatures=match_signatures(lines, plan.rank_hosts) if rc else [],
    )


def write_launch_set(inv: Inventory, files: LaunchFiles, launcher: str) -> pathlib.Path | None:
    """hostfile and .deepspeed_env, and for mpi every slot in OpenMPI's format beside the
    inventory (for the user's own mpirun; the job's own filtered copy is staged with the job),
    written as one transaction. The mpi_hostfile's path, when written."""
    texts: dict[pathlib.Path, str] = {
        files.hostfile: files.hostfile_text,
        files.env_file: files.env_text,
    }
    mpi = inv.directory / "mpi_hostfile" if launcher == "mpi" else None
    if mpi is not None:
        texts[mpi] = render_mpi_hostfile({f.host: range(f.slots) for f in files.facts})
    write_files(texts)
    return mpi


# The launch files a dry run shows, when the plan stages them.
DESCRIBED_FILES = (
    "hostfile",
    "mpi_hostfile",
    "gaudi_hostfile",
    "torchrun_node.sh",
    "mpi_rank.sh",
    "ds_rank.sh",
    "accelerate_node.sh",
    "accelerate_config.yaml",
    "accelerate_config.json",
)


def describe(plan: Plan) -> str:
    """The dry run: the head's command, then every launch file it uses."""
    parts = [
        f"# {plan.launcher} on {len(plan.resources)} nodes, {plan.world_size} ranks, "
        f"from {plan.head} in {plan.job_dir}",
        plan.command,
    ]
    for name in DESCRIBED_FILES:
        if name in plan.files:
            parts += [f"# --- {name}", plan.files[name][0].rstrip("\n")]
    return "\n".join(parts) + "\n"


def program_for(script: str, args: Sequence[str], *, stage: bool) -> tuple[list[str], dict]:
    """The program words and the local files to stage for `script`."""
    if not stage:
        if not script.startswith("/"):
            raise DsclusterError(
                f"--no-stage needs the script's absolute path on the nodes, not {script!r}"
            )
        return [script, *args], {}
    path = pathlib.Path(script).expanduser()
    if not path.is_file():
        raise DsclusterError(
            f"script {script} not found here; give a local file to stage, or an absolute "
            "path on the nodes with --no-stage"
        )
    if path.name in JOB_FILE_NAMES:
        raise DsclusterError(f"script name {path.name} is used by dscluster's job files; rename it")
    return [path.name, *args], {path.name: path}


def launch(  # noqa: PLR0913 - how the launch command runs its request, each a keyword
    inv: Inventory,
    request: LaunchRequest,
    *,
    stage: bool = True,
    workdir: str | None = None,
    dry_run: bool = False,
    timeout: int | None = None,
    mode_files: Mapping[str, pathlib.Path] | None = None,
    out: Console | None = None,
    console: Console | None = None,
    preflight: Preflight | None = None,
    restart: RestartPolicy | None = None,
    on_line: Callable[[str, float], None] | None = None,
    on_state: Callable[[dict], None] | None = None,
    detach: bool = False,
) -> tuple[Plan, JobResult | None]:
    """Plan, then (unless dry_run) write the launch files, run `preflight` (doctor) and the
    job. Everything is checked before anything is written; a dry run writes nothing.
    request.program: the script and its args as given; workdir: the project directory
    shipped with the job and run in (the script relative to it); without it, the script
    alone is staged (or run in place with stage=False). mode_files: the local files the
    launcher's own options stage (launch.modes.plan_options). The nodes `preflight` leaves
    out (--exclude-unhealthy) are left out of this run's plan (plan_for). `restart`
    (--max-restarts, restart.py): a job that lost nodes runs again without them, decided and
    planned on the head by its supervisor (replan.py); --min-nodes is checked against this
    run's nodes before anything is written. Every rank then finds
    DSCLUSTER_RESTART, DSCLUSTER_CHECKPOINT_DIR and DSCLUSTER_CHECKPOINT_TAG (empty with no
    checkpoint), and the job's rank 0 prints `DSCLUSTER_STEP <n>` after each optimizer step
    for the run record's time from a loss to the resumed first step. The job runs under
    the head's supervisor with no time limit unless `timeout`; `on_line`/`on_state` see its
    output and state live (run_job); `detach` returns once it started (jobs.Detached)."""
    out = out or Console()
    console = console or Console(stderr=True)
    files = render_launch_files(inv)
    script, args = request.program[0], request.program[1:]
    project: Project | None = None
    if workdir is not None:
        project, rel = project_for(workdir, script)
        program, stage_files = [rel, *args], dict[str, pathlib.Path]()
    else:
        program, stage_files = program_for(script, args, stage=stage)
    stage_files = {**stage_files, **(mode_files or {})}
    # The request's program as the job runs it, in its job directory.
    staged = dataclasses.replace(request, program=program)
    plan = plan_for(inv, files, staged, new_run_id("launch"))
    record: RunRecord | None = None
    if restart is not None:
        check_min_nodes(restart.min_nodes, plan.resources)
        if restart.active:
            record = _new_record(inv, restart, plan.run_id)
            plan = plan_for(inv, files, staged, plan.run_id, job_env=_first_env(record))
    if project is not None:
        check_names(project, [*plan.files, *JOB_FILE_NAMES])
    print_warnings(console, files.warnings)
    if dry_run:
        shipped = f"# ships {project.describe()}\n" if project is not None else ""
        out.print(describe(plan) + shipped, markup=False, highlight=False, end="")
        return plan, None
    mpi = write_launch_set(inv, files, request.launcher)
    if mpi is not None:
        console.print(f"wrote {mpi}", markup=False, highlight=False)
    console.print(
        f"launch: {plan.launcher}, {len(plan.resources)} nodes, {plan.world_size} ranks, "
        f"head {plan.head}, run {plan.run_id}",
        markup=False,
        highlight=False,
    )
    left_out = left_out_of(run_preflight(preflight))
    if record is not None and restart is not None:
        return _launch_with_restarts(
            inv,
            files,
            staged,
            restart,
            record,
            left_out=left_out,
            staged_names=[*stage_files, *_top_names(project)],
            run=lambda p, spec, extra: run_job(
                inv,
                p,
                stage_files=stage_files,
                project=project,
                fetch=[CHECKPOINT_STATE],
                timeout=timeout,
                console=console,
                on_line=on_line,
                on_state=on_state,
                detach=detach,
                restart=spec,
                extra_files=extra,
            ),
            console=console,
        )
    if left_out:
        plan = plan_for(inv, files, staged, plan.run_id, left_out=left_out)
        console.print(
            f"launch: {len(plan.resources)} nodes, {plan.world_size} ranks without "
            f"{', '.join(left_out)}",
            markup=False,
            highlight=False,
        )
    result = run_job(
        inv,
        plan,
        stage_files=stage_files,
        project=project,
        timeout=timeout,
        console=console,
        on_line=on_line,
        on_state=on_state,
        detach=detach,
    )
    return plan, dataclasses.replace(result, left_out=left_out)


def _new_record(inv: Inventory, policy: RestartPolicy, launch_id: str) -> RunRecord:
    """The launch's run record, its checkpoint directory chosen (restart.py)."""
    paths = storage.inventory_paths(inv)
    return RunRecord(
        launch_id=launch_id,
        checkpoint_dir=policy.checkpoint_dir or f"{paths.checkpoint_dir}/{launch_id}",
        # --checkpoint-dir: the user's word that every node sees the same files there
        checkpoints_shared=paths.shared or bool(policy.checkpoint_dir),
        max_restarts=policy.max_restarts,
        min_nodes=policy.min_nodes,
        retry_on_error=policy.retry_on_error,
    )


def _first_env(record: RunRecord) -> dict[str, str]:
    return {
        "DSCLUSTER_RESTART": "0",
        "DSCLUSTER_CHECKPOINT_DIR": record.checkpoint_dir,
        "DSCLUSTER_CHECKPOINT_TAG": "",
    }


def _top_names(project: Project | None) -> list[str]:
    """The project's names in the job directory's top (--workdir), as staged."""
    return sorted({rel.split("/")[0] for rel in project.entries}) if project is not None else []


def _launch_with_restarts(  # noqa: PLR0913 - launch's parts for the supervisor's restarts
    inv: Inventory,
    files: LaunchFiles,
    staged: LaunchRequest,
    policy: RestartPolicy,
    record: RunRecord,
    *,
    left_out: dict[str, str],
    staged_names: Sequence[str],
    run: Callable[[Plan, dict, dict[str, bytes]], JobResult],
    console: Console,
) -> tuple[Plan, JobResult]:
    """The job under the head's supervisor with its restart policy and planner (replan.py);
    the run record from the supervisor's record of the attempts, written beside the logs."""
    if not record.checkpoints_shared:
        console.print(
            NODE_LOCAL_NOTE.format(dir=record.checkpoint_dir), markup=False, highlight=False
        )
    if left_out:
        console.print(
            f"launch: without {', '.join(left_out)} (--exclude-unhealthy)",
            markup=False,
            highlight=False,
        )
    site = site_for(inv, files, record.launch_id, _first_env(record))
    plan = plan_on(site, staged, left_out)
    shared = storage.inventory_paths(inv).shared
    replan = spec_of(site, staged, record, staged_names, push=not shared)
    spec = {
        "max_restarts": policy.max_restarts,
        "min_nodes": policy.min_nodes,
        "retry_on_error": policy.retry_on_error,
        "head": inv.head,
        "pool": list(site.pool),
        "left": dict(left_out),
    }
    extra = {SPEC: (json.dumps(replan, indent=1) + "\n").encode(), ZIPAPP: zipapp_bytes()}
    # Detached (--detach, Ctrl-C) goes up from here: the supervisor's record is the job's.
    result = run(plan, spec, extra)
    try:
        plan, result = _attempts_of(inv, plan, replan, record, result, left_out)
    finally:
        record.write(inv.directory / "reports")
    return plan, dataclasses.replace(result, left_out=left_out, record=record)


def _attempts_of(
    inv: Inventory,
    first: Plan,
    replan: Mapping,
    record: RunRecord,
    result: JobResult,
    left_out: Mapping[str, str],
) -> tuple[Plan, JobResult]:
    """The run record's attempts from the supervisor's, each attempt's lines in a log of its
    own; the last attempt's plan (planned again here by the head's own plan_next, from the
    spec staged with the job) and result."""
    states = [a for a in result.state.get("attempts") or [] if isinstance(a, dict)]
    record.stopped = str(result.state.get("stopped") or "")
    if not states:
        return first, judged(result, first)
    starts = [int(a.get("log_from") or 0) for a in states]
    groups: list[list[str]] = [[] for _ in states]
    for n, text in enumerate(result.log_lines):
        at = result.offsets[n] if n < len(result.offsets) else 0
        groups[max((i for i, s in enumerate(starts) if s < at), default=0)].append(text)
    logs = []
    for a, lines in zip(states, groups, strict=True):
        path = inv.directory / "logs" / f"{a.get('run_id')}.log.txt"
        atomic_write(path, "".join(f"{t}\n" for t in lines))
        logs.append(str(path))
    record.attempts = attempts_from(states, groups, logs, result.fetched.get(CHECKPOINT_STATE, ""))
    last = states[-1]
    plan = first
    if int(last.get("restart") or 0) > 0:
        left = dict(left_out)
        for a in states[:-1]:
            left.update(a.get("lost") or {})
        with contextlib.suppress(DsclusterError):  # the head planned it: the first plan else
            plan = plan_next(
                replan, int(last["restart"]), left, str(last.get("resumed_from") or "")
            )
    own = dataclasses.replace(
        result, log_lines=groups[-1], log_path=pathlib.Path(logs[-1]), offsets=[]
    )
    return plan, judged(own, plan, last.get("lost") or None)

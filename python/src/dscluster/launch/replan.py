"""The restart planner: `launch --max-restarts`' next attempt, planned on the head with no
controller attached.

The controller stages it with the first attempt: dscluster_replan.pyz (ZIPAPP, zipapp_bytes:
this package's planning modules and PyYAML's pure-Python ones, nothing else) and replan.json
(SPEC, spec_of: the site, the request, the checkpoint directory and the files staged). When an
attempt ended and root's supervisor (dscluster_job.py) decided to restart, it runs, as the
training user, in the first attempt's job directory:

    /usr/bin/python3 -I -S dscluster_replan.pyz replan.json --restart K --prev-dir DIR
        --prev-ranks W --resumed TAG --left JSON [--lost]

It reads the attempt's checkpoint_state.json (launch_watch.py's) for the tag to resume from
(next_tag), plans the attempt on the nodes not left out with the same build_plan as the
controller (exclude.plan_on), writes its job directory beside the first one with the files
staged with the job, copies it to the other nodes when they do not share storage, and prints
one JSON line. What it writes runs as the training user alone; root only checks and records the
line (dscluster_job.py planned), and the controller plans the same attempt again from root's
record to read its log.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from importlib import resources

from ..errors import DsclusterError
from .exclude import plan_on
from .launchers.base import SSH_LIVENESS_ARGS
from .render import Plan
from .request import JobSite, LaunchRequest
from .restart import CHECKPOINT_STATE, RunRecord, steps_of, tag_from_state

SPEC = "replan.json"
ZIPAPP = "dscluster_replan.pyz"
# The modules the planner imports, under the dscluster package (a test runs the zipapp with
# -I -S: one missing here fails it). The packages' __init__ files are empty in the zipapp, but
# for those listed as kept whole.
MODULES = (
    "deepspeed_env.py", "errors.py", "hostfile.py", "inventory.py", "inventory_cache.py",
    "launch_env.py", "node_facts.py", "paths.py", "rules.py", "storage.py", "text.py", "util.py",
    "validate.py", "sources/names.py", "jobs/launch_watch.py", "launch/accelerate.py",
    "launch/exclude.py", "launch/render.py", "launch/replan.py", "launch/request.py",
    "launch/restart.py", "launch/select.py", "launch/launchers/__init__.py",
    "launch/launchers/accelerate.py", "launch/launchers/base.py",
    "launch/launchers/deepspeed.py", "launch/launchers/gaudi_spawn.py",
    "launch/launchers/mpi.py", "launch/launchers/torchrun.py",
)  # fmt: skip
PACKAGES = ("__init__.py", "sources/__init__.py", "jobs/__init__.py", "launch/__init__.py")
MAIN = "from dscluster.launch.replan import main\nraise SystemExit(main())\n"
# How the planner reaches the other nodes as the training user (as pdsh does).
SSH_ARGS = ("-o", "BatchMode=yes", *shlex.split(SSH_LIVENESS_ARGS))
PUSH_TIMEOUT = 300


def zipapp_bytes() -> bytes:
    """The planner as one zipapp, from this installation's own files."""
    import yaml  # noqa: PLC0415 - only the controller builds the zipapp

    root = resources.files("dscluster")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("__main__.py", MAIN)
        for name in PACKAGES:
            z.writestr(f"dscluster/{name}", "")
        for name in MODULES:
            z.writestr(f"dscluster/{name}", root.joinpath(name).read_text())
        yaml_dir = pathlib.Path(yaml.__file__).parent
        for path in sorted(yaml_dir.glob("*.py")):
            z.writestr(f"yaml/{path.name}", path.read_text())
    return buf.getvalue()


def spec_of(
    site: JobSite,
    request: LaunchRequest,
    record: RunRecord,
    staged: Sequence[str],
    *,
    push: bool,
) -> dict:
    """replan.json: the first attempt's site and request (its own run id, job directory and
    variables are each attempt's), the files to copy into each attempt's directory, and
    whether to copy that directory to the other nodes (`push`: no shared storage)."""
    return {
        "launch_id": record.launch_id,
        "jobs_dir": str(pathlib.PurePosixPath(site.job_dir).parent),
        "checkpoint_dir": record.checkpoint_dir,
        "checkpoints_shared": record.checkpoints_shared,
        "site": {
            "head": site.head,
            "venv": site.venv,
            "pool": dict(site.pool),
            "accelerators": dict(site.accelerators),
            "hostfile_text": site.hostfile_text,
            "env_text": site.env_text,
            "interface": site.interface,
        },
        "request": {
            **{f: getattr(request, f) for f in LaunchRequest.__dataclass_fields__},
            "program": list(request.program),
            "nnodes": list(request.nnodes) if request.nnodes is not None else None,
        },
        "staged": sorted(set(staged)),
        "push": push,
    }


def request_of(spec: Mapping) -> LaunchRequest:
    data = dict(spec["request"])
    data["nnodes"] = tuple(data["nnodes"]) if data.get("nnodes") is not None else None
    return LaunchRequest(**data)


def plan_next(spec: Mapping, restart: int, left: Mapping[str, str], tag: str) -> Plan:
    """Attempt `restart` of the launch: its run id and job directory, DSCLUSTER_RESTART and
    the checkpoint variables, on the site without the nodes `left` out (host -> why)."""
    run_id = f"{spec['launch_id']}-r{restart}"
    site = JobSite(
        run_id=run_id,
        job_dir=f"{spec['jobs_dir']}/{run_id}",
        job_env={
            "DSCLUSTER_RESTART": str(restart),
            "DSCLUSTER_CHECKPOINT_DIR": spec["checkpoint_dir"],
            "DSCLUSTER_CHECKPOINT_TAG": tag,
        },
        **spec["site"],
    )
    return plan_on(site, request_of(spec), left)


def next_tag(state_text: str, resumed: str, prev_ranks: int, keep: bool) -> tuple[str, str]:
    """(the tag the attempt left, the tag the next one resumes from): a tag the attempt wrote
    itself needs one ZeRO shard per rank of it (restart.shards_complete); without `keep`
    (node-local checkpoints that lost a node's shards) the next one starts over."""
    written = tag_from_state(state_text) not in ("", resumed)
    at_end = tag_from_state(state_text, prev_ranks if written else None)
    return at_end, (at_end or resumed) if keep else ""


def write_attempt(plan: Plan, first_dir: pathlib.Path, staged: Sequence[str]) -> pathlib.Path:
    """The attempt's job directory: the staged files copied from the first attempt's, then
    the plan's own files. An existing directory is refused: an attempt is planned once."""
    job_dir = pathlib.Path(plan.job_dir)
    job_dir.mkdir(mode=0o700)
    for name in staged:
        src, dest = first_dir / name, job_dir / name
        if name in plan.files or not os.path.lexists(src):
            continue
        if src.is_symlink():
            os.symlink(os.readlink(src), dest)
        elif src.is_dir():
            shutil.copytree(src, dest, symlinks=True)
        else:
            shutil.copy2(src, dest)
    for name, (text, mode) in plan.files.items():
        path = job_dir / name
        path.write_text(text)
        path.chmod(int(mode, 8))
    return job_dir


def push(plan: Plan, job_dir: pathlib.Path) -> None:
    """The attempt's directory onto the other nodes of its plan, over the training user's
    ssh (no shared storage: each node runs its ranks from its own copy)."""
    for host in plan.resources:
        if host == plan.head:
            continue
        tar = subprocess.Popen(
            ["tar", "-c", "-f", "-", "-C", str(job_dir.parent), job_dir.name],
            stdout=subprocess.PIPE,
        )
        remote = f"tar -x -p -f - -C {shlex.quote(str(job_dir.parent))}"
        got = subprocess.run(
            ["ssh", *SSH_ARGS, host, remote],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=PUSH_TIMEOUT,
            check=False,
        )
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait()
        if got.returncode != 0 or tar.returncode != 0:
            why = (got.stderr.strip().splitlines() or [f"exit {got.returncode}"])[-1]
            raise DsclusterError(f"copying {job_dir.name} to {host}: {why}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dscluster_replan.pyz")
    p.add_argument("spec")
    p.add_argument("--restart", type=int, required=True)
    p.add_argument("--prev-dir", required=True)
    p.add_argument("--prev-ranks", type=int, required=True)
    p.add_argument("--resumed", default="")
    p.add_argument("--left", default="{}")
    p.add_argument("--lost", action="store_true")
    args = p.parse_args(argv)
    try:
        spec = json.loads(pathlib.Path(args.spec).read_text())
        state = pathlib.Path(args.prev_dir, CHECKPOINT_STATE)
        text = state.read_text() if state.is_file() else ""
        keep = bool(spec["checkpoints_shared"]) or not args.lost
        at_end, tag = next_tag(text, args.resumed, args.prev_ranks, keep)
        plan = plan_next(spec, args.restart, json.loads(args.left), tag)
        job_dir = write_attempt(plan, pathlib.Path.cwd(), spec["staged"])
        if spec["push"]:
            push(plan, job_dir)
    except (DsclusterError, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "run_id": plan.run_id,
                "nodes": list(plan.resources),
                "ranks": plan.world_size,
                "resumed_from": tag,
                "tag_at_end": at_end,
                "steps": steps_of(at_end) if at_end else None,
            }
        )
    )
    return 0

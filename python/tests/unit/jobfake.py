"""A stand-in for launch.yml and the head's job supervisor, for tests of what runs around a job,
and the real supervisor run over a test's records (head_argv).

    stand_in(monkeypatch, fake)

`fake(playbook, inv, *, extravars, limit=None, **kw)` stands in for run_playbook as before
the supervisor: it writes launcher.log, exit_status and the job's outputs into
extravars["launch_fetch_dir"] (made here), maybe the supervisor's state as state.json
(STATE: its `attempts` for a launch that restarts), and returns a PlaybookResult. The follow that
run_job then makes (launch.jobs.follow) reads them back as the supervisor's record: each log
line to on_line, the other files as the job's end.
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile
import time

from dscluster.launch import jobs
from dscluster.launch import run as launch_run

from .. import rolefiles

# The stand-in's state file: merged into the job's end state, not one of the job's outputs.
STATE = "state.json"
SUPERVISOR = rolefiles.path("deepspeed_launcher", "files/dscluster_job.py")
# dscluster_job.py in a process of its own, as the head runs it, with the test's RECORDS and
# as_user prefix: python -c DRIVER RECORDS AS_USER_JSON WORDS...
DRIVER = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("dscluster_job", {str(SUPERVISOR)!r})
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
mod.RECORDS = sys.argv[1]
prefix = json.loads(sys.argv[2])
mod.as_user = lambda user: list(prefix)
sys.exit(mod.main(sys.argv[3:]))
"""


def head_argv(records, words, prefix=()) -> list[str]:
    """The argv that runs dscluster_job.py `words` over the records in `records`."""
    return [sys.executable, "-c", DRIVER, str(records), json.dumps(list(prefix)), *words]


def stand_in(monkeypatch, fake) -> dict[str, pathlib.Path]:
    """Patch run_playbook and jobs.follow; job id -> its stand-in record directory."""
    records: dict[str, pathlib.Path] = {}

    def play(playbook, inv, *, extravars, limit=None, **kw):
        job_id = pathlib.PurePosixPath(extravars["launch_job_dir"]).name
        records[job_id] = pathlib.Path(tempfile.mkdtemp(prefix="record-"))
        extravars = {**extravars, "launch_fetch_dir": str(records[job_id])}
        return fake(playbook, inv, extravars=extravars, limit=limit, **kw)

    def follow(inv, job_id, *, offset=0, on_line=None, on_state=None, on_at=None, **kw):
        record = records[job_id]
        log = record / "launcher.log"
        text = log.read_text() if log.is_file() else ""
        at = 0
        for line in text.splitlines():
            at += len(line.encode()) + 1
            if on_at is not None:
                on_at(at)
            if on_line is not None:
                on_line(line, time.time())
        skip = ("launcher.log", STATE)
        files = {p.name: p.read_text() for p in record.iterdir() if p.name not in skip}
        state = {"id": job_id, "state": "exited"}
        if (record / STATE).is_file():
            state.update(json.loads((record / STATE).read_text()))
        return jobs.Followed(jobs.JobEnd(state, files), len(text.encode()))

    monkeypatch.setattr(launch_run, "run_playbook", play)
    monkeypatch.setattr(jobs, "follow", follow)
    return records

"""The bad-input table: every case runs `dscluster.cli.main` in this process against a
fixture home and asserts the promise of the README's Errors section:

- a non-zero exit;
- exactly one line on stderr, `dscluster...: error: ...`, naming the value (`value`) and the
  fix (`fix`), with no traceback, no "internal error" (a bug) and no ANSI escapes;
- every file under the home and the cache byte-identical, and no file or directory added
  or removed;
- nothing contacted: the stub `docker`, `ssh`, `scp`, `pdsh`, `ansible-playbook` and Slurm
  commands record any call, and so does the stub AWS endpoint (AWS_ENDPOINT_URL).

Cases live in `cases_*.py` modules beside this one, each a list `CASES` of `Case`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import io
import json
import os
import pathlib
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator

from ..facts import write_facts

# Commands that reach nodes, containers or a cluster manager: stubbed, every call recorded.
CONTACT_TOOLS = (
    "docker",
    "ssh",
    "scp",
    "pdsh",
    "ansible-playbook",
    "ansible",
    "sbatch",
    "srun",
    "scontrol",
    "sinfo",
    "squeue",
    "deepspeed",
    "torchrun",
    "mpirun",
)


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    value: str  # the bad value, as the line must name it
    fix: str  # a piece of the fix the line must give
    setup: Callable[[pathlib.Path], None] | None = None  # changes the fixture home first
    env: dict[str, str] = dataclasses.field(default_factory=dict)


def make_home(home: pathlib.Path) -> None:
    """A user's working directory: an inventory `demo` with facts and launch files, a
    DeepSpeed config, a training script, the output of an earlier smoke run."""
    inv = home / "inventories" / "demo"
    (inv / "facts").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        textwrap.dedent(
            """\
            all:
              vars:
                ansible_user: root
                dscluster_cpu_slots: 2
                dscluster_master_port: 29500
              children:
                head:
                  hosts:
                    n1: {ansible_host: 10.0.0.1}
                workers:
                  hosts:
                    n2: {ansible_host: 10.0.0.2}
                    n3: {ansible_host: 10.0.0.3}
            """
        )
    )
    for i, host in enumerate(("n1", "n2", "n3"), start=1):
        write_facts(inv / "facts", host, address=f"10.0.0.{i}")
    (inv / "hostfile").write_text("# edited by hand\nn1 slots=2\nn2 slots=2\nn3 slots=2\n")
    (inv / ".deepspeed_env").write_text("OMP_NUM_THREADS=2\n")
    (home / "ds_config.json").write_text(
        json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}})
    )
    (home / "train.py").write_text("print('training')\n")
    (home / "existing.txt").write_text("keep me\n")
    (home / "adir").mkdir()
    (home / "adir" / "inside.txt").write_text("keep me too\n")


def snapshot(*roots: pathlib.Path) -> dict[str, bytes | None]:
    """Every path under the roots: file bytes, None for directories (symlinks by target)."""
    seen: dict[str, bytes | None] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            base = pathlib.Path(dirpath)
            seen[str(base)] = None
            for name in filenames:
                path = base / name
                seen[str(path)] = (
                    f"-> {os.readlink(path)}".encode() if path.is_symlink() else path.read_bytes()
                )
            for name in dirnames:
                if (base / name).is_symlink():
                    seen[str(base / name)] = f"-> {os.readlink(base / name)}".encode()
    return seen


class _Recorder(http.server.BaseHTTPRequestHandler):
    calls: list[str]

    def _any(self) -> None:
        self.calls.append(f"{self.command} {self.path}")
        body = b"<Error><Code>InternalError</Code><Message>stub</Message></Error>"
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _any

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def aws_stub() -> Iterator[tuple[str, list[str]]]:
    """An HTTP endpoint that records every request and answers 500."""
    calls: list[str] = []
    handler = type("Recorder", (_Recorder,), {"calls": calls})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # shutdown() waits for the loop's next poll: 0.5 s by default, in every one of the cases.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()
        server.server_close()


def stub_bin(directory: pathlib.Path, log: pathlib.Path) -> None:
    directory.mkdir(parents=True)
    for name in CONTACT_TOOLS:
        path = directory / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit 1\n')
        path.chmod(0o755)


@dataclasses.dataclass
class Outcome:
    rc: int
    stdout: str
    stderr: str
    calls: list[str]


def run_case(case: Case, tmp: pathlib.Path, monkeypatch, capsys) -> Outcome:
    """Run one case and check everything but the message; return what it printed."""
    from dscluster import cli, util  # noqa: PLC0415

    home, cache, stubs = tmp / "home", tmp / "cache", tmp / "stubs"
    log = tmp / "calls.log"
    home.mkdir()
    cache.mkdir()
    make_home(home)
    if case.setup is not None:
        case.setup(home)
    stub_bin(stubs, log)
    real_tool = util.tool

    def tool(name: str) -> str:
        return str(stubs / name) if name in CONTACT_TOOLS else real_tool(name)

    import ansible_runner  # noqa: PLC0415

    def no_playbook(**kwargs: object) -> None:
        with log.open("a") as fh:
            fh.write(f"ansible-runner {kwargs.get('playbook')}\n")
        raise RuntimeError("a playbook ran before the refusal")

    monkeypatch.setattr(ansible_runner, "run", no_playbook)
    # Modules that imported util.tool by name resolve through the stub too.
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("dscluster") and (
            getattr(module, "tool", None) is real_tool
        ):
            monkeypatch.setattr(module, "tool", tool)
    with aws_stub() as (endpoint, aws_calls):
        monkeypatch.chdir(home)
        monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("DSCLUSTER_CACHE", str(cache))
        monkeypatch.delenv("DSCLUSTER_HOME", raising=False)
        monkeypatch.delenv("DSCLUSTER_DEBUG", raising=False)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            monkeypatch.delenv(key)
        for key, value in case.env.items():
            monkeypatch.setenv(key, value)
        before = snapshot(home, cache)
        capsys.readouterr()
        monkeypatch.setattr(sys, "stdin", io.StringIO(""))
        try:
            rc = cli.main(case.argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        after = snapshot(home, cache)
        calls = list(aws_calls)
    if log.exists():
        calls += log.read_text().splitlines()
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(p for p in before.keys() & after.keys() if before[p] != after[p])
    assert not (added or removed or changed), (
        f"files changed: added {added}, removed {removed}, changed {changed}\n{captured.err}"
    )
    return Outcome(int(rc), captured.out, captured.err, calls)


def check_one_line(case: Case, outcome: Outcome) -> str:
    assert outcome.rc != 0, f"exit 0 for {case.argv}: {outcome.stdout}{outcome.stderr}"
    assert not outcome.calls, f"contacted before refusing: {outcome.calls}"
    lines = [ln for ln in outcome.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"not one line:\n{outcome.stderr}"
    line = lines[0]
    assert line.startswith("dscluster") and "error:" in line, line
    assert "Traceback" not in line and "internal error" not in line, line
    assert "\x1b" not in line, repr(line)
    assert case.value in line, f"the line does not name {case.value!r}: {line}"
    assert case.fix in line, f"the line does not give the fix {case.fix!r}: {line}"
    return line

"""`dscluster launch --workdir DIR`: which files of the project travel (.gitignore, .git,
symlinks, size), the tarball, the refusals before anything runs, and the job it stages."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shlex
import subprocess
import tarfile

import pytest
import yaml

from dscluster.errors import DsclusterError
from dscluster.launch import workdir
from dscluster.runner import PlaybookResult

from .. import rolefiles
from .clirun import run_cli, run_main
from .jobfake import stand_in


def make_project(root: pathlib.Path) -> pathlib.Path:
    files = {
        "train.py": "print('train')\n",
        "ds_config.json": "{}\n",
        "src/model.py": "X = 1\n",
        "src/__pycache__/model.cpython-312.pyc": "junk",
        "data/shard0.bin": "big",
        "ckpt.pt": "weights",
        "sub/.gitignore": "!keep.pt\nlocal/\n",
        "sub/keep.pt": "kept",
        "sub/local/x.txt": "ignored below sub",
        ".git/HEAD": "ref: refs/heads/main\n",
        ".gitignore": "__pycache__/\ndata/\n*.pt\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "src" / "alias.py").symlink_to("model.py")
    return root


def test_project_follows_nested_gitignores_and_leaves_git_out(tmp_path):
    project = workdir.scan(str(make_project(tmp_path / "proj")))
    assert sorted(project.entries) == [
        ".gitignore",
        "ds_config.json",
        "run.sh",
        "src/alias.py",
        "src/model.py",
        "sub/.gitignore",
        "sub/keep.pt",
        "train.py",
    ]
    assert project.describe() == f"8 files from {(tmp_path / 'proj').resolve()}"


def test_tarball_is_deterministic_with_modes_and_inner_links(tmp_path):
    project = workdir.scan(str(make_project(tmp_path / "proj")))
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    workdir.write_tar(project, a)
    workdir.write_tar(project, b)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    with tarfile.open(a) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert members["run.sh"].mode == 0o755
        assert members["train.py"].mode == 0o644
        assert members["src"].isdir()
        assert members["src/alias.py"].issym() and members["src/alias.py"].linkname == "model.py"
        assert {m.uid for m in members.values()} == {0}
        tar.extractall(tmp_path / "job", filter="tar")
    assert (tmp_path / "job" / "src" / "alias.py").read_text() == "X = 1\n"
    assert os.access(tmp_path / "job" / "run.sh", os.X_OK)


def test_symlink_out_of_the_project_is_refused(tmp_path):
    root = make_project(tmp_path / "proj")
    (tmp_path / "secret").write_text("s")
    (root / "src" / "leak.txt").symlink_to(tmp_path / "secret")
    with pytest.raises(DsclusterError, match=r"src/leak.txt links to .*secret, outside"):
        workdir.scan(str(root))
    # ... unless .gitignore leaves it out
    (root / ".gitignore").write_text("src/leak.txt\n")
    assert "src/leak.txt" not in workdir.scan(str(root)).entries


def test_oversized_project_names_its_biggest_files(tmp_path, monkeypatch):
    root = make_project(tmp_path / "proj")
    (root / "weights.bin").write_bytes(b"\0" * (3 * 2**20))
    monkeypatch.setattr(workdir, "MAX_PROJECT_BYTES", 2**20)
    with pytest.raises(DsclusterError) as exc:
        workdir.scan(str(root))
    msg = str(exc.value)
    assert "\n" not in msg
    assert "3 MiB of files, over the 1 MiB" in msg
    assert "biggest: weights.bin (3 MiB)" in msg
    assert ".gitignore" in msg


def test_script_must_be_a_project_file(tmp_path):
    root = make_project(tmp_path / "proj")
    project, rel = workdir.project_for(str(root), "src/model.py")
    assert rel == "src/model.py"
    assert workdir.script_in(project, str(root), str(root / "train.py")) == "train.py"
    for script in ("missing.py", "ckpt.pt", "../outside.py", str(tmp_path / "x.py")):
        with pytest.raises(DsclusterError, match="not a file of the project"):
            workdir.script_in(project, str(root), script)


def test_job_file_names_collide(tmp_path):
    root = make_project(tmp_path / "proj")
    (root / "hostfile").write_text("mine\n")
    with pytest.raises(DsclusterError, match="hostfile is a name dscluster's job files use"):
        workdir.project_for(str(root), "train.py")
    (root / "hostfile").unlink()
    project = workdir.scan(str(root))
    with pytest.raises(DsclusterError, match="src is a name"):
        workdir.check_names(project, ["src"])


def test_cli_refuses_before_anything_runs(tmp_path, inventory_dir):
    root = make_project(tmp_path / "proj")
    base = ["launch", "-i", str(inventory_dir), "--workdir"]
    cases = [
        ([str(root / "train.py"), "--", "train.py"], "not a directory"),
        ([str(root), "--", "nope.py"], "not a file of the project"),
        ([str(root), "--no-stage", "--", "/opt/train.py"], "--no-stage"),
    ]
    for argv, message in cases:
        rc, _, err = run_main(*base, *argv)
        assert rc == 2, err
        assert err.count("\n") == 1 and message in err, err
    assert not (inventory_dir / "logs").exists()


def test_dry_run_runs_the_script_relative_to_the_project(tmp_path, inventory_dir):
    root = make_project(tmp_path / "proj")
    rc, out, err = run_cli(
        "launch", "-i", str(inventory_dir), "--workdir", str(root), "--dry-run",
        "--", "train.py", "--deepspeed", "ds_config.json",
    )  # fmt: skip
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[1].endswith(" train.py --deepspeed ds_config.json")
    assert lines[-1] == f"# ships 8 files from {root.resolve()}"


def test_launch_stages_the_tarball_and_reports_where_it_ran(tmp_path, inventory_dir, monkeypatch):
    root = make_project(tmp_path / "proj")
    seen = {}

    def fake_playbook(playbook, inv, *, extravars, **kw):
        stage = pathlib.Path(extravars["launch_stage_dir"])
        seen.update(extravars)
        with tarfile.open(stage / extravars["launch_job_tar"]) as tar:
            seen["members"] = [(m.name, m.mode) for m in tar.getmembers()]
        fetched = pathlib.Path(extravars["launch_fetch_dir"])
        (fetched / "launcher.log").write_text("node-a: train\n")
        (fetched / "exit_status").write_text("0\n")
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, fake_playbook)
    rc, _, err = run_cli(
        "launch", "-i", str(inventory_dir), "--workdir", str(root), "--no-doctor",
        "--", "train.py", "--deepspeed", "ds_config.json",
    )  # fmt: skip
    assert rc == 0, err
    assert seen["launch_job_tar"] == workdir.JOB_TAR
    job_dir = seen["launch_job_dir"]
    assert job_dir.rsplit("/", 1)[1].startswith("launch-")
    # one tarball: the job directory, the project in it, the job's own files beside it
    top = job_dir.rsplit("/", 1)[1]
    assert seen["members"][0] == (top, 0o700)  # the training user's alone
    modes = {name.removeprefix(f"{top}/"): mode for name, mode in seen["members"][1:]}
    assert all(name.startswith(f"{top}/") for name, _ in seen["members"][1:])
    assert len(modes) == len(seen["members"]) - 1  # no name twice: nothing overwrites
    assert "src/model.py" in modes and "ckpt.pt" not in modes
    assert (modes["run.sh"], modes["train.py"], modes["launch.sh"]) == (0o755, 0o644, 0o755)
    project = set(workdir.scan(str(root)).entries)
    assert not project & workdir.JOB_FILE_NAMES
    assert {"launch.sh", "hostfile", ".deepspeed_env"} <= set(modes) - project
    line = err.strip().splitlines()[-1]
    assert line.startswith("launch launch-") and "job exited 0; log " in line
    assert line.endswith(f"; ran in {job_dir} on node-a (8 files from {root.resolve()})")


def test_without_workdir_only_the_script_is_staged(tmp_path, inventory_dir, monkeypatch):
    script = make_project(tmp_path / "proj") / "train.py"
    seen = {}

    def fake_playbook(playbook, inv, *, extravars, **kw):
        seen.update(extravars)
        with tarfile.open(pathlib.Path(extravars["launch_stage_dir"]) / workdir.JOB_TAR) as tar:
            seen["names"] = tar.getnames()
        (pathlib.Path(extravars["launch_fetch_dir"]) / "exit_status").write_text("0\n")
        return PlaybookResult(status="successful", rc=0, hosts={}, failures=[])

    stand_in(monkeypatch, fake_playbook)
    rc, _, err = run_cli("launch", "-i", str(inventory_dir), "--no-doctor", "--", str(script))
    assert rc == 0, err
    top = seen["launch_job_dir"].rsplit("/", 1)[1]
    staged = {name.removeprefix(f"{top}/") for name in seen["names"][1:]}
    assert "train.py" in staged
    assert staged - {"train.py"} <= workdir.JOB_FILE_NAMES  # the script and the job's files
    assert err.strip().splitlines()[-1].endswith(f"; ran in {seen['launch_job_dir']} on node-a")


def test_job_tarball_unpacks_as_the_job_directory_with_its_modes(tmp_path):
    """What launch.yml's tar gets: GNU tar (as on the nodes, -p as there) makes the job
    directory from it (0700), the project inside, the job's files with their modes beside it."""
    project = workdir.scan(str(make_project(tmp_path / "proj")))
    tar = tmp_path / workdir.JOB_TAR
    files = {"launch.sh": (b"#!/bin/bash\necho hi\n", 0o755), "hostfile": (b"a slots=1\n", 0o644)}
    workdir.write_job_tar(tar, "launch-1", files, project)
    (tmp_path / "jobs").mkdir()
    subprocess.run(["tar", "-x", "-p", "-f", str(tar), "-C", str(tmp_path / "jobs")], check=True)
    job = tmp_path / "jobs" / "launch-1"
    assert job.stat().st_mode & 0o777 == 0o700
    assert (job / "launch.sh").read_bytes() == b"#!/bin/bash\necho hi\n"
    assert os.access(job / "launch.sh", os.X_OK) and not os.access(job / "hostfile", os.X_OK)
    assert (job / "src" / "alias.py").read_text() == "X = 1\n"  # the project's inner link
    assert os.access(job / "run.sh", os.X_OK)
    assert sorted(p.name for p in job.iterdir()) == sorted(
        {*files, *(rel.split("/")[0] for rel in project.entries)}
    )


def shell_commands(cmd: str) -> list[list[str]]:
    """The simple commands of a templated shell line: each Jinja expression one word
    (JINJA<i> with its variable's name), split at ; | || && and the loop's keywords."""
    exprs: list[str] = []

    def word(m: re.Match[str]) -> str:
        exprs.append(m[1])
        return f"JINJA{len(exprs) - 1}_{m[1].split('|')[0].strip()}"

    lexer = shlex.shlex(re.sub(r"\{\{(.*?)\}\}", word, cmd), posix=True, punctuation_chars=";|&")
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in (";", "|", "||", "&&") or (not commands[-1] and token in ("do", "done")):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def test_job_files_are_written_and_read_back_as_the_training_user():
    """Every module of launch.yml runs as root (no module result of the training user's),
    yet nothing in the job area is opened by root: the tarball is unpacked by the training
    user's tar, and every command that names the job directory runs under `runuser` as that
    user. Where the head mounts the share from a [storage] node with root_squash, root is
    nobody there and may not enter the user's job area. The log and outputs come back from
    root's own record. (No kernel NFS server on the test machines to show it end to end; the
    e2e launch tests run this play as it is.)"""
    plays = yaml.safe_load((rolefiles.REPO / "playbooks" / "launch.yml").read_text())
    tasks = {t["name"]: t for play in plays for t in play.get("tasks", [])}
    tasks |= {t["name"]: t for play in plays for b in play.get("tasks", [])
              for t in b.get("block", []) + b.get("always", [])}  # fmt: skip
    unpack = tasks["Unpack the job's files into the job directory, as the training user"]
    assert all("become_user" not in t for t in tasks.values())
    body = unpack["ansible.builtin.shell"]
    assert body["chdir"] == "/"
    named = [c for c in shell_commands(body["cmd"]) if any("launch_job_dir" in w for w in c)]
    assert named, body["cmd"]
    for command in named:
        assert command[:2] == ["runuser", "-u"] and command[3] == "--", command
        assert command[2].endswith("_dscluster_training_user"), command
    tar = next(c for c in shell_commands(unpack["ansible.builtin.shell"]["cmd"]) if "tar" in c)
    assert tar[4:6] == ["tar", "-x"]
    # The job runs under root's supervisor, started by root's system Python in isolated mode
    # from root's directory; it runs launch.sh as the training user, and reads the job's
    # outputs as that user too (its own record is root's).
    start = tasks["Start the job supervisor"]["ansible.builtin.command"]
    assert start["argv"][:3] == ["/usr/bin/python3", "-I", "/opt/dscluster/bin/dscluster_job.py"]
    assert start["chdir"] == "/"
    job = rolefiles.load("deepspeed_launcher", "dscluster_job.py")
    spec = {"user": "ds", "dir": "/shared/dscluster/jobs/launch-x", "timeout": 0}
    assert job.launcher_argv(spec)[:4] == ["runuser", "-u", "ds", "--"]
    assert job.launcher_argv(spec)[-2:] == ["/shared/dscluster/jobs/launch-x", "./launch.sh"]
    source = rolefiles.path("deepspeed_launcher", "files/dscluster_job.py").read_text()
    uses = [i for i in range(len(source)) if source.startswith('spec["dir"]', i)]
    # each inside a command that starts as the training user (a few lines up at most), or a
    # path kept for such commands: the first attempt's directory and the next one's, beside
    # it (new_attempt; launch --max-restarts)
    commands = {i for i in uses if "*as_user(" in source[i - 200 : i]}
    kept = {i for i in uses if "new_attempt(" in source[i - 100 : i + 100]}
    assert len(uses) == 4 and len(commands) == 2 and commands | kept == set(uses)
    # the attempts' directories reach commands the same way (the log's copy, launch.sh)
    assert "*as_user(" in source[source.index("def copy_to_job_dir(") :][:600]
    assert job.RECORDS == "/var/lib/dscluster/jobs"
    record = next(p for p in plays if p["name"] == "Start the job on the head")
    assert record["vars"]["__launch_record"].startswith("/var/lib/dscluster/jobs/")

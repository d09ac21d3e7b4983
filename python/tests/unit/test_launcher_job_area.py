"""deepspeed_launcher's job area (tasks/configure.yml): one reading of the directories
(files/dir_state.py), then each write skipped while its directory already reads as the write
would leave it: a missing directory, another mode or another owner runs the module again,
which mends it. On shared storage the shared writer's reading decides the job area."""

from __future__ import annotations

import os
import pathlib
import pwd
import re
import sys

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "launcher_job_area.yml"
PARENTS = "Create the parents of the node-local directories"
SCRATCH = "Create the node-local scratch directory"
AREA = "Create the job area and the checkpoint directory"
USER = pwd.getpwuid(os.getuid()).pw_name


def play(root: pathlib.Path, storage: str = "none") -> tuple[int, dict | None, str]:
    """configure.yml on localhost with the directories under root: rc, reading, output."""
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(rolefiles.ROLES))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "deepspeed_launcher_user": USER,
        "deepspeed_launcher_shared_storage": storage,
        "deepspeed_launcher_shared_writer": "localhost",
        "deepspeed_launcher_scratch_dir": str(root / "local" / "scratch"),
        "deepspeed_launcher_job_root": str(root / "shared" / "jobs"),
        "deepspeed_launcher_checkpoint_dir": str(root / "node" / "ckpt" / "checkpoints"),
    }
    return rolefiles.run_local_play(PLAYBOOK, extra, "AREA", env=env)


def run(root: pathlib.Path, storage: str = "none") -> tuple[dict, dict[str, str]]:
    """One run that must pass: the reading, and each write's status ('changed', 'ok',
    'skipping'; a loop's 'changed' where any item changed)."""
    rc, seen, out = play(root, storage)
    assert rc == 0 and seen is not None, out
    status = {}
    for name in (PARENTS, SCRATCH, AREA):
        block = out.split(f"TASK [deepspeed_launcher : {name}]", 1)[1].split("TASK [", 1)[0]
        found = set(re.findall(r"^(changed|ok|skipping):", block, re.M))
        assert found, block[:2000]
        status[name] = "changed" if "changed" in found else found.pop()
    return seen, status


def mode(path: pathlib.Path) -> str:
    return oct(path.stat().st_mode & 0o7777)


def test_the_job_area_is_made_then_skipped_until_a_directory_differs(tmp_path):
    scratch = tmp_path / "local" / "scratch"
    jobs = tmp_path / "shared" / "jobs"
    ckpt = tmp_path / "node" / "ckpt" / "checkpoints"
    (tmp_path / "shared").mkdir()
    seen, status = run(tmp_path)
    assert seen[str(scratch)] is None and seen[str(jobs)] is None
    assert status == {PARENTS: "changed", SCRATCH: "changed", AREA: "changed"}
    assert [mode(scratch), mode(jobs), mode(ckpt)] == ["0o750", "0o755", "0o755"]
    assert mode(ckpt.parent) == "0o755"
    # converged: the reading says so, every write skipped
    seen, status = run(tmp_path)
    assert seen[str(scratch)] == {"isdir": True, "owner": USER, "mode": "0750"}
    assert set(status.values()) == {"skipping"}
    # the scratch directory opened to others: the file module closes it again, alone
    scratch.chmod(0o777)
    _, status = run(tmp_path)
    assert status == {PARENTS: "skipping", SCRATCH: "changed", AREA: "skipping"}
    assert mode(scratch) == "0o750"
    # the checkpoint directory and its parent gone: both made again
    ckpt.rmdir()
    ckpt.parent.rmdir()
    _, status = run(tmp_path)
    assert status == {PARENTS: "changed", SCRATCH: "skipping", AREA: "changed"}
    assert mode(ckpt) == "0o755"
    # a plain file where the job area belongs: not taken for it (the module then refuses it)
    jobs.rmdir()
    jobs.write_text("")
    rc, _, out = play(tmp_path)
    assert rc != 0
    refused = rf"failed: \[localhost\] \(item={re.escape(str(jobs))}\).*already exists as a file"
    assert re.search(refused, out), out
    jobs.unlink()


def test_on_shared_storage_the_writers_reading_decides_the_job_area(tmp_path):
    jobs = tmp_path / "shared" / "jobs"
    (tmp_path / "shared").mkdir()
    _, status = run(tmp_path, storage="nfs")
    # on shared storage the checkpoint directory's parent is not made as a node-local one
    assert status == {PARENTS: "changed", SCRATCH: "changed", AREA: "changed"}
    assert mode(jobs) == "0o755"
    seen, status = run(tmp_path, storage="nfs")
    # the shared writer reads the job area (a node that is not the writer leaves it out)
    assert seen[str(jobs)] == {"isdir": True, "owner": USER, "mode": "0755"}
    assert set(status.values()) == {"skipping"}
    jobs.rmdir()
    _, status = run(tmp_path, storage="nfs")
    assert status == {PARENTS: "skipping", SCRATCH: "skipping", AREA: "changed"}
    assert mode(jobs) == "0o755"


def test_both_directory_readings_say_what_the_file_module_would_leave(tmp_path):
    """dir_state.py (this role) and record_versions.py's DIR arguments (ml_stack's reading
    before installing) read a directory the same way: owner by name (the uid where no account
    has it), the permission bits as a file module's mode, a file as no directory, null where
    nothing is."""
    made = tmp_path / "made"
    made.mkdir(mode=0o750)
    made.chmod(0o2750)  # setgid: the file module's 0750 would clear it, so it must differ
    plain = tmp_path / "plain"
    plain.write_text("")
    plain.chmod(0o644)
    orphan = tmp_path / "orphan"
    orphan.mkdir()
    orphan.chmod(0o755)
    taken = {p.pw_uid for p in pwd.getpwall()}
    free_uid = next(uid for uid in range(54321, 60000) if uid not in taken)
    if os.getuid() == 0:
        os.chown(orphan, free_uid, -1)
    paths = [str(made), str(plain), str(orphan), str(tmp_path / "missing")]
    launcher = rolefiles.run_inline("deepspeed_launcher", "dir_state.py", paths)
    versions = rolefiles.load("ml_stack", "record_versions.py")
    assert launcher == {path: versions.dir_state(path) for path in paths}
    assert launcher[str(made)] == {"isdir": True, "owner": USER, "mode": "2750"}
    assert launcher[str(plain)] == {"isdir": False, "owner": USER, "mode": "0644"}
    owner = str(free_uid) if os.getuid() == 0 else USER
    assert launcher[str(orphan)] == {"isdir": True, "owner": owner, "mode": "0755"}
    assert launcher[str(tmp_path / "missing")] is None

"""deepspeed_launcher's job area (tasks/configure.yml, the cluster_dirs module): the
directories and their parents made once, nothing changed on a converged node, a mode or a
missing directory mended; and what the training user could plant on the way (a link, a
directory of its own, a parent it can write) refused in one line, nothing followed."""

from __future__ import annotations

import os
import pathlib
import pwd
import re

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "launcher_job_area.yml"
LOCAL = "Make the node-local directories"
AREA = "Make the job area and the checkpoint directory on shared storage"
USER = pwd.getpwuid(os.getuid()).pw_name


def play(root: pathlib.Path, storage: str = "none") -> tuple[int, str]:
    """configure.yml on localhost with the directories under root: rc and output."""
    extra = {
        "deepspeed_launcher_user": USER,
        "deepspeed_launcher_shared_storage": storage,
        "deepspeed_launcher_shared_writer": "localhost",
        "deepspeed_launcher_scratch_dir": str(root / "local" / "scratch"),
        "deepspeed_launcher_job_root": str(root / "shared" / "jobs"),
        "deepspeed_launcher_checkpoint_dir": str(root / "node" / "ckpt" / "checkpoints"),
    }
    rc, _, out = rolefiles.run_module_play(
        PLAYBOOK, extra, "DONE", ANSIBLE_ROLES_PATH=str(rolefiles.ROLES)
    )
    return rc, out


def run(root: pathlib.Path, storage: str = "none") -> dict[str, str]:
    """One run that must pass: each task's status ('changed', 'ok', 'skipping')."""
    rc, out = play(root, storage)
    assert rc == 0, out
    status = {}
    for name in (LOCAL, AREA):
        block = out.split(f"TASK [deepspeed_launcher : {name}]", 1)[1].split("TASK [", 1)[0]
        found = set(re.findall(r"^(changed|ok|skipping):", block, re.M))
        assert found, block[:2000]
        status[name] = "changed" if "changed" in found else found.pop()
    return status


def mode(path: pathlib.Path) -> str:
    return oct(path.stat().st_mode & 0o7777)


def test_the_job_area_is_made_then_left_alone_until_a_directory_differs(tmp_path):
    scratch = tmp_path / "local" / "scratch"
    jobs = tmp_path / "shared" / "jobs"
    ckpt = tmp_path / "node" / "ckpt" / "checkpoints"
    (tmp_path / "shared").mkdir()
    assert run(tmp_path) == {LOCAL: "changed", AREA: "skipping"}
    # the job area and the checkpoints are the training user's alone (SECURITY.md)
    assert [mode(scratch), mode(jobs), mode(ckpt)] == ["0o750", "0o700", "0o700"]
    assert mode(ckpt.parent) == "0o755" and ckpt.parent.stat().st_uid == 0
    # converged: nothing changes
    assert run(tmp_path) == {LOCAL: "ok", AREA: "skipping"}
    # the scratch directory opened to others: closed again
    scratch.chmod(0o777)
    assert run(tmp_path)[LOCAL] == "changed"
    assert mode(scratch) == "0o750"
    # the checkpoint directory and its parent gone: both made again
    ckpt.rmdir()
    ckpt.parent.rmdir()
    assert run(tmp_path)[LOCAL] == "changed"
    assert mode(ckpt) == "0o700"
    # a plain file where the job area belongs: refused, left as it is
    jobs.rmdir()
    jobs.write_text("")
    rc, out = play(tmp_path)
    assert rc != 0
    assert f"cluster_dirs: {jobs} is not a directory" in out, out
    assert jobs.is_file()
    jobs.unlink()


def test_on_shared_storage_the_writer_makes_the_job_area(tmp_path):
    jobs = tmp_path / "shared" / "jobs"
    (tmp_path / "shared").mkdir()
    assert run(tmp_path, storage="nfs") == {LOCAL: "changed", AREA: "changed"}
    # on shared storage the checkpoint directory's parent is made by the writer, with it
    assert mode(jobs) == "0o700"
    assert run(tmp_path, storage="nfs") == {LOCAL: "ok", AREA: "ok"}
    jobs.rmdir()
    assert run(tmp_path, storage="nfs") == {LOCAL: "ok", AREA: "changed"}
    assert mode(jobs) == "0o700"


def test_what_the_training_user_plants_is_refused_never_followed(tmp_path):
    """The shared tree as the old NFS default left it (its root writable by the training
    user): that user renames the tree and plants links to system directories where root makes
    the job area. Root refuses in one line naming the path; the targets keep their owner and
    mode. A link in place of a leaf, and a leaf of another user, are refused as well."""
    if os.getuid() != 0:
        return
    target = tmp_path / "etc"
    target.mkdir(mode=0o755)
    (tmp_path / "shared").mkdir()
    os.chown(tmp_path / "shared", 2000, 2000)
    (tmp_path / "shared").chmod(0o2775)
    rc, out = play(tmp_path, storage="nfs")
    assert rc != 0
    assert f"cluster_dirs: {tmp_path / 'shared'} belongs to " in out, out
    assert not (tmp_path / "shared" / "jobs").exists()

    os.chown(tmp_path / "shared", 0, 0)
    (tmp_path / "shared").chmod(0o755)
    (tmp_path / "shared" / "jobs").symlink_to(target)
    rc, out = play(tmp_path, storage="nfs")
    assert rc != 0
    assert f"cluster_dirs: {tmp_path / 'shared' / 'jobs'} is a symbolic link" in out, out
    st = target.stat()
    assert (st.st_uid, mode(target)) == (0, "0o755")

    (tmp_path / "shared" / "jobs").unlink()
    (tmp_path / "shared" / "jobs").mkdir()
    os.chown(tmp_path / "shared" / "jobs", 65534, 65534)
    rc, out = play(tmp_path, storage="nfs")
    assert rc != 0
    assert "belongs to nobody" in out, out
    assert (tmp_path / "shared" / "jobs").stat().st_uid == 65534

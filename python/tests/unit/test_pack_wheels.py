"""roles/ml_stack/files/pack_wheels.py, run as the role runs it on the controller: the wheels
each node lacks go into one archive per distinct set, owned by root, mode 0644."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tarfile

from .. import rolefiles

PACK = rolefiles.path("ml_stack", "files/pack_wheels.py")


def pack(
    src: pathlib.Path, out: pathlib.Path, sets: list, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PACK), str(src), str(out), *extra],
        input=json.dumps(sets),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wheelhouse(tmp_path: pathlib.Path) -> pathlib.Path:
    src = tmp_path / "wheelhouse"
    src.mkdir()
    for name, body in {"a-1-py3-none-any.whl": b"a" * 1000, "b-2-py3-none-any.whl": b"bb"}.items():
        (src / name).write_bytes(body)
        (src / name).chmod(0o600)
    return src


def test_nodes_lacking_the_same_wheels_share_one_archive(tmp_path):
    src, out = wheelhouse(tmp_path), tmp_path / "out"
    out.mkdir()
    both = ["b-2-py3-none-any.whl", "a-1-py3-none-any.whl"]
    proc = pack(src, out, [both, list(reversed(both)), ["a-1-py3-none-any.whl"], []])
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    # two distinct sets (order does not matter), none for a node that lacks nothing
    assert sorted(made) == ["a-1-py3-none-any.whl", "a-1-py3-none-any.whl b-2-py3-none-any.whl"]
    assert len(list(out.iterdir())) == 2
    with tarfile.open(made["a-1-py3-none-any.whl b-2-py3-none-any.whl"]) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == both[::-1]
        for m in members.values():
            assert (m.mode, m.uid, m.gid, m.uname, m.gname) == (0o644, 0, 0, "root", "root")
        assert tar.extractfile("a-1-py3-none-any.whl").read() == b"a" * 1000


def test_a_name_that_is_not_a_wheel_in_the_directory_is_refused(tmp_path):
    src, out = wheelhouse(tmp_path), tmp_path / "out"
    out.mkdir()
    for bad in ("../a-1-py3-none-any.whl", ".hidden.whl", "requirements.lock"):
        proc = pack(src, out, [["a-1-py3-none-any.whl"], [bad]])
        assert proc.returncode != 0
        assert repr(bad) in proc.stderr + proc.stdout
        assert list(out.iterdir()) == []  # refused before any archive was begun


def test_the_layer_locks_close_every_archive_after_its_wheels(tmp_path):
    src, out = wheelhouse(tmp_path), tmp_path / "out"
    out.mkdir()
    (src / "requirements.lock").write_text("a==1\n")
    (src / "lock.json").write_text('{"wheels": {}}')
    (src / "lock.json").chmod(0o600)
    sets = [["b-2-py3-none-any.whl", "a-1-py3-none-any.whl"], ["b-2-py3-none-any.whl"], []]
    proc = pack(src, out, sets, "requirements.lock", "lock.json")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    assert len(made) == 2  # still one archive per distinct set, none for the empty one
    for key, archive in made.items():
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            assert [m.name for m in members] == [*key.split(), "requirements.lock", "lock.json"]
            for m in members:
                assert (m.mode, m.uid, m.gid, m.uname, m.gname) == (0o644, 0, 0, "root", "root")
            assert tar.extractfile("requirements.lock").read() == b"a==1\n"


def test_a_lock_that_is_not_a_plain_file_beside_the_wheels_is_refused(tmp_path):
    src, out = wheelhouse(tmp_path), tmp_path / "out"
    out.mkdir()
    (src / "lock.json").write_text("{}")
    (tmp_path / "outside.lock").write_text("x")
    for bad in ("requirements.lock", "../outside.lock", ".lock", "a-1-py3-none-any.whl", ""):
        proc = pack(src, out, [["a-1-py3-none-any.whl"]], "lock.json", bad)
        assert proc.returncode != 0, bad
        assert repr(bad) in proc.stderr + proc.stdout
        assert list(out.iterdir()) == []  # refused before any archive was begun

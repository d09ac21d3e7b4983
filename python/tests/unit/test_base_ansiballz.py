"""roles/base/files/dscluster_ansiballz.py, loaded as the base role loads it on a node (a .pth
file in a site directory), against zips laid out as Ansible's module payloads are
(<tmp>/ansible_<module>_payload.zip, the module and module_utils inside): what it caches,
that a later run with another payload path uses the cache under that path's name, and what it
refuses to trust."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import marshal
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

from tests import rolefiles

HOOK = rolefiles.path("base", "files/dscluster_ansiballz.py")
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"
SOURCES = {
    "ansible/__init__.py": "",
    "ansible/module_utils/__init__.py": "",
    "ansible/module_utils/probe.py": (
        "VALUE = 'compiled'\n\ndef fail():\n    raise RuntimeError('from the payload')\n"
    ),
}
# Imports the probe from the payload and reports what it got and where its code says it is.
RUN = """
import json, site, sys, traceback
site.addsitedir(sys.argv[1])
sys.path.insert(0, sys.argv[2])
from ansible.module_utils import probe
try:
    probe.fail()
except RuntimeError as exc:
    where = traceback.extract_tb(exc.__traceback__)[-1].filename
print(json.dumps({"value": probe.VALUE, "where": where, "file": probe.__file__}))
"""


@pytest.fixture
def site_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A site directory holding the hook and its .pth, as the base role installs them."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "dscluster_ansiballz.py").write_text(HOOK.read_text())
    (site / "dscluster_ansiballz.pth").write_text("import dscluster_ansiballz\n")
    return site


def payload(
    tmp_path: pathlib.Path, run: str, name: str = "ansible_probe_payload.zip"
) -> pathlib.Path:
    """A payload zip in its own temporary directory, as each Ansible module run has."""
    where = tmp_path / f"ansible_probe_payload_{run}"
    where.mkdir()
    zipped = where / name
    with zipfile.ZipFile(zipped, "w") as z:
        for arcname, text in SOURCES.items():
            z.writestr(arcname, text)
    return zipped


def cache_dir(tmp_path: pathlib.Path, mode: int = 0o755) -> pathlib.Path:
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    cache.chmod(mode)
    return cache


def run(site: pathlib.Path, zipped: pathlib.Path, cache: pathlib.Path, user: int | None = None):
    env = dict(os.environ, DSCLUSTER_ANSIBALLZ_CACHE=str(cache), PYTHONDONTWRITEBYTECODE="1")
    # another user runs the node's own python3 (this venv's may lie where it cannot reach)
    python = sys.executable if user is None else SYSTEM_PYTHON
    proc = subprocess.run(
        [python, "-c", RUN, str(site), str(zipped)],
        capture_output=True, text=True, env=env, timeout=60, check=False,
        preexec_fn=None if user is None else (lambda: os.setuid(user)),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # the .pth loaded without complaint
    return json.loads(proc.stdout)


def entry(cache: pathlib.Path, arcname: str) -> pathlib.Path:
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + SOURCES[arcname].encode()).hexdigest()
    return cache / key


def plant(cache: pathlib.Path, arcname: str, source: str) -> None:
    """Replace the cached code of arcname with that of another source (to see it is used)."""
    code = compile(source, "<planted>", "exec", dont_inherit=True)
    entry(cache, arcname).write_bytes(importlib.util.MAGIC_NUMBER + marshal.dumps(code))


def test_first_run_fills_the_cache_and_a_later_payload_path_uses_it(tmp_path, site_dir):
    cache = cache_dir(tmp_path)
    first = payload(tmp_path, "1")
    got = run(site_dir, first, cache)
    assert got["value"] == "compiled"
    assert got["where"] == str(first / "ansible/module_utils/probe.py")
    # one entry per source imported from the payload, the interpreter's magic first
    assert {p.name for p in cache.iterdir()} == {entry(cache, a).name for a in SOURCES}
    data = entry(cache, "ansible/module_utils/probe.py").read_bytes()
    assert data.startswith(importlib.util.MAGIC_NUMBER)
    # A later run (another temporary payload path) takes the code from the cache, not from
    # compiling the source: a planted entry for the same source shows which one ran. Its
    # code is named by the new payload's path, as compiling it there would name it.
    plant(
        cache,
        "ansible/module_utils/probe.py",
        SOURCES["ansible/module_utils/probe.py"].replace("'compiled'", "'cached'"),
    )
    second = payload(tmp_path, "2")
    got = run(site_dir, second, cache)
    assert got["value"] == "cached"
    assert got["where"] == str(second / "ansible/module_utils/probe.py")
    assert got["file"] == str(second / "ansible/module_utils/probe.py")
    # nothing added, no temporary left (the two empty __init__.py are one entry)
    assert len(list(cache.iterdir())) == len({entry(cache, a) for a in SOURCES}) == 2


def test_a_cache_others_may_write_to_is_neither_read_nor_written(tmp_path, site_dir):
    cache = cache_dir(tmp_path, 0o777)
    plant(cache, "ansible/module_utils/probe.py", "VALUE = 'planted'\n")
    got = run(site_dir, payload(tmp_path, "1"), cache)
    assert got["value"] == "compiled"
    assert len(list(cache.iterdir())) == 1  # only the planted one


def test_other_zips_and_broken_entries_compile_as_python_would(tmp_path, site_dir):
    cache = cache_dir(tmp_path)
    # a zip on the path that is not an Ansible payload: not cached
    got = run(site_dir, payload(tmp_path, "1", name="project.zip"), cache)
    assert got["value"] == "compiled" and list(cache.iterdir()) == []
    # an entry of another interpreter (wrong magic) or cut short: compiled afresh
    entry(cache, "ansible/module_utils/probe.py").write_bytes(b"\x00\x00\r\n" + b"junk")
    entry(cache, "ansible/__init__.py").write_bytes(importlib.util.MAGIC_NUMBER + b"\xff")
    got = run(site_dir, payload(tmp_path, "2"), cache)
    assert got["value"] == "compiled"


def test_without_the_cache_directory_the_hook_stays_out(tmp_path, site_dir):
    got = run(site_dir, payload(tmp_path, "1"), tmp_path / "no-cache")
    assert got["value"] == "compiled"
    assert not (tmp_path / "no-cache").exists()


@pytest.fixture
def open_tmp():
    """A directory another user can reach (pytest's own are root's 0700)."""
    top = pathlib.Path(tempfile.mkdtemp(prefix="dsc-ansiballz-"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top)


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK),
    reason=f"needs root and {SYSTEM_PYTHON} (this Python's version) to run as another user",
)
def test_another_user_reads_roots_entries_and_writes_none(open_tmp):
    """As on a node: become tasks (root) fill the cache, the training user's tasks read it;
    root takes no entry another user owns."""
    site = open_tmp / "site"
    site.mkdir(mode=0o755)
    (site / "dscluster_ansiballz.py").write_text(HOOK.read_text())
    (site / "dscluster_ansiballz.pth").write_text("import dscluster_ansiballz\n")
    cache = cache_dir(open_tmp)
    run(site, payload(open_tmp, "1"), cache)  # root fills it
    plant(
        cache,
        "ansible/module_utils/probe.py",
        "VALUE = 'roots'\ndef fail():\n    raise RuntimeError\n",
    )
    os.remove(entry(cache, "ansible/__init__.py"))  # a miss for the other user
    zipped = payload(open_tmp, "2")
    zipped.parent.chmod(0o755)
    got = run(site, zipped, cache, user=65534)
    assert got["value"] == "roots"
    assert not entry(cache, "ansible/__init__.py").exists()  # not written by that user
    # root does not take an entry another user owns: it compiles and puts its own there
    os.chown(entry(cache, "ansible/module_utils/probe.py"), 65534, 65534)
    got = run(site, payload(open_tmp, "3"), cache)
    assert got["value"] == "compiled"
    assert entry(cache, "ansible/module_utils/probe.py").stat().st_uid == 0

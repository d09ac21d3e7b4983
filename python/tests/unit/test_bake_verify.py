"""The stack check `dscluster image bake` runs before it makes anything: the manifest the
controller builds from its wheelhouse (real wheel files: Debian's, in /usr/share/python-wheels),
and docker/bake/verify_stack.py run by this machine's python (-I) against a real venv with
that wheel installed, as it runs on a node: the venv as installed passes, a changed file, a
stray .pth or .py, and a node wheel with another sha256 are each refused, by name."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from dscluster import paths, stack_manifest
from dscluster.errors import DsclusterError

SYSTEM_WHEELS = pathlib.Path("/usr/share/python-wheels")
pytestmark = pytest.mark.skipif(
    not list(SYSTEM_WHEELS.glob("setuptools-*.whl")) or not list(SYSTEM_WHEELS.glob("pip-*.whl")),
    reason="needs Debian's python3-pip-whl and python3-setuptools-whl",
)
SCRIPT = paths.docker_dir() / "bake" / "verify_stack.py"


def controller_wheelhouse(where: pathlib.Path, wheel: pathlib.Path) -> stack_manifest.Layer:
    """A controller wheelhouse of one wheel, with the lock files ml_stack writes."""
    where.mkdir(parents=True)
    shutil.copy(wheel, where / wheel.name)
    digest = stack_manifest.sha256(where / wheel.name)
    lock = {"key": "test", "wheels": {wheel.name: {"sha256": digest, "size": 1}}}
    (where / "lock.json").write_text(json.dumps(lock))
    (where / "requirements.lock").write_text(f"x --hash=sha256:{digest}\n")
    return stack_manifest.Layer(where, lock, stack_manifest.sha256(where / "lock.json"))


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A venv with Debian's setuptools wheel installed the way ml_stack installs from a
    wheelhouse (no index), the controller's wheelhouse of that wheel, the node's copy of it."""
    root = tmp_path_factory.mktemp("node")
    wheel = sorted(SYSTEM_WHEELS.glob("setuptools-*.whl"))[-1]
    pip = sorted(SYSTEM_WHEELS.glob("pip-*.whl"))[-1]
    base = controller_wheelhouse(root / "controller" / "wheelhouse" / "key", wheel)
    house = root / "node-wheelhouse"
    shutil.copytree(base.directory, house)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [f"{venv}/bin/python", f"{pip}/pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-index", "--no-deps", str(house / wheel.name)],
        check=True,
    )  # fmt: skip
    shutil.copy(base.directory / "lock.json", venv / "dscluster-lock.json")
    (site,) = venv.glob("lib/python*/site-packages")
    return {"base": base, "house": house, "venv": venv, "site": site, "wheel": wheel.name}


def manifest(node, **over) -> dict:
    args = {
        "host": "n2",
        "venv": str(node["venv"]),
        "node_wheelhouse": str(node["house"]),
        "wheelhouse_required": True,
        "base": node["base"],
        "user": None,
        "system_wheels": "",
    }
    return stack_manifest.build(**(args | over))


def verify(tmp_path: pathlib.Path, data: dict) -> tuple[int, dict]:
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    proc = subprocess.run(
        [sys.executable, "-I", str(SCRIPT), str(tmp_path / "manifest.json")],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    found = stack_manifest.verdict(proc.stdout)
    assert found is not None, proc.stderr
    return proc.returncode, found


def test_manifest_lists_a_real_wheels_record(node, tmp_path):
    dist_info, files = stack_manifest.wheel_record(node["base"].directory / node["wheel"])
    assert dist_info.startswith("setuptools-") and dist_info.endswith(".dist-info")
    assert files[f"{dist_info}/RECORD"] == ""
    assert files["setuptools/__init__.py"].startswith("sha256=")
    assert "distutils-precedence.pth" in files
    data = manifest(node)
    assert data["wheels"][node["wheel"]] == {"dist_info": dist_info, "files": files}
    (house,) = data["wheelhouses"]
    assert set(house["files"]) == {node["wheel"], "lock.json", "requirements.lock"}
    assert data["prefix_files"]["dscluster-lock.json"] == node["base"].lock_sha256
    # the controller's own copy is checked against its lock before anything is sent
    broken = tmp_path / "broken"
    shutil.copytree(node["base"].directory, broken)
    with (broken / node["wheel"]).open("ab") as fh:
        fh.write(b"x")
    layer = stack_manifest.Layer(broken, node["base"].lock, node["base"].lock_sha256)
    with pytest.raises(DsclusterError, match=r"with another sha256 than its lock\.json"):
        manifest(node, base=layer)


def test_controller_wheelhouse_is_the_one_the_venv_was_installed_from(node, tmp_path):
    cache = node["base"].directory.parent.parent
    want = {"venv_lock_sha256": node["base"].lock_sha256}
    base, user = stack_manifest.controller_layers(cache, "n2", want)
    assert (base.directory, user) == (node["base"].directory, None)
    with pytest.raises(DsclusterError, match="no wheelhouse on this controller has the lock n2"):
        stack_manifest.controller_layers(cache, "n2", {"venv_lock_sha256": "0" * 64})
    with pytest.raises(DsclusterError, match="name no lock"):
        stack_manifest.controller_layers(cache, "n2", {})


def test_the_venv_as_installed_passes(node, tmp_path):
    rc, found = verify(tmp_path, manifest(node))
    assert (rc, found["ok"], found["differs"]) == (0, True, [])
    assert found["wheels"] == 3  # the wheel and the two locks
    assert found["files"] > 100 and found["bytecode"] > 0


def test_a_changed_file_is_refused_by_name(node, tmp_path):
    target = node["site"] / "setuptools" / "__init__.py"
    before = target.read_bytes()
    try:
        target.write_bytes(before + b"#")
        rc, found = verify(tmp_path, manifest(node))
    finally:
        target.write_bytes(before)
    assert (rc, found["ok"], found["count"]) == (1, False, 1)
    assert found["differs"] == [f"{target} (changed)"]
    line = stack_manifest.refusal(
        "n2", found,
        stack_manifest.fix_for(found, host="n2", venv=str(node["venv"]),
                               wheelhouse=str(node["house"]), source="inventories/x"),
    )  # fmt: skip
    assert line == (
        f"n2's stack is not what the controller's wheelhouse holds: {target} (changed); nothing "
        f"was baked; remove {node['venv']} on n2 and provision it again (dscluster provision "
        "-i inventories/x --add n2), or bake another --node"
    )


@pytest.mark.parametrize("name", ["zz-planted.pth", "setuptools/planted.py", "sitecustomize.py"])
def test_a_file_no_wheel_lists_is_refused(node, tmp_path, name):
    stray = node["site"] / name
    try:
        stray.write_text("import os\n")
        rc, found = verify(tmp_path, manifest(node))
    finally:
        stray.unlink()
    assert (rc, found["differs"]) == (1, [f"{stray} (not from any wheel)"])


def test_a_link_in_place_of_a_file_is_refused(node, tmp_path):
    target = node["site"] / "distutils-precedence.pth"
    keep = tmp_path / "keep"
    shutil.copy2(target, keep)
    try:
        target.unlink()
        target.symlink_to(keep)
        rc, found = verify(tmp_path, manifest(node))
    finally:
        target.unlink()
        shutil.copy2(keep, target)
    assert (rc, found["differs"]) == (1, [f"{target} (not a regular file)"])


def test_a_node_wheel_with_another_hash_is_refused(node, tmp_path):
    wheel = node["house"] / node["wheel"]
    before = wheel.read_bytes()
    extra = node["house"] / "planted-1.0-py3-none-any.whl"
    try:
        wheel.write_bytes(before + b"x")
        extra.write_bytes(b"x")
        rc, found = verify(tmp_path, manifest(node))
    finally:
        wheel.write_bytes(before)
        extra.unlink()
    assert rc == 1
    assert found["differs"] == [
        f"{extra} (not in the controller's wheelhouse)",
        f"{wheel} (sha256 differs from the controller's)",
    ]
    fix = stack_manifest.fix_for(
        found, host="n2", venv=str(node["venv"]), wheelhouse=str(node["house"]), source="i"
    )
    assert fix.startswith(f"remove {node['house']} on n2 ")


def test_a_wheelhouse_on_shared_storage_may_be_absent_from_the_node(node, tmp_path):
    gone = str(node["house"]) + "-not-here"
    rc, found = verify(tmp_path, manifest(node, node_wheelhouse=gone, wheelhouse_required=False))
    assert (rc, found["ok"], found["wheels"]) == (0, True, 0)
    rc, found = verify(tmp_path, manifest(node, node_wheelhouse=gone))
    assert found["differs"] == [f"{gone} (missing)"]


def test_a_distribution_from_debians_wheels_counts_only_as_dpkg_recorded_it(node, tmp_path):
    """pip in a node's venv comes from Debian's wheel, not the controller's wheelhouse: its
    files are allowed only where that wheel matches dpkg's md5 (here, on a Debian machine
    where python3-pip-whl is dpkg's); without the Debian wheels every pip file is refused."""
    pip = sorted(SYSTEM_WHEELS.glob("pip-*.whl"))[-1]
    venv = node["venv"]
    subprocess.run(
        [f"{venv}/bin/python", f"{pip}/pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-index", "--no-deps", "--no-compile", str(pip)],
        check=True,
    )  # fmt: skip
    try:
        rc, found = verify(tmp_path, manifest(node))
        assert rc == 1 and found["count"] > 100
        assert all("/pip" in d and d.endswith("(not from any wheel)") for d in found["differs"])
        if not pathlib.Path("/var/lib/dpkg/info/python3-pip-whl.md5sums").is_file():
            pytest.skip("no dpkg record of python3-pip-whl here")
        rc, found = verify(tmp_path, manifest(node, system_wheels=str(SYSTEM_WHEELS)))
        assert (rc, found["differs"], found["system"]) == (0, [], [pip.name])
    finally:
        subprocess.run(
            [f"{venv}/bin/python", f"{pip}/pip", "uninstall", "--quiet", "--yes", "pip"],
            check=True,
        )  # fmt: skip

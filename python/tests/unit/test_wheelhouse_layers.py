"""The layered wheelhouse: the base layer's key (Ansible evaluating the role's vars with a
build host's facts), and the user layer built for real by files/user_layer.py with uv and
pip, offline, from small wheels made here (a stand-in base wheelhouse and a stand-in index)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "ml_stack_layers.yml"
user_layer = rolefiles.load("ml_stack", "user_layer.py")
record_versions = rolefiles.load("ml_stack", "record_versions.py")
install_bench = rolefiles.load("ml_stack", "install_bench.py")

# The cache directory of the base wheelhouse built before the user layer existed (a CPU
# cluster of AMD EPYC nodes, Python 3.11): with no user requirements it must stay valid.
TODAYS_KEY = "cpu-torch2.13.0-ds0.19.8-cp311-x86_64-46cbd4d2"
EPYC = {
    "ml_stack_build_host": "localhost",
    "ansible_python": {"version": {"major": 3, "minor": 11}},
    "ansible_architecture": "x86_64",
    "ansible_processor": ["0", "AuthenticAMD", "AMD EPYC"],
    "ansible_local": {"accelerators": {"kind": "cpu", "count": 0}},
    "dscluster_cache_dir": "/cache",
}


def layers(**extra) -> dict:
    args = EPYC | {"ansible_python_interpreter": sys.executable} | extra
    # the build host's facts (ansible_python, ...) as gathered facts, under ansible_facts
    _, found, out = rolefiles.run_local_play(PLAYBOOK, rolefiles.as_gathered(args), "LAYERS")
    if found is None:
        raise AssertionError(out)
    return found


def test_base_key_without_user_requirements_is_the_key_of_before():
    sel = layers()
    assert sel["key"] == TODAYS_KEY
    assert sel["wheelhouse"] == f"/cache/wheelhouse/{TODAYS_KEY}"
    assert sel["user_layer"] is False and sel["user_key"] == ""
    assert sel["uv_platform"] == "x86_64-manylinux_2_28"


def test_user_requirements_change_the_user_key_only(tmp_path):
    one = layers(ml_stack_extra_requirements=["transformers==4.57.1"])
    two = layers(ml_stack_extra_requirements=["transformers==4.57.1", "accelerate==1.11.0"])
    assert one["key"] == two["key"] == TODAYS_KEY
    assert one["user_layer"] is True and one["user_key"].startswith("user-")
    assert one["user_key"] != two["user_key"]
    assert one["user_wheelhouse"] == (
        f"/cache/wheelhouse-user/{TODAYS_KEY}/{one['user_key'].removeprefix('user-')}"
    )
    # Another base (another torch) is another user layer for the same requirements.
    other = layers(
        ml_stack_extra_requirements=["transformers==4.57.1"], ml_stack_torch_version="2.12.0"
    )
    assert other["key"] != TODAYS_KEY and other["user_key"] != one["user_key"]


def test_requirements_file_content_keys_the_user_layer(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("lightning==2.5.5\n")
    b.write_text("lightning==2.5.5\n")
    sel_a = layers(ml_stack_requirements_file=str(a))
    sel_b = layers(ml_stack_requirements_file=str(b))
    assert sel_a["key"] == TODAYS_KEY and sel_a["user_layer"] is True
    assert sel_a["user_key"] == sel_b["user_key"]  # the content, not the path
    b.write_text("lightning==2.5.4\n")
    assert layers(ml_stack_requirements_file=str(b))["user_key"] != sel_a["user_key"]


# ---- files/user_layer.py, offline, with uv and pip for real ----


def make_wheel(
    directory: pathlib.Path, name: str, version: str, requires=(), modules=None
) -> pathlib.Path:
    """A minimal valid py3-none-any wheel (metadata and one module, or `modules`)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = modules or {f"{name.replace('-', '_')}/__init__.py": ""}
    files = {
        **files,
        f"{dist}.dist-info/METADATA": metadata,
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{f},,\n" for f in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for f, text in files.items():
            zf.writestr(f, text)
        zf.writestr(f"{dist}.dist-info/RECORD", record)
    return path


def sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def stack(tmp_path):
    """A base wheelhouse (torch 2.13.0+cpu, deepspeed, numpy) and an index of user wheels."""
    base, index = tmp_path / "base", tmp_path / "index"
    base.mkdir()
    index.mkdir()
    wheels = [
        make_wheel(base, "torch", "2.13.0+cpu", ["numpy"], TORCH),
        make_wheel(base, "deepspeed", "0.19.8", ["torch>=2.0", "numpy"], DEEPSPEED),
        make_wheel(base, "numpy", "2.4.6"),
    ]
    lock = {"key": "cpu-test", "wheels": {w.name: {"sha256": sha(w)} for w in wheels}}
    (base / "lock.json").write_text(json.dumps(lock))
    (base / "requirements.lock").write_text(
        "".join(f"{pin(w)} --hash=sha256:{sha(w)}\n" for w in sorted(wheels))
    )
    make_wheel(index, "numpy", "2.4.6")
    make_wheel(index, "numpy", "1.26.4")
    make_wheel(index, "torch", "2.13.0")
    make_wheel(index, "torch", "2.5.0")
    make_wheel(index, "tokenizers", "0.22.2")
    make_wheel(index, "transformers", "4.57.1", ["numpy>=1.17", "tokenizers>=0.22", "torch>=2.1"])
    make_wheel(index, "oldvision", "0.20.0", ["torch==2.5.0"])
    make_wheel(index, "extra-tool", "1.0")
    return tmp_path


# What record_versions.py imports of torch and DeepSpeed, in the stand-in base wheels.
TORCH = {"torch/__init__.py": "__version__ = '2.13.0+cpu'\n\nclass version:\n    cuda = None\n"}
DEEPSPEED = {
    "deepspeed/__init__.py": "__version__ = '0.19.8'\n",
    "deepspeed/git_version_info.py": "installed_ops = {'cpu_adam': True}\n",
}


def pin(wheel: pathlib.Path) -> str:
    name, version = wheel.name.split("-")[:2]
    return f"{name.replace('_', '-')}=={version}"


def run_layer(stack: pathlib.Path, *reqs: str, file: pathlib.Path | None = None):
    out = stack / "out"
    argv = [
        "--base", str(stack / "base"), "--out", str(out), "--key", "user-test",
        "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
        "--platform", "manylinux_2_28_x86_64",
        "--uv-arg=--no-index", f"--uv-arg=--find-links={stack / 'index'}",
        "--pip-arg=--no-index", f"--pip-arg=--find-links={stack / 'index'}",
        *[f"--requirement={r}" for r in reqs],
    ]  # fmt: skip
    if file:
        argv += ["--requirements-file", str(file)]
    # pip here reads only the arguments: no pip.conf or PIP_* of this machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    proc = subprocess.run(
        [sys.executable, str(rolefiles.path("ml_stack", "files/user_layer.py")), *argv],
        env=env | {"PIP_CONFIG_FILE": os.devnull},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return proc, out


def test_user_layer_holds_only_what_the_base_lacks_hash_locked(stack):
    proc, out = run_layer(stack, "transformers==4.57.1")
    assert proc.returncode == 0, proc.stderr
    lock = json.loads((out / "lock.json").read_text())
    assert lock["packages"] == {"tokenizers": "0.22.2", "transformers": "4.57.1"}
    assert lock["base_key"] == "base" and lock["key"] == "user-test"
    assert sorted(p.name for p in out.glob("*.whl")) == [
        "tokenizers-0.22.2-py3-none-any.whl",
        "transformers-4.57.1-py3-none-any.whl",
    ]
    lines = [ln for ln in (out / "requirements.lock").read_text().splitlines() if ln[:1] != "#"]
    for line in lines:
        pin, hashopt = line.split(" --hash=sha256:")
        name, version = pin.split("==")
        wheel = next(out.glob(f"{name}-{version}-*.whl"))
        assert sha(wheel) == hashopt == lock["wheels"][wheel.name]["sha256"]
    assert len(lines) == 2


def test_a_requirement_against_a_base_pin_fails_naming_both(stack):
    proc, out = run_layer(stack, "numpy<2")
    assert proc.returncode == 1
    assert (
        "'numpy<2' (ml_stack_extra_requirements) conflicts with the base layer's pin" in proc.stderr
    )
    assert "numpy==2.4.6" in proc.stderr and not (out / "lock.json").exists()
    # torch's public version accepts the base's local +cpu build: no conflict.
    proc, _ = run_layer(stack, "torch==2.13.0", "transformers==4.57.1")
    assert proc.returncode == 0, proc.stderr


def test_a_dependency_that_needs_another_torch_fails_with_uvs_reason(stack):
    proc, out = run_layer(stack, "oldvision==0.20.0")
    assert proc.returncode == 1
    assert "do not resolve against the base layer's pins (torch==2.13.0+cpu" in proc.stderr
    assert "oldvision depend on torch==2.5.0 and torch==2.13.0+cpu" in proc.stderr
    assert "you require oldvision==0.20.0" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (out / "lock.json").exists()


def test_a_lock_file_is_taken_and_its_hashes_are_checked(stack):
    wheel = next((stack / "index").glob("transformers-*.whl"))
    good = stack / "good.txt"
    good.write_text(
        "# a user's own lock\ntransformers==4.57.1 \\\n"
        f"    --hash=sha256:{sha(wheel)}\ntokenizers==0.22.2  # via transformers\n"
    )
    proc, out = run_layer(stack, file=good)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "lock.json").read_text())["requirements"] == [
        "transformers==4.57.1",
        "tokenizers==0.22.2",
    ]
    bad = stack / "bad.txt"
    bad.write_text(f"transformers==4.57.1 --hash=sha256:{'0' * 64}\n")
    (out / "lock.json").unlink()
    proc, _ = run_layer(stack, file=bad)
    assert proc.returncode == 1
    assert "does not match any --hash that ml_stack_requirements_file" in proc.stderr


def test_pip_options_in_a_requirements_file_are_refused(stack):
    opts = stack / "opts.txt"
    opts.write_text("--index-url https://example.invalid/simple\ntransformers==4.57.1\n")
    proc, _ = run_layer(stack, file=opts)
    assert proc.returncode == 1
    assert "'--index-url https://example.invalid/simple' is a pip option" in proc.stderr


def test_requirements_file_parsing():
    text = (
        "a==1 \\\n  --hash=sha256:"
        + "A" * 64
        + "  # note\n\n# only a comment\nb[x]>=2 ; python_version>'3'\n"
    )
    lines = user_layer.logical_lines(text)
    assert len(lines) == 2
    req, hashes = user_layer.parse_line(lines[0], "f")
    assert str(req) == "a==1" and hashes == {"a" * 64}
    req, hashes = user_layer.parse_line(lines[1], "f")
    assert req.name == "b" and req.extras == {"x"} and not hashes


# ---- the nodes' side: what record_versions.py reports about the layers ----


def test_record_versions_reports_base_drift_and_the_user_layer(tmp_path):
    import pytest as installed  # noqa: PLC0415 - a distribution this venv surely has

    lock = tmp_path / "requirements.lock"
    lock.write_text(
        f"# header\npytest=={installed.__version__} --hash=sha256:{'1' * 64}\n"
        f"not-installed-dist==1.0 --hash=sha256:{'2' * 64}\n"
    )
    assert record_versions.drift(record_versions.locked_pins(lock)) == {"not-installed-dist": ""}
    assert record_versions.user_layer(None)["key"] == ""
    user = tmp_path / "user"
    user.mkdir()
    (user / "requirements.lock").write_text("pytest==0.0.1 --hash=sha256:x\n")
    (user / "lock.json").write_text(json.dumps({"key": "user-1", "packages": {"pytest": "0.0.1"}}))
    layer = record_versions.user_layer(user)
    assert layer["key"] == "user-1" and layer["drift"] == {"pytest": installed.__version__}
    assert layer["lock_sha256"] == sha(user / "requirements.lock")


# ---- the verdict: the reading against what the controller expects (--want) ----


def reading_and_want() -> tuple[dict, dict]:
    """A node's reading that is exactly what the controller expects."""
    digests = {
        "requirements.lock": "r" * 64,
        "lock.json": "l" * 64,
        "user requirements.lock": "u" * 64,
        "user lock.json": "k" * 64,
        "scripts": {name: "s" * 64 for name in record_versions.INSTALLED_SCRIPTS},
        "wheels": {"torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl": "t" * 64,
                   "deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl": "d" * 64},
    }  # fmt: skip
    reading = {
        "torch": "2.13.0+cpu",
        "deepspeed": "0.19.8",
        "installed_ops": ["async_io", "cpu_adam", "deepspeed_shm_comm", "fused_adam"],
        "venv_lock_sha256": "l" * 64,
        "venv_user_lock_sha256": "k" * 64,
        "tools_uv": "0.9.5",
        "scripts": dict(digests["scripts"]),
        "wheels": dict(digests["wheels"]),
        "lock_sha256": "r" * 64,
        "base_drift": {},
        "user_layer_key": "user-0a1b2c3d",
        "user_layer": {"key": "user-0a1b2c3d", "drift": {}},
        "user_lock_sha256": "u" * 64,
    }
    want = {
        "torch": "2.13.0",
        "deepspeed": "0.19.8",
        "ops": ["async_io", "cpu_adam", "fused_adam"],
        "user_layer_key": "user-0a1b2c3d",
        "uv": "0.9.5",
        "digests": digests,
    }
    return reading, want


def test_the_verdict_of_a_node_as_locked_is_ok_on_both_sides():
    reading, want = reading_and_want()
    assert record_versions.verdict(reading, want) == {
        "venv": {"ok": True, "differs": []},
        "wheelhouse": {"ok": True, "differs": []},
    }


def _rebuilt_wheel(r, w):
    r["wheels"]["deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl"] = "e" * 64


@pytest.mark.parametrize(
    ("change", "side", "name"),
    [
        (_rebuilt_wheel, "wheelhouse", "wheels"),
        (lambda r, w: r["installed_ops"].remove("cpu_adam"), "venv", "ops"),
        (lambda r, w: r.update(torch="2.12.0+cpu"), "venv", "torch"),
        (lambda r, w: r.update(torch="2.13.01"), "venv", "torch"),  # not 2.13.0 with a label
        (lambda r, w: w.update(deepspeed="0.19.9"), "venv", "deepspeed"),
        (lambda r, w: w.update(user_layer_key="user-ffffffff"), "wheelhouse", "user layer key"),
        (lambda r, w: r.update(user_layer_key=""), "wheelhouse", "user layer key"),
        (lambda r, w: r.update(base_drift={"numpy": "2.0.0"}), "wheelhouse", "base drift"),
        (lambda r, w: r["user_layer"].update(drift={"x": ""}), "wheelhouse", "user layer drift"),
        (lambda r, w: r.update(lock_sha256=""), "wheelhouse", "requirements.lock"),
        (lambda r, w: r.update(user_lock_sha256=""), "wheelhouse", "user requirements.lock"),
        (lambda r, w: r.update(venv_lock_sha256=""), "venv", "venv lock.json"),
        (lambda r, w: r.update(venv_user_lock_sha256=""), "venv", "venv user lock.json"),
        (lambda r, w: w.update(uv="0.9.6"), "venv", "uv"),
        (lambda r, w: r["scripts"].update({"record_versions.py": ""}), "venv", "scripts"),
    ],
)
def test_each_difference_fails_its_side_by_name(change, side, name):
    """One thing changed: its side is not ok and names it; the other side still is."""
    reading, want = reading_and_want()
    change(reading, want)
    verdict = record_versions.verdict(reading, want)
    assert verdict[side] == {"ok": False, "differs": [name]}
    other = "venv" if side == "wheelhouse" else "wheelhouse"
    assert verdict[other] == {"ok": True, "differs": []}


UV = str(pathlib.Path(sys.executable).parent / "uv")


def test_install_bench_times_pip_and_uv_on_a_wheelhouse(stack):
    result = install_bench.bench(stack / "base", UV, sys.executable)
    assert result["packages"] == 3
    assert result["pip_s"] > 0 and result["uv_s"] > 0 and result["uv"]


# ---- the role's user-layer tasks, controller and node side, on a venv here ----

INSTALL = pathlib.Path(__file__).parent / "playbooks" / "ml_stack_user_install.yml"


def converge_user_layer(stack: pathlib.Path, reqs: list[str]) -> dict:
    index = stack / "index"
    args = EPYC | {
        "ansible_python_interpreter": sys.executable,
        "dscluster_cache_dir": str(stack / "cache"),
        "ml_stack_controller_wheelhouse": str(stack / "wheelhouse"),
        "ml_stack_venv": str(stack / "venv"),
        "ml_stack_node_wheelhouse": str(stack / "node"),
        "ml_stack_tools_venv": str(pathlib.Path(sys.executable).parent.parent),
        "ml_stack_uv_compile_args": ["--no-index", f"--find-links={index}"],
        "ml_stack_pip_download_args": ["--no-index", f"--find-links={index}"],
        "ml_stack_extra_requirements": reqs,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    rc, found, out = rolefiles.run_local_play(
        INSTALL, rolefiles.as_gathered(args), "RECORD", env=env | {"PIP_CONFIG_FILE": os.devnull}
    )
    assert rc == 0, out
    assert found is not None, out
    return found


def installed(stack: pathlib.Path) -> dict[str, str]:
    out = subprocess.run(
        [UV, "pip", "freeze", "--python", str(stack / "venv" / "bin" / "python")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)


def test_user_layer_tasks_add_change_and_remove_without_touching_the_base(stack):
    # The base layer as the role leaves it: its wheelhouse in the controller cache under
    # the key of these facts, on the node, and installed with uv into the venv.
    shutil.copytree(stack / "base", stack / "wheelhouse" / TODAYS_KEY)
    shutil.copytree(stack / "base", stack / "node")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(stack / "venv")], check=True)
    subprocess.run(
        [UV, "pip", "install", "--quiet", "--python", str(stack / "venv" / "bin" / "python"),
         "--no-index", "--find-links", str(stack / "node"), "--require-hashes",
         "--requirement", str(stack / "node" / "requirements.lock")],
        check=True,
    )  # fmt: skip
    base = installed(stack)
    assert base == {"deepspeed": "0.19.8", "numpy": "2.4.6", "torch": "2.13.0+cpu"}

    rec = converge_user_layer(stack, ["transformers==4.57.1", "extra-tool==1.0"])
    assert installed(stack) == base | {
        "transformers": "4.57.1",
        "tokenizers": "0.22.2",
        "extra-tool": "1.0",
    }
    assert rec["user_layer"]["packages"] == {
        "extra-tool": "1.0",
        "tokenizers": "0.22.2",
        "transformers": "4.57.1",
    }
    assert rec["user_layer_key"].startswith("user-") and rec["base_drift"] == {}
    assert rec["torch"] == "2.13.0+cpu" and rec["deepspeed"] == "0.19.8"

    # One requirement removed: its distribution leaves the venv, the rest stays.
    rec = converge_user_layer(stack, ["transformers==4.57.1"])
    assert installed(stack) == base | {"transformers": "4.57.1", "tokenizers": "0.22.2"}
    assert sorted(p.name for p in (stack / "node" / "user").glob("*.whl")) == [
        "tokenizers-0.22.2-py3-none-any.whl",
        "transformers-4.57.1-py3-none-any.whl",
    ]

    # None left: no user layer, the venv is the base again.
    rec = converge_user_layer(stack, [])
    assert installed(stack) == base
    assert rec["user_layer_key"] == "" and rec["base_drift"] == {}
    assert not (stack / "node" / "user").exists()
    assert not (stack / "venv" / "dscluster-user-lock.json").exists()

    # torch and DeepSpeed are imported again only when the venv's distributions change:
    # the cached answer holds while every RECORD keeps its mtime and size.
    venv_python = stack / "venv" / "bin" / "python"
    script = rolefiles.path("ml_stack", "files/record_versions.py")

    def read(*more: str) -> dict:
        out = subprocess.run(
            [str(venv_python), str(script), str(stack / "node"), *more],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        return json.loads(out.stdout)

    assert read()["torch"] == "2.13.0+cpu"
    assert (stack / "venv" / "dscluster-stack-cache.json").is_file()
    (torch_init,) = (stack / "venv").glob("lib/python*/site-packages/torch/__init__.py")
    torch_init.write_text(torch_init.read_text().replace("2.13.0+cpu", "9.9.9+cpu"))
    assert read()["torch"] == "2.13.0+cpu"  # no distribution changed: the cached reading
    (record,) = (stack / "venv").glob("lib/python*/site-packages/torch-*.dist-info/RECORD")
    # a node started from a baked image: docker export kept whole seconds of every mtime
    mtime_ns = record.stat().st_mtime_ns
    os.utime(record, ns=(record.stat().st_atime_ns, mtime_ns - mtime_ns % 10**9))
    assert read()["torch"] == "2.13.0+cpu"  # still the reading the image was baked with
    record.write_text(record.read_text() + "\n")  # what any (re)install does to it
    assert read()["torch"] == "9.9.9+cpu"
    # --want on the command line: the verdict beside the reading (none without it)
    assert "verdict" not in read()
    _, want = reading_and_want()
    verdict = read("--want", json.dumps(want | {"torch": "9.9.9"}))["verdict"]
    assert "torch" not in verdict["venv"]["differs"] and "ops" in verdict["venv"]["differs"]

    pip_check_reads_the_venv(stack, read)


def pip_check_reads_the_venv(stack: pathlib.Path, read) -> None:
    """--pip-check: the tools layer's uv pip check of this venv, in the same reading (none
    without it); a distribution whose requirement is missing makes it fail, named."""
    assert "pip_check" not in read()
    tools = stack / "tools"
    (tools / "bin").mkdir(parents=True)
    (tools / "bin" / "uv").symlink_to(UV)
    nothing = stack / "no-user-layer"
    assert read(str(nothing), str(tools), "--pip-check")["pip_check"]["rc"] == 0
    (site,) = (stack / "venv").glob("lib/python*/site-packages")
    extra = site / "dscluster_tampered-1.0.dist-info"
    extra.mkdir()
    (extra / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dscluster-tampered\nVersion: 1.0\n"
        "Requires-Dist: dscluster-not-installed\n"
    )
    checked = read(str(nothing), str(tools), "--pip-check")["pip_check"]
    assert checked["rc"] != 0 and "dscluster-not-installed" in checked["output"], checked
    assert read(str(nothing), str(stack / "no-tools"), "--pip-check")["pip_check"]["rc"] is None
    shutil.rmtree(extra)


# ---- wheel digests kept with size and mtime: a re-converge does not read every wheel ----

hash_wheels = rolefiles.load("ml_stack", "hash_wheels.py")


def test_hash_wheels_reuses_a_digest_only_while_size_and_mtime_hold(tmp_path, monkeypatch):
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"a" * 10)
    (tmp_path / "b-1-py3-none-any.whl").write_bytes(b"b" * 20)
    (tmp_path / "notes.txt").write_text("not a wheel")
    first = hash_wheels.hash_wheels(tmp_path)
    assert [(w["name"], w["size"]) for w in first] == [
        ("a-1-py3-none-any.whl", 10), ("b-1-py3-none-any.whl", 20),
    ]  # fmt: skip
    assert first[0]["sha256"] == sha(tmp_path / "a-1-py3-none-any.whl")
    hashed = []
    real = hash_wheels.sha256
    monkeypatch.setattr(hash_wheels, "sha256", lambda p: hashed.append(p.name) or real(p))
    assert hash_wheels.hash_wheels(tmp_path) == first and hashed == []  # all reused
    # the same size, another mtime (a rebuild): hashed again; a new wheel: hashed
    wheel = tmp_path / "b-1-py3-none-any.whl"
    wheel.write_bytes(b"c" * 20)
    os.utime(wheel, ns=(wheel.stat().st_atime_ns, wheel.stat().st_mtime_ns + 10**9))
    (tmp_path / "c-1-py3-none-any.whl").write_bytes(b"c")
    third = hash_wheels.hash_wheels(tmp_path)
    assert sorted(hashed) == ["b-1-py3-none-any.whl", "c-1-py3-none-any.whl"]
    assert third[1]["sha256"] == sha(wheel) != first[1]["sha256"]
    # a removed wheel leaves the record; a damaged record is rebuilt, not trusted
    (tmp_path / "a-1-py3-none-any.whl").unlink()
    (tmp_path / hash_wheels.CACHE).write_text("{not json")
    hashed.clear()
    assert [w["name"] for w in hash_wheels.hash_wheels(tmp_path)] == [
        "b-1-py3-none-any.whl", "c-1-py3-none-any.whl",
    ]  # fmt: skip
    assert len(hashed) == 2
    assert sorted(json.loads((tmp_path / hash_wheels.CACHE).read_text())) == [
        "b-1-py3-none-any.whl", "c-1-py3-none-any.whl",
    ]  # fmt: skip


def test_record_versions_wheel_digests_reuse_the_venv_record(tmp_path, monkeypatch):
    monkeypatch.setattr(record_versions, "HASH_CACHE", tmp_path / "cache.json")
    house = tmp_path / "wh"
    house.mkdir()
    (house / "x-1-py3-none-any.whl").write_bytes(b"x" * 5)
    digests = record_versions.wheel_digests(house)
    assert digests == {"x-1-py3-none-any.whl": sha(house / "x-1-py3-none-any.whl")}
    hashed = []
    real = record_versions.sha256
    monkeypatch.setattr(record_versions, "sha256", lambda p: hashed.append(p.name) or real(p))
    assert record_versions.wheel_digests(house) == digests and hashed == []
    (house / "x-1-py3-none-any.whl").write_bytes(b"y" * 6)
    assert record_versions.wheel_digests(house) != digests and hashed == ["x-1-py3-none-any.whl"]
    assert record_versions.tools_uv(None) == "" and record_versions.tools_uv(tmp_path) == ""
    assert record_versions.file_sha256(tmp_path / "absent") == ""

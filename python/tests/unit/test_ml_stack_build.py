"""ml_stack's DeepSpeed build (tasks/build.yml) for real on localhost, from a stand-in
DeepSpeed source distribution: a build that failed half-way, or was killed at its time limit,
resumes where it stopped (the tree is unpacked once per key and built in place, ninja compiles
only the objects that are missing), and a build left running in the background (the site's
early play, its controller gone) and the next converge's build never write the tree at once.

The stand-in sdist builds the ops its DS_BUILD_* variables ask for as DeepSpeed's setup.py
does through torch's BuildExtension: one build.ninja in build/temp, written again each build,
its objects kept there, `ninja -j MAX_JOBS`; then each op linked to
deepspeed/ops/<dir>/<op>_op<EXT_SUFFIX> and the wheel written (an in-tree PEP 517 backend:
no torch, setuptools or wheel needed on the controller). Its compiler is a wrapper (the build
environment's CC, as ml_stack_deepspeed_build_env sets) that records each object it compiled
and refuses, or hangs on, the source the test names. The stand-in torch and wheel the build
venv installs are empty wheels."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import subprocess
import sys
import tarfile
import time

import pytest

from .. import rolefiles
from .test_wheelhouse_layers import make_wheel

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "ml_stack_build.yml"
OPS = {"cpu_adam": "DS_BUILD_CPU_ADAM", "fused_adam": "DS_BUILD_FUSED_ADAM"}
SOURCES = ["a.c", "b.c", "c.c", "d.c", "e.c"]

BACKEND = '''\
"""In-tree PEP 517 backend of the stand-in DeepSpeed sdist (see the test's docstring)."""
import base64, hashlib, os, pathlib, subprocess, sys, sysconfig, zipfile

NAME, VERSION = "deepspeed", "0.0.1"
OPS = {  # op: (its DS_BUILD_ variable, its package directory, its sources)
    "cpu_adam": ("DS_BUILD_CPU_ADAM", "adam", ["csrc/adam/a.c", "csrc/adam/b.c", "csrc/adam/c.c"]),
    "fused_adam": ("DS_BUILD_FUSED_ADAM", "adam", ["csrc/fused/d.c", "csrc/fused/e.c"]),
}
DIST = f"{NAME}-{VERSION}"
PY = f"cp{sys.version_info[0]}{sys.version_info[1]}"
TAG = f"{PY}-{PY}-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")
META = {
    "METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
    "WHEEL": f"Wheel-Version: 1.0\\nGenerator: standin\\nRoot-Is-Purelib: false\\nTag: {TAG}\\n",
}


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = pathlib.Path(metadata_directory) / f"{DIST}.dist-info"
    info.mkdir()
    for name, text in META.items():
        (info / name).write_text(text)
    return info.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root = pathlib.Path.cwd()
    temp, lib = root / "build" / "temp", root / "build" / "lib"
    temp.mkdir(parents=True, exist_ok=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    lines = [f"cc = {os.environ.get('CC', 'cc')}",
             "rule cc", "  command = $cc -fPIC -c $in -o $out",
             "rule link", "  command = $cc -shared $in -o $out"]
    ops = {}
    for op, (var, pkg, sources) in OPS.items():
        if os.environ.get(var) != "1":
            continue
        objs = [f"obj/{pathlib.Path(src).stem}.o" for src in sources]
        lines += [f"build {obj}: cc {root / src}" for obj, src in zip(objs, sources)]
        so = f"deepspeed/ops/{pkg}/{op}_op{suffix}"
        lines.append(f"build {lib / so}: link {' '.join(objs)}")
        ops[so] = lib / so
    (temp / "build.ninja").write_text("\\n".join(lines) + "\\n")
    subprocess.run(["ninja", "-v", "-j", os.environ.get("MAX_JOBS", "1")], cwd=temp, check=True)
    files = {"deepspeed/__init__.py": (root / "deepspeed" / "__init__.py").read_bytes()}
    files |= {so: path.read_bytes() for so, path in ops.items()}
    files |= {f"{DIST}.dist-info/{name}": text.encode() for name, text in META.items()}
    record = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
        f"{len(d)}\\n" for n, d in files.items()
    )
    wheel = f"{DIST}-{TAG}.whl"
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{DIST}.dist-info/RECORD", record + f"{DIST}.dist-info/RECORD,,\\n")
    return wheel
'''

# The stand-in compiler: STANDIN_DIR (the build environment) holds its record and the test's
# orders. A source named in `fail` does not compile; at one named in `hang` the compiler
# leaves at-<source> and waits, up to 10 minutes, until the test removes it.
CC = """\
#!/bin/sh
src=
for a; do case $a in *.c) src=${a##*/} ;; esac; done
if [ -n "$src" ]; then
  if grep -qx "$src" "$STANDIN_DIR/fail" 2>/dev/null; then
    echo "stand-in cc: $src does not compile" >&2
    exit 1
  fi
  if grep -qx "$src" "$STANDIN_DIR/hang" 2>/dev/null; then
    : > "$STANDIN_DIR/at-$src"
    n=0
    while [ -e "$STANDIN_DIR/at-$src" ] && [ $n -lt 3000 ]; do sleep 0.2; n=$((n + 1)); done
  fi
fi
cc "$@" || exit $?
[ -z "$src" ] || echo "$src" >> "$STANDIN_DIR/compiled"
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> pathlib.Path:
    """The build host's build directory (its build venv made once for the module: each test
    builds a key of its own there), the stand-in sdist and the compiler wrapper."""
    root = tmp_path_factory.mktemp("mlbuild")
    tree = root / "sdist" / "deepspeed-0.0.1"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "standin_backend"\n'
        'backend-path = ["."]\n',
        "standin_backend.py": BACKEND,
        "deepspeed/__init__.py": '__version__ = "0.0.1"\n',
        # DeepSpeed's sdist has one: build.yml unpacks the tree once, until it is there
        "setup.py": "# the build is standin_backend.py's (pyproject.toml)\n",
    }
    for src in SOURCES:
        folder = "adam" if src in ("a.c", "b.c", "c.c") else "fused"
        files[f"csrc/{folder}/{src}"] = f"int standin_{src[0]}(void) {{ return 1; }}\n"
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    with tarfile.open(root / "deepspeed-0.0.1.tar.gz", "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    (root / "cc").write_text(CC)
    (root / "cc").chmod(0o755)
    return root


@pytest.fixture
def world(shared: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    """This test's controller wheelhouse (the sdist, stand-in torch and wheel) and the
    directory of its compiler's record and orders. Any process of its build still running
    at the end is killed (a failure, not a leftover for the next test)."""
    wheelhouse = tmp_path / "wheelhouse"
    (wheelhouse / "src").mkdir(parents=True)
    (wheelhouse / "src" / "deepspeed-0.0.1.tar.gz").write_bytes(
        (shared / "deepspeed-0.0.1.tar.gz").read_bytes()
    )
    make_wheel(wheelhouse, "torch", "2.13.0")
    make_wheel(wheelhouse, "wheel", "0.48.0")
    yield tmp_path
    subprocess.run(["pkill", "-KILL", "-f", f"/tree/{key(tmp_path)}"], check=False)


def key(world: pathlib.Path) -> str:
    """The wheelhouse key of the test's build: its tree is build/tree/<key>."""
    return f"cpu-standin-{world.name}"


def running(world: pathlib.Path) -> list[str]:
    """The processes of the test's build (flock, pip, ninja, the compiler: each names its tree)."""
    found = subprocess.run(
        ["pgrep", "-af", f"/tree/{key(world)}"], capture_output=True, text=True, check=False
    )
    return found.stdout.splitlines()


def build(shared: pathlib.Path, world: pathlib.Path, phase: str = "all", timeout: int = 600):
    """One run of the build tasks (phase: all, or start: launched in the background); its rc,
    the build record the controller kept (None unless the build ended) and the output."""
    args = {
        "ansible_python_interpreter": sys.executable,
        "ansible_processor_nproc": 2,
        "ml_stack_build_host": "localhost",
        "ml_stack_build_dir": str(shared / "build"),
        "ml_stack_python": sys.executable,
        "ml_stack_build_timeout": timeout,
        "ml_stack_deepspeed_requirements": [],
        "ml_stack_deepspeed_build_env": {
            "cpu": {"CC": str(shared / "cc"), "STANDIN_DIR": str(world)}
        },
        # the plan's part build.yml reads (ml_stack's preflight registers the whole plan)
        "__ml_stack_plan": {
            "key": key(world),
            "accelerator": "cpu",
            "ops": OPS,
            "wheelhouse": str(world / "wheelhouse"),
            "sdist": "deepspeed-0.0.1.tar.gz",
            "ds_wheel_glob": "deepspeed-0.0.1*.whl",
            "torch_spec": "torch==2.13.0",
            "accel_requirements": [],
            "accel_build_env": {},
        },
        "__ml_stack_build_phase": phase,
    }
    # pip reads only the arguments: no pip.conf or PIP_* of this machine
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # ansible_processor_nproc as a gathered fact, under ansible_facts
    return rolefiles.run_local_play(
        PLAYBOOK, rolefiles.as_gathered(args), "BUILT", env=env | {"PIP_CONFIG_FILE": os.devnull}
    )


def compiled(world: pathlib.Path) -> list[str]:
    record = world / "compiled"
    return record.read_text().split() if record.exists() else []


def wheels(world: pathlib.Path) -> list[str]:
    return sorted(p.name for p in (world / "wheelhouse").glob("deepspeed-*.whl"))


def check_built(record: dict | None, out: str, world: pathlib.Path) -> None:
    assert record is not None, out[-4000:]
    assert record["ops"] == ["cpu_adam", "fused_adam"]
    assert set(record["op_links"]) == {"cpu_adam", "fused_adam"}
    assert wheels(world) == [record["wheel"]] and record["built_on"] == "localhost"


def test_a_build_failed_half_way_resumes_where_it_stopped(shared, world):
    (world / "fail").write_text("c.c\n")
    rc, record, out = build(shared, world)
    assert rc != 0 and record is None
    assert "stand-in cc: c.c does not compile" in out  # pip's output reaches the user
    first = compiled(world)
    assert first and "c.c" not in first, first
    assert wheels(world) == []
    (world / "fail").unlink()  # the fix
    rc, record, out = build(shared, world)
    assert rc == 0, out[-4000:]
    check_built(record, out, world)
    again = compiled(world)[len(first) :]
    # each object compiled once over both runs: the second only what the first had not
    assert "c.c" in again and sorted(first + again) == SOURCES, (first, again)


def test_a_build_killed_at_its_time_limit_resumes_and_stops_its_last_compile(shared, world):
    """The time limit kills the build's process group (flock, pip, ninja); ninja runs each
    compile in a process group of its own, so the compile under way outlives it, without the
    tree's lock. The next build, the lock held, kills that leftover before it builds, then
    compiles only that object again (ninja had no record of it); a shell working in the
    tree, not the build's, is left alone."""
    (world / "hang").write_text("d.c\n")  # the compile under way when the limit comes
    started = time.monotonic()
    rc, record, out = build(shared, world, timeout=12)
    assert rc != 0 and record is None
    assert time.monotonic() - started < 120, "the time limit did not end the build"
    first = compiled(world)
    assert first and "d.c" not in first, first
    # The killed group may take a moment to be reaped on a loaded machine: poll, bounded.
    deadline = time.monotonic() + 15
    while True:
        left = running(world)
        group = [line for line in left if line.split()[1] in ("flock", "ninja")]
        if not group or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [line for line in left if "csrc/fused/d.c" in line], left
    assert not group, left
    temp = shared / "build" / "tree" / key(world) / "build" / "temp"
    bystander = subprocess.Popen(["sleep", "300"], cwd=temp)  # someone's, in the tree
    (world / "hang").unlink()  # d.c compiles at once now; the leftover still waits
    try:
        # the leftover is still at d.c: the next build kills it (it never compiles d.c)
        rc, record, out = build(shared, world)
        assert rc == 0, out[-4000:]
        check_built(record, out, world)
        assert compiled(world)[len(first) :] == ["d.c"], compiled(world)
        assert running(world) == [] and (world / "at-d.c").exists()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def flocks(world: pathlib.Path) -> int:
    return sum(line.split()[1] == "flock" for line in running(world))


def wait_for(what, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_build_left_running_and_the_next_converges_never_build_at_once(shared, world):
    """The early play's background build goes on after its controller is gone; the next
    converge's build waits for the tree's lock, then finds every object built."""
    (world / "hang").write_text("b.c\n")
    rc, record, out = build(shared, world, phase="start")
    assert rc == 0 and record is None, out[-4000:]
    wait_for((world / "at-b.c").exists)  # the background build is at b.c
    assert any("csrc/adam/b.c" in line for line in running(world)), running(world)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        later = pool.submit(build, shared, world)
        wait_for(lambda: flocks(world) == 2)  # the next converge's build waits for the lock
        assert "b.c" not in compiled(world)
        (world / "at-b.c").unlink()  # the background build goes on
        rc, record, out = later.result(timeout=300)
    assert rc == 0, out[-4000:]
    check_built(record, out, world)
    # every object compiled once, all by the background build: the later one found them
    assert sorted(compiled(world)) == SOURCES, compiled(world)

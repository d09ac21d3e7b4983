"""The controller's wheelhouse against its hash locks (roles/ml_stack/files/hash_wheels.py,
run as the role runs it): the lock shipped for the default pins matches what the role
downloads, a byte changed after the lock was written stops with one line naming the file and
both digests (also with the old mtime put back), and the download takes only the lock's pins."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import yaml

from .. import rolefiles
from .test_wheelhouse_layers import make_wheel, sha

SCRIPT = rolefiles.path("ml_stack", "files/hash_wheels.py")
SHIPPED = rolefiles.path("ml_stack", "files/locks/cpu-torch2.13.0-ds0.19.8-cp311-x86_64.txt")
hash_wheels = rolefiles.load("ml_stack", "hash_wheels.py")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def lock_for(path: pathlib.Path, files: list[pathlib.Path], extra: str = "") -> pathlib.Path:
    """A --generate-hashes style lock (continuation lines) pinning each file by its sha256."""
    lines = []
    for f in files:
        name, version = f.name.split("-")[:2]
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha(f)}\n")
    path.write_text("# a lock\n" + "".join(lines) + extra)
    return path


@pytest.fixture
def house(tmp_path):
    wh = tmp_path / "wh"
    (wh / "src").mkdir(parents=True)
    wheels = [make_wheel(wh, "torch", "2.13.0+cpu"), make_wheel(wh, "numpy", "2.4.6")]
    sdist = wh / "src" / "deepspeed-0.19.8.tar.gz"
    sdist.write_bytes(b"deepspeed source")
    extra = f"deepspeed==0.19.8 \\\n    --hash=sha256:{sha(sdist)}\n"
    return wh, wheels, sdist, lock_for(tmp_path / "base.txt", wheels, extra)


def flip_a_byte_keeping_mtime(path: pathlib.Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -r: size and mtime as before
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_shipped_lock_pins_every_default_requirement_and_the_sdist():
    pins = hash_wheels.read_lock(SHIPPED)
    assert pins["torch"]["version"] == "2.13.0+cpu"
    assert pins["deepspeed"] == {
        "version": "0.19.8",
        "hashes": ["9e491abd0827ea5c389dd702e15e11e13d83d904bac4a20d6c2a4cb37207a9af"],
    }
    defaults = (rolefiles.path("ml_stack", "defaults/main.yml")).read_text()
    reqs = yaml.safe_load(defaults)["ml_stack_deepspeed_requirements"]
    hash_wheels.check_requirements(
        ["torch==2.13.0+cpu", "setuptools", "wheel", *reqs], pins, SHIPPED
    )


def test_local_torch_wheel_is_the_one_the_lock_pins():
    """pip's find-links copy of torch here is what `pip download torch==2.13.0+cpu` takes."""
    wheel = pathlib.Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    if not wheel.is_file():
        pytest.skip("no local torch wheel on this machine")
    digest = hash_wheels.sha256(wheel)
    assert digest in hash_wheels.read_lock(SHIPPED)["torch"]["hashes"]


def test_an_untouched_wheelhouse_passes_against_lock_and_lock_json(house):
    wh, _wheels, sdist, lock = house
    assert run("verify", wh, "--lock", lock, "--sdist", sdist).returncode == 0
    lock_json = wh / "lock.json"
    lock_json.write_text(
        json.dumps({"wheels": {w["name"]: w for w in hash_wheels.hash_wheels(wh)}})
    )
    proc = run("verify", wh, "--lock", lock, "--lock-json", lock_json, "--sdist", sdist)
    assert proc.returncode == 0, proc.stderr


def test_a_changed_byte_with_mtime_restored_is_caught_despite_the_digest_cache(house):
    wh, wheels, sdist, lock = house
    lock_json = wh / "lock.json"
    lock_json.write_text(
        json.dumps({"wheels": {w["name"]: w for w in hash_wheels.hash_wheels(wh)}})
    )
    assert (wh / hash_wheels.CACHE).is_file()  # the cache the next run would reuse
    good = sha(wheels[0])
    flip_a_byte_keeping_mtime(wheels[0])
    proc = run("verify", wh, "--lock", lock, "--lock-json", lock_json, "--sdist", sdist)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(wheels[0]) in lines[0] and sha(wheels[0]) in lines[0] and good in lines[0]
    # against the shipped-style lock alone, too (lock.json edited to match would not help)
    lock_json.write_text(
        json.dumps({"wheels": {w["name"]: w for w in hash_wheels.hash_wheels(wh)}})
    )
    proc = run("verify", wh, "--lock", lock, "--lock-json", lock_json, "--sdist", sdist)
    assert proc.returncode == 1 and good in proc.stderr and str(lock) in proc.stderr


def test_a_tampered_sdist_stops_with_one_line(house):
    wh, _wheels, sdist, lock = house
    good = sha(sdist)
    flip_a_byte_keeping_mtime(sdist)
    proc = run("verify", wh, "--lock", lock, "--sdist", sdist)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert str(sdist) in proc.stderr and good in proc.stderr and sha(sdist) in proc.stderr
    proc = run("verify", wh, "--sdist", sdist, "--sdist-sha256", good)
    assert proc.returncode == 1 and good in proc.stderr and sha(sdist) in proc.stderr


def test_a_wheel_no_lock_pins_is_refused_but_the_built_deepspeed_wheel_is_not(house):
    wh, _wheels, _sdist, lock = house
    built = make_wheel(wh, "deepspeed", "0.19.8")
    assert run("verify", wh, "--lock", lock, "--built", "deepspeed-0.19.8*.whl").returncode == 0
    extra = make_wheel(wh, "evil", "1.0")
    proc = run("verify", wh, "--lock", lock, "--built", "deepspeed-0.19.8*.whl")
    assert proc.returncode == 1 and str(extra) in proc.stderr
    extra.unlink()
    # once lock.json is written, the built wheel is checked against it
    lock_json = wh / "lock.json"
    lock_json.write_text(
        json.dumps({"wheels": {w["name"]: w for w in hash_wheels.hash_wheels(wh)}})
    )
    recorded = sha(built)
    flip_a_byte_keeping_mtime(built)
    proc = run(
        "verify", wh, "--lock", lock, "--lock-json", lock_json, "--built", "deepspeed-0.19.8*.whl"
    )
    assert proc.returncode == 1 and recorded in proc.stderr and str(built) in proc.stderr


def test_the_digest_cache_is_believed_only_when_private(house, monkeypatch):
    wh, wheels, _sdist, _lock = house
    hash_wheels.hash_wheels(wh)
    cache = wh / hash_wheels.CACHE
    hashed = []
    real = hash_wheels.sha256
    monkeypatch.setattr(hash_wheels, "sha256", lambda p: hashed.append(p.name) or real(p))
    hash_wheels.hash_wheels(wh)
    assert hashed == []  # reused: size, mtime, ctime and inode unchanged
    # a record anyone else could have written is not believed
    cache.chmod(0o666)
    hash_wheels.hash_wheels(wh)
    assert sorted(hashed) == sorted(w.name for w in wheels)
    cache.chmod(0o600)
    # a forged record with the wheel's new stamp, but the directory open to others
    hashed.clear()
    wh.chmod(0o777)
    hash_wheels.hash_wheels(wh)
    assert len(hashed) == len(wheels)
    wh.chmod(0o755)


def test_download_takes_only_the_lock_pins_and_refuses_a_changed_file(tmp_path):
    index = tmp_path / "index"
    index.mkdir()
    good = make_wheel(index, "einops", "0.8.2")
    lock = lock_for(
        tmp_path / "lock.txt", [good], "deepspeed==0.19.8 --hash=sha256:" + "0" * 64 + "\n"
    )
    make_wheel(index, "einops", "0.9.0")  # newer on the index: not taken
    dest = tmp_path / "wh"
    dest.mkdir()
    pip = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
           "--no-index", "--find-links", str(index), "--dest", str(dest)]  # fmt: skip
    proc = run("download", "--lock", lock, "--dest", dest, "--exclude", "deepspeed",
               "--require", "einops", "--", *pip)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == [good.name]
    # the index's file changed after the lock was written: refused in one line, not kept
    (dest / good.name).unlink()
    recorded = sha(good)
    make_wheel(index, "einops", "0.8.2", modules={"einops/__init__.py": "import os\n"})
    proc = run("download", "--lock", lock, "--dest", dest, "--exclude", "deepspeed", "--", *pip)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert recorded in proc.stderr and sha(good) in proc.stderr and good.name in proc.stderr
    assert not (dest / good.name).exists()
    # a requirement the lock does not satisfy is refused before anything is downloaded
    proc = run("download", "--lock", lock, "--dest", dest, "--require", "einops>=0.9",
               "--require", "tqdm", "--", *pip)  # fmt: skip
    assert proc.returncode == 1 and "einops>=0.9" in proc.stderr
    assert "ml_stack_base_lock_file" in proc.stderr


def test_a_pin_with_an_index_of_its_own_is_downloaded_from_it_alone(tmp_path):
    """--index-for torch=URL (the role's cpu and CUDA builds: torch==X+cpu is on PyTorch's
    index, not on PyPI): that pin comes in its own pip run with URL as an extra index; the
    others' run never names URL, so an index that does not answer costs one package's retries."""
    plain = tmp_path / "plain"
    plain.mkdir()
    good = make_wheel(plain, "einops", "0.8.2")
    simple = tmp_path / "torchidx" / "simple"
    (simple / "tinytorch").mkdir(parents=True)
    torch = make_wheel(simple / "tinytorch", "tinytorch", "2.13.0+cpu")
    (simple / "tinytorch" / "index.html").write_text(f'<a href="{torch.name}">{torch.name}</a>\n')
    lock = lock_for(tmp_path / "lock.txt", [good, torch])
    dest = tmp_path / "wh"
    dest.mkdir()
    # --isolated: this machine's pip configuration (its find-links and indexes) left out
    pip = [sys.executable, "-m", "pip", "--isolated", "download", "--disable-pip-version-check",
           "--quiet", "--no-index", "--find-links", str(plain), "--retries", "0"]  # fmt: skip
    index = f"tinytorch={simple.as_uri()}"
    proc = run("download", "--lock", lock, "--dest", dest, "--index-for", index, "--", *pip)
    # --no-index: pip ignores every index, the one given too; the pin is asked for alone
    assert proc.returncode == 1 and "tinytorch" in proc.stderr, proc.stderr
    assert "einops" not in proc.stderr
    pip.remove("--no-index")
    pip += ["--index-url", (tmp_path / "empty").as_uri()]
    (tmp_path / "empty").mkdir()
    proc = run("download", "--lock", lock, "--dest", dest, "--index-for", index, "--", *pip)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted([good.name, torch.name])
    bad = run("download", "--lock", lock, "--dest", dest, "--index-for", "tinytorch", "--", *pip)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "--index-for 'tinytorch': give NAME=URL, e.g. torch=https://download.pytorch.org/whl/cpu"
    ]


def test_a_lock_without_hashes_is_refused(tmp_path):
    bad = tmp_path / "lock.txt"
    bad.write_text(
        textwrap.dedent("""\
        numpy==2.4.6
    """)
    )
    with pytest.raises(hash_wheels.Refused, match="generate-hashes"):
        hash_wheels.read_lock(bad)

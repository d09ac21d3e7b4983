#!/usr/bin/env python3
"""Print this node's versions manifest as JSON (run with the cluster venv's python).

  record_versions.py WHEELHOUSE [USER_WHEELHOUSE [TOOLS_VENV]] [--want JSON]

Recorded by the ml_stack role into /etc/ansible/facts.d/ml_stack.fact and compared across
nodes by the verify step and by `dscluster doctor`: any difference is skew. The role also
reads it before installing: a node whose manifest already matches the controller's locks
skips the install (the venv's lock copies, the tools layer's uv and these scripts' own
digests are in it for that). With --want (what the controller expects: the pins, the
pre-built ops, the user layer's key, uv's version and the digests of its locks, wheels and
scripts) the manifest gets a "verdict": for the venv and for the node's wheelhouse, whether
each matches and the names of what differs (the role's fact leaves it out).

Wheel digests are kept in the venv (HASH_CACHE) with each file's size and mtime, so a
re-converge does not read every wheel (torch alone is hundreds of MB) again. What only an
import of torch and DeepSpeed can tell (their versions, the ops built in, the CUDA and NCCL
torch was built with) is kept there too (STACK_CACHE), under a stamp of every installed
distribution's RECORD (name, mtime, size): any install, removal or reinstall in the venv
changes the stamp and the next reading imports them again.
"""

import argparse
import contextlib
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import sysconfig

from filedigest import sha256

# What the role installs beside this file; their digests tell it the install is current.
INSTALLED_SCRIPTS = ("record_versions.py", "filedigest.py", "install_bench.py", "pycache_seed.py")
HASH_CACHE = pathlib.Path(sys.prefix) / "dscluster-wheel-hashes.json"
STACK_CACHE = pathlib.Path(sys.prefix) / "dscluster-stack-cache.json"


def wheel_digests(folder: pathlib.Path) -> dict[str, str]:
    """wheel name -> sha256 for the folder, through HASH_CACHE (size and mtime unchanged:
    the recorded digest is reused)."""
    try:
        cache = json.loads(HASH_CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    fresh, out = {}, {}
    for wheel in sorted(folder.glob("*.whl")):
        st = wheel.stat()
        known = cache.get(str(wheel)) if isinstance(cache, dict) else None
        same = isinstance(known, dict) and known.get("size") == st.st_size
        if same and known.get("mtime_ns") == st.st_mtime_ns and known.get("sha256"):
            digest = known["sha256"]
        else:
            digest = sha256(wheel)
        fresh[str(wheel)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
        out[wheel.name] = digest
    if fresh != cache:
        with contextlib.suppress(OSError):
            tmp = HASH_CACHE.with_name(f"{HASH_CACHE.name}.{os.getpid()}")
            tmp.write_text(json.dumps(fresh, sort_keys=True))
            os.replace(tmp, HASH_CACHE)
    return out


def file_sha256(path: pathlib.Path) -> str:
    return sha256(path) if path.is_file() else ""


def uv_of(venv: pathlib.Path | None) -> pathlib.Path | None:
    """The tools layer's uv, or None where that venv has none."""
    uv = venv / "bin" / "uv" if venv is not None else None
    return uv if uv is not None and uv.exists() else None


def tools_uv(venv: pathlib.Path | None) -> str:
    """The uv version of the tools layer's venv ("" when there is none)."""
    uv = uv_of(venv)
    if uv is None:
        return ""
    words = command_output([str(uv), "--version"]).split()
    return words[1] if len(words) > 1 else ""


def pip_check(venv: pathlib.Path | None) -> dict:
    """What the tools layer's `uv pip check` says of this venv: its exit status (null when it
    could not run) and its output. One run with the reading, where a second command would
    cost the provision another round trip per node."""
    uv = uv_of(venv)
    if uv is None:
        return {"rc": None, "output": f"no uv in the tools layer ({venv})"}
    try:
        proc = subprocess.run(
            [str(uv), "pip", "check", "--python", sys.executable],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"rc": None, "output": str(exc)}
    return {"rc": proc.returncode, "output": f"{proc.stdout} {proc.stderr}".strip()}


def command_output(argv: list[str]) -> str:
    """stdout of a command, or "" when it is missing or fails (a CPU node has no nvidia-smi)."""
    exe = shutil.which(argv[0]) or (argv[0] if pathlib.Path(argv[0]).is_file() else None)
    if exe is None:
        return ""
    try:
        out = subprocess.run(
            [exe, *argv[1:]], check=False, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def nvidia_driver() -> str:
    """The loaded kernel driver's version, else the installed user-space one (containers)."""
    text = ""
    with contextlib.suppress(OSError):
        text = pathlib.Path("/proc/driver/nvidia/version").read_text()
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9.]+)", text)
    if match:
        return match.group(1)
    out = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else ""


def package_version(name: str) -> str:
    return command_output(["dpkg-query", "-W", "-f=${Version}", name])


def libfabric() -> str:
    for fi_info in ("/opt/amazon/efa/bin/fi_info", "fi_info"):
        out = command_output([fi_info, "--version"])
        match = re.search(r"libfabric:\s*(\S+)", out)
        if match:
            return match.group(1)
    return ""


def nccl_version(torch) -> str:
    """NCCL torch was built with (torch.cuda.nccl.version needs no GPU); "" on CPU builds."""
    if not torch.version.cuda:
        return ""
    try:
        version = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError):
        return ""
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def accelerator(torch) -> str:
    """The device type torch was built for: cuda, hpu (Habana's plugin) or cpu."""
    if torch.version.cuda:
        return "cuda"
    with contextlib.suppress(ImportError):
        import habana_frameworks.torch  # noqa: F401, PLC0415

        return "hpu"
    return "cpu"


def installed_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def locked_pins(lock: pathlib.Path) -> dict[str, str]:
    """name -> version of a requirements.lock (`name==version --hash=...` lines)."""
    pins = {}
    if lock.exists():
        for line in lock.read_text().splitlines():
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
            if match:
                pins[match.group(1)] = match.group(2)
    return pins


def same_version(have: str, locked: str) -> bool:
    if have == locked:
        return True
    try:
        from packaging.version import InvalidVersion, Version  # noqa: PLC0415 - base lock

        return bool(have) and Version(have) == Version(locked)
    except (ImportError, InvalidVersion):
        return False


def drift(pins: dict[str, str]) -> dict[str, str]:
    """The locked distributions the venv has at another version ("" = missing)."""
    return {
        name: have
        for name, v in pins.items()
        if not same_version(have := installed_version(name), v)
    }


def user_layer(user_dir: pathlib.Path | None) -> dict:
    """The user layer's key, lock hash and packages, and what of it the venv lacks."""
    lock_json = user_dir / "lock.json" if user_dir else None
    if lock_json is None or not lock_json.exists():
        return {"key": "", "lock_sha256": "", "packages": {}, "drift": {}}
    lock = json.loads(lock_json.read_text())
    packages = dict(lock.get("packages", {}))
    return {
        "key": lock.get("key", ""),
        "lock_sha256": sha256(user_dir / "requirements.lock"),
        "packages": packages,
        "drift": drift(packages),
    }


def installed_stamp() -> str:
    """Every installed distribution of this venv, as its RECORD's name, mtime and size.

    The mtime in whole seconds: a baked image keeps no more (docker export writes seconds),
    and a node started from it must find the reading its image was baked with. An install
    rewrites RECORD; one at the same size within the second of the cached reading would go
    unseen.
    """
    digest = hashlib.sha256()
    for site in sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}):
        for record in sorted(pathlib.Path(site).glob("*.dist-info/RECORD")):
            st = record.stat()
            digest.update(f"{record.parent.name}\0{int(st.st_mtime)}\0{st.st_size}\n".encode())
    return digest.hexdigest()


def stack_versions() -> dict:
    """torch's and DeepSpeed's own answers (STACK_CACHE while the venv is unchanged)."""
    stamp = installed_stamp()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        cached = json.loads(STACK_CACHE.read_text())
        if cached["stamp"] == stamp:
            return dict(cached["versions"])
    # DeepSpeed logs to stdout while importing; keep stdout for the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: PLC0415
        import torch  # noqa: PLC0415
        from deepspeed.git_version_info import installed_ops  # noqa: PLC0415
    versions = {
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "installed_ops": sorted(name for name, built in installed_ops.items() if built),
        "accelerator": accelerator(torch),
        "cuda": torch.version.cuda or "",
        "nccl": nccl_version(torch),
    }
    with contextlib.suppress(OSError):
        tmp = STACK_CACHE.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stamp": stamp, "versions": versions}))
        os.replace(tmp, STACK_CACHE)
    return versions


def pinned(have: str, want: str) -> bool:
    """The version asked for, with or without a local label (2.13.0+cpu is 2.13.0)."""
    return re.match(re.escape(want) + r"($|\+)", have) is not None


def verdict(reading: dict, want: dict) -> dict:
    """The reading against what the controller expects, for the venv (installed from the
    locks, by the tools layer's uv, with these scripts) and for the node's wheelhouse (its
    wheels and locks, and the venv's distributions at the versions they pin)."""
    digests = want["digests"]
    venv = {
        "torch": pinned(reading["torch"], want["torch"]),
        "deepspeed": pinned(reading["deepspeed"], want["deepspeed"]),
        "ops": set(want["ops"]) <= set(reading["installed_ops"]),
        "venv lock.json": reading["venv_lock_sha256"] == digests["lock.json"],
        "venv user lock.json": reading["venv_user_lock_sha256"] == digests["user lock.json"],
        "uv": reading["tools_uv"] == want["uv"],
        "scripts": reading["scripts"] == digests["scripts"],
    }
    wheelhouse = {
        "wheels": reading["wheels"] == digests["wheels"],
        "requirements.lock": reading["lock_sha256"] == digests["requirements.lock"],
        "base drift": not reading["base_drift"],
        "user layer key": reading["user_layer_key"] == want["user_layer_key"],
        "user layer drift": not reading["user_layer"]["drift"],
        "user requirements.lock": reading["user_lock_sha256"] == digests["user requirements.lock"],
    }
    return {
        side: {
            "ok": all(checks.values()),
            "differs": [name for name, held in checks.items() if not held],
        }
        for side, checks in (("venv", venv), ("wheelhouse", wheelhouse))
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheelhouse", type=pathlib.Path)
    parser.add_argument("user_wheelhouse", type=pathlib.Path, nargs="?")
    parser.add_argument("tools_venv", type=pathlib.Path, nargs="?")
    parser.add_argument("--want", type=json.loads, help="what the controller expects (JSON)")
    parser.add_argument(
        "--pip-check", action="store_true", help="also run the tools layer's uv pip check"
    )
    args = parser.parse_args()

    lock = args.wheelhouse / "requirements.lock"
    manifest = {
        "python": platform.python_version(),
        **stack_versions(),
        "nvidia_driver": nvidia_driver(),
        "synapseai": package_version("habanalabs-graph"),
        "libfabric": libfabric(),
        "lock_sha256": sha256(lock) if lock.exists() else "",
        "wheels": wheel_digests(args.wheelhouse),
        # Base distributions installed at another version than the base lock's (a user
        # layer must never replace one).
        "base_drift": drift(locked_pins(lock)),
    }
    layer = user_layer(args.user_wheelhouse)
    manifest["user_layer"] = layer
    manifest["user_layer_key"] = layer["key"]
    manifest["user_lock_sha256"] = layer["lock_sha256"]
    # What the install step left: the locks the venv was installed from, the tools layer's
    # uv, and the digests of the scripts installed beside this one.
    venv = pathlib.Path(sys.prefix)
    manifest["venv_lock_sha256"] = file_sha256(venv / "dscluster-lock.json")
    manifest["venv_user_lock_sha256"] = file_sha256(venv / "dscluster-user-lock.json")
    manifest["tools_uv"] = tools_uv(args.tools_venv)
    here = pathlib.Path(__file__).resolve().parent
    manifest["scripts"] = {name: file_sha256(here / name) for name in INSTALLED_SCRIPTS}
    if args.want is not None:
        manifest["verdict"] = verdict(manifest, args.want)
    if args.pip_check:
        manifest["pip_check"] = pip_check(args.tools_venv)
    json.dump(manifest, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

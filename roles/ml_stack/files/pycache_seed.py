"""Seed the ranks' bytecode prefix (PYTHONPYCACHEPREFIX) from the venv's own bytecode, then
compile into it what a training job imports beyond that.

Run as the training user, `python3 /opt/dscluster/bin/pycache_seed.py VENV PREFIX [MODULE...]`
(installed there, root-owned, by install.yml), by roles/ml_stack/tasks/node.yml when the venv
or the prefix is new. With a prefix set, Python
reads bytecode only there: what root's readings compiled into the venv (torch, DeepSpeed's top
level) would be compiled again by the first job on the node. Each `__pycache__/X.pyc` under
VENV is copied to where the prefix keeps it (PREFIX + the source's directory + X.pyc) unless a
file with the same header (magic, flags, source mtime and size) is there. The same for the
standard library of VENV's Python (Debian compiles it at install; with a prefix set, Python
would not read those files and every process of the first job compiles ~210 modules afresh):
its plain bytecode (not -O's), the test package and any site-/dist-packages under it left out.

Then VENV's Python imports each MODULE with the prefix set (the role names them where a node
runs several ranks), so their bytecode is written there once, at install, instead of by every
rank of the node's first job (each rank compiles the same modules side by side: torch's
optimizers import torch._dynamo, DeepSpeed's engine torch's compiler stack, about 1500
modules and 5 s of a core per rank here). A module that does not import (another DeepSpeed
version has no such module) is named, not fatal: this only saves time.
Prints {"copied": N, "kept": M, "stdlib_copied": S, "stdlib_kept": K, "compiled": C,
"imported": [...], "not_imported": {MODULE: why}} (stdlib_* only where VENV's Python answered).
"""

import json
import os
import subprocess
import sys

# Run by VENV's Python: import each module named in argv, print what did not import, and why.
WARM = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed[name] = (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:200]
print(json.dumps(failed))
"""
WARM_TIMEOUT_S = 600

HEADER = 16  # PEP 552: magic, flags, source mtime, source size

# Run by VENV's Python: where its standard library is, and the tag of its bytecode files.
WHERE = """
import json, sys, sysconfig
print(json.dumps([sysconfig.get_path("stdlib"), sys.implementation.cache_tag]))
"""
# Under the standard library, what a training job does not read from it.
STDLIB_SKIP = {"site-packages", "dist-packages", "test"}


def head(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(HEADER)
    except OSError:
        return None


def seed(venv, prefix, skip=(), suffix=".pyc"):
    """Copy each `__pycache__/X<suffix>` under `venv` (a directory tree) into the prefix."""
    copied = kept = 0
    for root, dirs, files in os.walk(venv):
        dirs[:] = [d for d in dirs if d not in skip]
        if os.path.basename(root) != "__pycache__":
            continue
        target = prefix + os.path.dirname(os.path.abspath(root))
        for name in files:
            if not name.endswith(suffix):
                continue
            src = os.path.join(root, name)
            dst = os.path.join(target, name)
            want = head(src)
            if want is None or head(dst) == want:
                kept += want is not None
                continue
            try:
                os.makedirs(target, exist_ok=True)
                with open(src, "rb") as fh:
                    data = fh.read()
                tmp = f"{dst}.{os.getpid()}.tmp"
                with open(tmp, "wb") as out:
                    out.write(data)
                os.replace(tmp, dst)
                copied += 1
            except OSError:
                continue
    return {"copied": copied, "kept": kept}


def stdlib_of(venv):
    """(standard library directory, bytecode tag) of VENV's Python, or None if it does not run."""
    try:
        proc = subprocess.run(
            [os.path.join(venv, "bin", "python"), "-I", "-S", "-c", WHERE],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        where, tag = json.loads(proc.stdout) if proc.returncode == 0 else (None, None)
    except (OSError, subprocess.TimeoutExpired, ValueError, TypeError):
        return None
    return (where, tag) if where and os.path.isdir(where) else None


def seed_stdlib(venv, prefix):
    found = stdlib_of(venv)
    if found is None:
        return {}
    where, tag = found
    done = seed(where, prefix, skip=STDLIB_SKIP, suffix=f".{tag}.pyc")
    return {"stdlib_copied": done["copied"], "stdlib_kept": done["kept"]}


def count_bytecode(prefix):
    return sum(name.endswith(".pyc") for _root, _dirs, files in os.walk(prefix) for name in files)


def last_json_object(text):
    """The last line of `text` that is a JSON object: the verdict, whatever an imported
    module printed before it (DeepSpeed logs to stdout) or after it (at exit)."""
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def warm(venv, prefix, modules):
    """Import `modules` with VENV's Python, bytecode written into `prefix`."""
    before = count_bytecode(prefix)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = prefix
    try:
        proc = subprocess.run(
            [os.path.join(venv, "bin", "python"), "-c", WARM, *modules],
            capture_output=True,
            text=True,
            env=env,
            timeout=WARM_TIMEOUT_S,
            check=False,
        )
        verdict = last_json_object(proc.stdout) if proc.returncode == 0 else None
        if verdict is not None:
            failed = verdict
        else:
            why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200]
            failed = dict.fromkeys(modules, why)
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed = dict.fromkeys(modules, f"{type(exc).__name__}: {exc}"[:200])
    return {
        "compiled": count_bytecode(prefix) - before,
        "imported": [m for m in modules if m not in failed],
        "not_imported": failed,
    }


if __name__ == "__main__":
    venv, prefix, modules = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3:]
    result = seed(venv, prefix)
    result.update(seed_stdlib(venv, prefix))
    if modules:
        result.update(warm(venv, prefix, modules))
    print(json.dumps(result))

"""Seed the ranks' bytecode prefix (PYTHONPYCACHEPREFIX) from the venv's own bytecode.

Run as the training user, `python3 -c <this file> VENV PREFIX`, by roles/ml_stack/tasks/main.yml
when the venv or the prefix is new. With a prefix set, Python reads bytecode only there: what
root's readings compiled into the venv (torch, DeepSpeed's top level) would be compiled again
by the first job on the node. Each `__pycache__/X.pyc` under VENV is copied to where the
prefix keeps it (PREFIX + the source's directory + X.pyc) unless a file with the same header
(magic, flags, source mtime and size) is there. Prints {"copied": N, "kept": M}.
"""

import json
import os
import sys

HEADER = 16  # PEP 552: magic, flags, source mtime, source size


def head(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(HEADER)
    except OSError:
        return None


def seed(venv, prefix):
    copied = kept = 0
    for root, _dirs, files in os.walk(venv):
        if os.path.basename(root) != "__pycache__":
            continue
        target = prefix + os.path.dirname(os.path.abspath(root))
        for name in files:
            if not name.endswith(".pyc"):
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


if __name__ == "__main__":
    print(json.dumps(seed(sys.argv[1], sys.argv[2].rstrip("/"))))

#!/usr/bin/env python3
"""Print this node's versions manifest as JSON (run with the cluster venv's python).

Recorded by the ml_stack role into /etc/ansible/facts.d/ml_stack.fact and compared across
nodes by the verify step and by `dscluster doctor`: any difference is skew.
"""

import contextlib
import hashlib
import json
import pathlib
import platform
import sys


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> int:
    wheelhouse = pathlib.Path(sys.argv[1])
    # DeepSpeed logs to stdout while importing; keep stdout for the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        import deepspeed  # noqa: PLC0415
        import torch  # noqa: PLC0415
        from deepspeed.git_version_info import installed_ops  # noqa: PLC0415

    lock = wheelhouse / "requirements.lock"
    manifest = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "installed_ops": sorted(name for name, built in installed_ops.items() if built),
        "cuda": torch.version.cuda or "",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "",
        "lock_sha256": sha256(lock) if lock.exists() else "",
        "wheels": {p.name: sha256(p) for p in sorted(wheelhouse.glob("*.whl"))},
    }
    json.dump(manifest, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

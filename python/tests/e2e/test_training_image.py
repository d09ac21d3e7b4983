"""The multi-node training image (docker/training): built from a real dscluster wheelhouse,
two containers reach each other over pdsh/ssh with pinned host keys, and both run exactly
the locked torch/DeepSpeed with the pre-built ops. Needs a Docker engine and a wheelhouse
(the cluster scenario or the e2e test assembles one)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from .. import rolefiles

# Its own two containers: no use of the session cluster (make test runs it beside e2e).
pytestmark = [pytest.mark.docker, pytest.mark.own_containers]

ROOT = rolefiles.REPO
BUILD = ROOT / "docker" / "training" / "build.sh"
NET = "dsc-timg"
NODES = ("dsc-timg-n1", "dsc-timg-n2")
PORT = 2222


def sh(*argv: str, check: bool = True, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)


def cpu_wheelhouse() -> pathlib.Path:
    """The newest complete CPU wheelhouse in the dscluster cache, one for the default node
    image's Python (cp311, Debian 12) first: a cache may also hold a trixie node's cp313 one."""
    cache = pathlib.Path(
        os.environ.get("DSCLUSTER_CACHE", pathlib.Path.home() / ".cache" / "dscluster")
    )
    found = []
    for lock in (cache / "wheelhouse").glob("*/lock.json"):
        data = json.loads(lock.read_text())
        if data.get("accelerator", "cpu") == "cpu" and any(
            w.startswith("deepspeed-") for w in data["wheels"]
        ):
            found.append(("-cp311-" in lock.parent.name, lock.stat().st_mtime, lock.parent))
    if not found:
        pytest.fail(f"no CPU wheelhouse under {cache}/wheelhouse; run 'make demo' first")
    return max(found)[2]


def cleanup() -> None:
    sh("docker", "rm", "-f", *NODES, check=False)
    sh("docker", "network", "rm", NET, check=False)


@pytest.fixture(scope="module")
def image() -> tuple[str, dict]:
    wheelhouse = cpu_wheelhouse()
    tag = sh("bash", str(BUILD), "cpu", str(wheelhouse)).stdout.strip()
    assert tag.startswith("dscluster/training:cpu-"), tag
    return tag, json.loads((wheelhouse / "lock.json").read_text())


def test_variant_must_match_the_wheelhouse():
    proc = sh("bash", str(BUILD), "cuda", str(cpu_wheelhouse()), check=False)
    assert proc.returncode != 0
    assert "built for 'cpu'" in proc.stderr and "cuda variant" in proc.stderr


def test_python_must_match_the_default_base(tmp_path):
    """A wheelhouse for a Python no default base runs is refused before Docker is asked."""
    lock = json.loads((cpu_wheelhouse() / "lock.json").read_text())
    lock["key"] = lock["key"].replace("-cp311-", "-cp310-").replace("-cp313-", "-cp310-")
    (tmp_path / "lock.json").write_text(json.dumps(lock))
    (tmp_path / "requirements.lock").write_text("")
    proc = sh("bash", str(BUILD), "cpu", str(tmp_path), check=False)
    assert proc.returncode != 0 and proc.stdout == ""
    assert "built for Python cp310" in proc.stderr and "runs cp311" in proc.stderr


def test_two_containers_run_the_locked_stack_over_pdsh(image, tmp_path):
    tag, lock = image
    cleanup()
    try:
        key = tmp_path / "id_ed25519"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        sh("docker", "network", "create", NET)
        for node in NODES:
            sh(
                "docker", "run", "-d", "--name", node, "--hostname", node, "--network", NET,
                "--shm-size", "1g", "-v", f"{key}.pub:/etc/dscluster/authorized_keys:ro", tag,
            )  # fmt: skip
        # Pin every container's own host key (made at start, none baked into the image).
        known = tmp_path / "known_hosts"
        lines = []
        for node in NODES:
            pub = ""
            for _ in range(60):
                pub = sh("docker", "exec", node, "cat", "/etc/ssh/ssh_host_ed25519_key.pub",
                         check=False).stdout.strip()  # fmt: skip
                if pub:
                    break
                sh("sleep", "1")
            assert pub, f"{node} made no host key"
            lines.append(f"[{node}]:{PORT} {' '.join(pub.split()[:2])}")
        known.write_text("\n".join(lines) + "\n")
        head = NODES[0]
        for node in NODES:
            sh("docker", "cp", str(known), f"{node}:/etc/ssh/ssh_known_hosts")
        sh("docker", "cp", str(key), f"{head}:/root/.ssh/id_ed25519")
        sh("docker", "exec", head, "chmod", "0600", "/root/.ssh/id_ed25519")
        probe = (
            "python -c 'import contextlib, json, sys\n"
            "with contextlib.redirect_stdout(sys.stderr):\n"
            "    import torch, deepspeed\n"
            "    from deepspeed.git_version_info import installed_ops\n"
            "print(json.dumps([torch.__version__, deepspeed.__version__,"
            " sorted(k for k, v in installed_ops.items() if v)]))' 2>/dev/null"
        )
        out = sh("docker", "exec", head, "pdsh", "-w", ",".join(NODES), probe, timeout=300)
        seen = {}
        for line in out.stdout.splitlines():
            host, _, payload = line.partition(": ")
            seen[host] = json.loads(payload)
        assert sorted(seen) == sorted(NODES), out.stdout + out.stderr
        torch_version = lock["torch"].removeprefix("torch==")
        for host, (torch_v, ds_v, ops) in seen.items():
            assert torch_v == torch_version, host
            assert ds_v == lock["deepspeed"], host
            assert set(lock["prebuilt_ops"]) <= set(ops), (host, ops)
        # Host key checking stays strict: an unknown host is refused, not prompted for.
        (tmp_path / "empty").write_text("")
        sh("docker", "cp", str(tmp_path / "empty"), f"{head}:/etc/ssh/ssh_known_hosts")
        refused = sh("docker", "exec", head, "ssh", NODES[1], "true", check=False, timeout=60)
        assert refused.returncode != 0
        assert "Host key verification failed" in refused.stderr
    finally:
        cleanup()

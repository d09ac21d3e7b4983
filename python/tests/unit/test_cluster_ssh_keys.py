"""cluster_ssh's controller side (tasks/install.yml): the key directory and the cluster key
pair are made by their modules, which change nothing on a re-converge while the directory is
0700 and both halves of the key pair are there at 0600 (a changed mode or a missing key pair
is mended by them)."""

from __future__ import annotations

import os
import pathlib
import re
import sys

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "cluster_ssh_controller_keys.yml"
TASKS = ("Create the controller key directory", "Make the cluster key pair on the controller")
CLOSE = "Close the cluster private key to its owner"


def run(key_dir: pathlib.Path, tasks: tuple[str, ...] = TASKS) -> tuple[dict, dict[str, str]]:
    """One run: what the play printed, and the status of each of tasks ('changed', 'ok',
    'skipping')."""
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(rolefiles.ROLES))
    extra = {
        "ansible_python_interpreter": sys.executable,
        "dscluster_state_dir": str(key_dir),
        "cluster_ssh_key_dir": str(key_dir),
    }
    rc, keys, out = rolefiles.run_local_play(PLAYBOOK, extra, "KEYS", env=env)
    assert rc == 0 and keys is not None, out
    status = {}
    for name in tasks:
        block = out.split(f"TASK [cluster_ssh : {name}]", 1)[1]
        found = re.search(r"^(changed|ok|skipping):", block, re.M)
        assert found, block[:2000]
        status[name] = found.group(1)
    return keys, status


def modes(key_dir: pathlib.Path) -> list[str]:
    paths = [key_dir, key_dir / "cluster_ed25519", key_dir / "cluster_ed25519.pub"]
    return [oct(p.stat().st_mode & 0o777) for p in paths]


def test_the_key_pair_is_made_once_then_skipped_until_a_mode_or_a_half_differs(tmp_path):
    key_dir = tmp_path / "state"
    _, status = run(key_dir)
    assert set(status.values()) == {"changed"}
    assert modes(key_dir) == ["0o700", "0o600", "0o600"]
    private = (key_dir / "cluster_ed25519").read_bytes()
    # converged: both modules run and touch nothing
    _, status = run(key_dir)
    assert modes(key_dir) == ["0o700", "0o600", "0o600"]
    assert set(status.values()) == {"ok"}
    # a directory opened to others: controller_files closes it again
    key_dir.chmod(0o755)
    _, status = run(key_dir)
    assert status["Create the controller key directory"] == "changed"
    assert modes(key_dir)[0] == "0o700"
    # the public half left at another mode: the keypair module puts it back, the key kept
    (key_dir / "cluster_ed25519.pub").chmod(0o644)
    _, status = run(key_dir)
    assert status["Make the cluster key pair on the controller"] == "changed"
    assert modes(key_dir) == ["0o700", "0o600", "0o600"]
    assert (key_dir / "cluster_ed25519").read_bytes() == private
    _, status = run(key_dir)
    assert set(status.values()) == {"ok"}
    # the key pair gone (a new state directory's): made again
    for half in ("cluster_ed25519", "cluster_ed25519.pub"):
        (key_dir / half).unlink()
    _, status = run(key_dir)
    assert status["Make the cluster key pair on the controller"] == "changed"
    assert modes(key_dir) == ["0o700", "0o600", "0o600"]


def test_a_private_key_open_to_others_is_closed_not_regenerated(tmp_path):
    """ssh-keygen will not read a private key others can read, so the key pair module stopped
    on it ("protected with a passphrase or broken") and suggested a new key: the key is
    closed to its owner first, and kept."""
    key_dir = tmp_path / "state"
    _, status = run(key_dir, (*TASKS, CLOSE))
    assert status[CLOSE] == "skipping"  # no key yet: the module makes it at 0600
    private = (key_dir / "cluster_ed25519").read_bytes()
    (key_dir / "cluster_ed25519").chmod(0o644)
    _, status = run(key_dir, (*TASKS, CLOSE))
    assert status[CLOSE] == "changed"
    # the pair now stands: the key pair module keeps it
    assert status["Make the cluster key pair on the controller"] == "ok"
    assert modes(key_dir) == ["0o700", "0o600", "0o600"]
    assert (key_dir / "cluster_ed25519").read_bytes() == private
    _, status = run(key_dir, (*TASKS, CLOSE))
    assert set(status.values()) == {"ok"}

"""The one way tests reach files outside python/: what roles ship to nodes, and the repository.

Role-shipped Python (detectors, recorders, installers) is not part of the dscluster package:
it runs on nodes with the system python3. The tests import the very files the roles install.

    rolefiles.load("efa", "efa_fi_info.py")       -> module (also *.fact scripts)
    rolefiles.path("ml_stack", "files/wheelhouse_lock.py")
    rolefiles.REPO / "docker" / "training"
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types
from collections.abc import Iterator, Mapping

REPO = pathlib.Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"


def path(role: str, rel: str = "") -> pathlib.Path:
    """roles/<role>/<rel>, rel relative to the role ("files/x.py", "defaults/main.yml")."""
    return ROLES / role / rel if rel else ROLES / role


def load(role: str, filename: str) -> types.ModuleType:
    """Import roles/<role>/files/<filename> (a .py or a .fact script) as a module."""
    file = path(role, f"files/{filename}")
    name = f"dscluster_role_{role}_{file.name.replace('.', '_')}"
    loader = importlib.machinery.SourceFileLoader(name, str(file))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None, file
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def run_inline(role: str, filename: str, request: Mapping) -> dict:
    """Run roles/<role>/files/<filename> as the role does (`python3 -c <file> '<json request>'`,
    here with this interpreter) and return the JSON it prints."""
    out = subprocess.run(
        [sys.executable, "-c", path(role, f"files/{filename}").read_text(), json.dumps(request)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def run_local_play(
    playbook: pathlib.Path,
    extravars: Mapping,
    tag: str,
    *,
    env: Mapping[str, str] | None = None,
    inventory: pathlib.Path | None = None,
) -> tuple[int, dict | None, str]:
    """ansible-playbook on localhost (connection local, the repo's ansible.cfg, plain output):
    its rc, the JSON a task printed after `tag ` (None when none did), and the output.
    env: the environment to start from (default os.environ); inventory: an inventory file whose
    hosts all run locally (default localhost alone; `tagged` reads every host's JSON)."""
    full = dict(os.environ if env is None else env)
    full |= {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_NOCOLOR": "1",
    }
    ansible = pathlib.Path(sys.executable).parent / "ansible-playbook"
    hosts = str(inventory) if inventory is not None else "localhost,"
    argv = [str(ansible), "-i", hosts, "-c", "local", str(playbook)]
    proc = subprocess.run(
        [*argv, "-e", json.dumps(dict(extravars))],
        capture_output=True,
        text=True,
        env=full,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    return proc.returncode, next(tagged(out, tag), None), out


def tagged(out: str, tag: str) -> Iterator[dict]:
    """Each JSON a play's tasks printed after `tag ` (a debug msg), in the output's order,
    read as it is reached."""
    for line in out.splitlines():
        if f"{tag} " in line:
            yield json.loads(line.split(f"{tag} ", 1)[1].rstrip('"').replace('\\"', '"'))

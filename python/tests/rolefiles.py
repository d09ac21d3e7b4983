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
import pathlib
import types

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

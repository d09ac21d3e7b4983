"""The one way tests reach files outside python/: what roles ship to nodes, and the repository.

Role-shipped Python (detectors, recorders, installers) is not part of the dscluster package:
it runs on nodes with the system python3. The tests import the very files the roles install.

    rolefiles.load("efa", "efa_fi_info.py")       -> module (also *.fact scripts)
    rolefiles.load_plugin("pdsh_info")           -> plugins/modules/pdsh_info.py, with this
                                                    clone's plugins/module_utils
    rolefiles.path("ml_stack", "files/wheelhouse_lock.py")
    rolefiles.REPO / "docker" / "training"
"""

from __future__ import annotations

import base64
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
    """Import roles/<role>/files/<filename> (a .py or a .fact script) as a module; its imports
    of the role's other files resolve as when it runs as a script (its directory first)."""
    file = path(role, f"files/{filename}")
    sys.path.insert(0, str(file.parent))
    try:
        return _load_file(f"dscluster_role_{role}_{file.name.replace('.', '_')}", file)
    finally:
        sys.path.remove(str(file.parent))


def load_util(name: str) -> types.ModuleType:
    """Import plugins/module_utils/<name>.py (the collection's helpers shared by its modules)."""
    file = REPO / "plugins" / "module_utils" / f"{name}.py"
    return _load_file(f"dscluster_module_utils_{name}", file)


def load_script(name: str) -> types.ModuleType:
    """Import scripts/<name>.py (the make targets' helpers)."""
    return _load_file(f"dscluster_script_{name}", REPO / "scripts" / f"{name}.py")


def load_plugin(name: str) -> types.ModuleType:
    """Import plugins/modules/<name>.py as Ansible would run it from this clone: its
    `from ansible.module_utils import X` gets this clone's plugins/module_utils/X.py (as
    ansible.cfg's module_utils gives it), never an installed collection's."""
    file = REPO / "plugins" / "modules" / f"{name}.py"
    utils = sorted((REPO / "plugins" / "module_utils").glob("*.py"))
    names = [f"ansible.module_utils.{u.stem}" for u in utils]
    saved = {n: sys.modules[n] for n in names if n in sys.modules}
    try:
        # A helper that imports another (file_writes imports safe_fs) loads after it: each
        # pass loads what it can, until all are in.
        pending = dict(zip(names, utils, strict=True))
        while pending:
            loaded = []
            for n, u in pending.items():
                try:
                    sys.modules[n] = _load_file(n, u)
                except ImportError:
                    continue
                loaded.append(n)
            if not loaded:
                _load_file(*next(iter(pending.items())))  # raises the import error
            for n in loaded:
                del pending[n]
        return _load_file(f"dscluster_module_{name}", file)
    finally:
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def _load_file(name: str, file: pathlib.Path) -> types.ModuleType:
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


# Variables named ansible_* that are settings of the run, not facts a node reports.
NOT_FACTS = frozenset(
    {"ansible_python_interpreter", "ansible_connection", "ansible_host", "ansible_user"}
)


def as_gathered(extravars: Mapping) -> dict:
    """extravars with the node facts a test gives by the names setup returns them by
    (ansible_local, ansible_python, ansible_processor_nproc, ...) moved under `test_facts`,
    which the test playbooks' first task (action plugin recorded_facts) returns as the host's
    gathered facts. With inject_facts_as_vars off (ansible.cfg) roles read facts only under
    ansible_facts: an extra var named ansible_local would never reach them."""
    facts = {k: v for k, v in extravars.items() if k.startswith("ansible_") and k not in NOT_FACTS}
    rest = {k: v for k, v in extravars.items() if k not in facts}
    return rest | {"test_facts": facts}


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
    hosts all run locally (default localhost alone; `tagged` reads every host's JSON).
    extravars' `test_facts` (as_gathered) run it with the memory fact cache."""
    full = dict(os.environ if env is None else env)
    full |= {
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "default",
        "ANSIBLE_NOCOLOR": "1",
    }
    if "test_facts" in extravars:
        # the facts a test gives stay in its run, never in the user's fact cache
        full["ANSIBLE_CACHE_PLUGIN"] = "memory"
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


def run_module_play(
    playbook: pathlib.Path, extravars: Mapping, tag: str = "RESULT", **env: str
) -> tuple[int, dict | None, str]:
    """run_local_play with this clone's plugins/modules and module_utils (and any further
    ANSIBLE_* settings in env), the test's own Python as the interpreter."""
    full = {
        **os.environ,
        "ANSIBLE_LIBRARY": str(REPO / "plugins" / "modules"),
        "ANSIBLE_MODULE_UTILS": str(REPO / "plugins" / "module_utils"),
        **env,
    }
    more = {"ansible_python_interpreter": sys.executable, **extravars}
    return run_local_play(playbook, more, tag, env=full)


def run_info_modules(extravars: Mapping) -> tuple[int, dict, str]:
    """tests/unit/playbooks/node_info.yml on localhost: the collection's *_info modules (this
    clone's plugins/modules and module_utils) each run with the options extravars gives it
    (`ssh`, `pdsh`, `base`), once and again in check mode; the rc, every task's result by
    name (ssh, ssh_checked, pdsh, ...) and the output."""
    playbook = pathlib.Path(__file__).parent / "unit" / "playbooks" / "node_info.yml"
    rc, result, out = run_module_play(playbook, extravars)
    assert result is not None, out[-3000:]
    return rc, json.loads(base64.b64decode(result["b64"])), out


def info_state(key: str, request: Mapping) -> dict:
    """The `state` one *_info module returns for request (key: ssh, pdsh or base), checked:
    the run succeeded, changed nothing, and read the same in check mode."""
    rc, result, out = run_info_modules({key: request})
    assert rc == 0, out[-3000:]
    run, checked = result[key], result[f"{key}_checked"]
    assert run["failed"] is False and run["changed"] is False, run
    assert checked["changed"] is False and checked["state"] == run["state"], checked
    return run["state"]


def tagged(out: str, tag: str) -> Iterator[dict]:
    """Each JSON a play's tasks printed after `tag ` (a debug msg), in the output's order,
    read as it is reached."""
    for line in out.splitlines():
        if f"{tag} " in line:
            yield json.loads(line.split(f"{tag} ", 1)[1].rstrip('"').replace('\\"', '"'))

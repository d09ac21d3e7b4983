"""Facts only under `ansible_facts` (issue 74): every way the project runs Ansible turns fact
injection off (ansible.cfg, dscluster's runner, molecule's base config), so a fact a module
returns never shadows a role parameter or an inventory variable (SECURITY.md); and no role,
playbook, molecule playbook or plugin reads a fact as an injected top-level `ansible_*`
variable, which would then be undefined."""

from __future__ import annotations

import configparser
import pathlib
import re
import sys

import yaml

from .. import rolefiles

REPO = rolefiles.REPO
PLAYBOOKS = pathlib.Path(__file__).parent / "playbooks"

# ansible_* names that are not facts: settings, magic variables, and names of this project's
# own (ansible_host_value: a template's local variable). Any other is a fact's top-level name.
NOT_FACTS = re.compile(
    r"ansible_(facts|local|host|host_value|port|user|connection|python_interpreter|ssh_\w+"
    r"|become\w*|play_hosts(_all)?|play_batch|play_name|check_mode|diff_mode|failed_task"
    r"|failed_result|playbook_python|collections|parent_role_names|role_names?"
    r"|dependent_role_names|managed|job_id|run_tags|skip_tags|inventory_sources|inventory"
    r"|config_file|version|loop\w*|verbosity|forks|limit|search_path|runner)\b"
)
NAME = re.compile(r"\bansible_\w+")
# ansible_local is the one fact kept with its prefix under ansible_facts
# (ansible_facts.ansible_local): read bare, or from hostvars, it is the injected variable.
LOCAL = re.compile(
    r"(?<![\w.'\"])ansible_local\b|hostvars\[[^\]]*\]\s*(\.\s*|\[\s*['\"])ansible_local"
    r"|hostvars\s*,\s*['\"]ansible_local"
)
SCANNED = ("roles", "playbooks", "site.yml", "extensions/molecule", "plugins")
SUFFIXES = {".yml", ".yaml", ".j2", ".md", ".py", ".cfg"}


def _files():
    for name in SCANNED:
        top = REPO / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            skipped = {"__pycache__", ".molecule"} & set(path.parts)
            if path.is_file() and path.suffix in SUFFIXES and not skipped:
                yield path


def test_no_fact_is_read_as_an_injected_variable():
    found = []
    for path in _files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\bfilter:\s*ansible_", line):
                continue  # setup's filter names facts as setup returns them
            names = [n for n in NAME.findall(line) if not NOT_FACTS.fullmatch(n)]
            if names or LOCAL.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)


def test_every_way_ansible_runs_turns_injection_off(monkeypatch):
    from dscluster import runner  # noqa: PLC0415

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "ansible.cfg")
    assert cfg["defaults"]["inject_facts_as_vars"] == "False"
    monkeypatch.delenv("DSCLUSTER_MITOGEN", raising=False)
    assert runner.ansible_env()["ANSIBLE_INJECT_FACT_VARS"] == "False"
    molecule = yaml.safe_load((REPO / "extensions" / "molecule" / "config.yml").read_text())
    assert molecule["provisioner"]["config_options"]["defaults"]["inject_facts_as_vars"] is False


def test_a_returned_fact_shadows_no_variable(tmp_path: pathlib.Path):
    """Under the repository's ansible.cfg, facts a module returns are in ansible_facts only:
    an inventory variable of the same name keeps its value (an injected fact outranked it)."""
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    localhost:\n      ml_stack_venv: /opt/dscluster/venv\n"
    )
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - recorded_facts:\n"
        "        facts: {ml_stack_venv: /tmp/evil, ansible_kernel: '9.9'}\n"
        "    - ansible.builtin.debug:\n"
        "        msg: \"SEEN {{ {'venv': ml_stack_venv, 'fact': ansible_facts.ml_stack_venv,\n"
        "          'kernel': ansible_facts.kernel,\n"
        "          'top': ansible_kernel is defined} | to_json }}\"\n"
    )
    (tmp_path / "action_plugins").symlink_to(PLAYBOOKS / "action_plugins")
    rc, seen, out = rolefiles.run_local_play(
        tmp_path / "play.yml",
        {"ansible_python_interpreter": sys.executable, "test_facts": {}},
        "SEEN",
        inventory=tmp_path / "hosts.yml",
    )
    assert rc == 0, out[-3000:]
    assert seen == {
        "venv": "/opt/dscluster/venv",
        "fact": "/tmp/evil",
        "kernel": "9.9",
        "top": False,
    }

"""plugins/callback/facts_memo.py against the real ansible-core fact cache (jsonfile) and
clean_facts: every get and every clean gives what ansible-core gives without it, each caller its
own copy; a payload is decoded and cleaned once while the cache holds it, and afresh once the
facts change; a caller's changed copy is cleaned as it is. In a playbook, facts set in one task
are what the next task and the next play read. Each case runs in its own Python: install()
patches the process."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from tests import rolefiles

PLUGIN = rolefiles.REPO / "plugins" / "callback" / "facts_memo.py"

# Runs a fixed sequence of fact cache gets and cleans; prints what each returned and how many
# times ansible-core decoded a payload and cleaned facts. argv: plugin, memo (1/0).
PROBE = r"""
import importlib.util, json, sys
from ansible._internal._plugins import _cache
from ansible.plugins.loader import cache_loader
from ansible.vars import manager

counts = {"decode": 0, "clean": 0}
plain_decode, plain_clean = _cache.PluginInterposer._decode, manager.clean_facts
def decode(self, value):
    counts["decode"] += 1
    return plain_decode(self, value)
def clean(facts):
    counts["clean"] += 1
    return plain_clean(facts)
_cache.PluginInterposer._decode = decode
manager.clean_facts = clean

if sys.argv[2] == "1":
    spec = importlib.util.spec_from_file_location("facts_memo", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.install() is True

cache = cache_loader.get("jsonfile")
first = {
    "ansible_hostname": "n1",
    "ansible_local": {"node": {"slots": 1}},
    "ansible_nested": {"list": [1, 2]},
    "ansible_python_interpreter": "/usr/bin/python3",
    "ansible_ssh_host_key_rsa_public": "AAAA",
}
out = {}
cache.set("n1", first)
a, b = cache.get("n1"), cache.get("n1")
out["gets"] = json.loads(json.dumps([a, b]))  # as they were
out["distinct"] = a is not b and a["ansible_nested"] == b["ansible_nested"]
a["ansible_hostname"] = "changed"  # a caller's copy: the cache's facts stay
out["after_change"] = cache.get("n1")["ansible_hostname"]
c1, c2 = manager.clean_facts(cache.get("n1")), manager.clean_facts(cache.get("n1"))
out["cleaned"] = json.loads(json.dumps([c1, c2]))
out["deep"] = c1 is not c2 and c1["ansible_nested"]["list"] is not c2["ansible_nested"]["list"]
c1["ansible_nested"]["list"].append(3)  # a caller changes its copy: the next clean is as before
out["clean_again"] = manager.clean_facts(cache.get("n1"))
mine = cache.get("n1")
mine["ansible_extra"] = "x"  # a changed top level is cleaned as it is
out["changed_clean"] = manager.clean_facts(mine)
out["counts_before_set"] = dict(counts)
cache.set("n1", {**first, "ansible_hostname": "n1b"})
out["new"] = [cache.get("n1"), manager.clean_facts(cache.get("n1"))]
out["counts"] = counts
print(json.dumps(out))
"""


def probe(tmp_path: pathlib.Path, memo: str) -> dict:
    facts = tmp_path / f"facts-{memo}"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(PLUGIN), memo],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(facts),
             "ANSIBLE_CACHE_PLUGIN_TIMEOUT": "600"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_memo_gives_what_ansible_gives_and_decodes_and_cleans_once_per_payload(tmp_path):
    plain, memo = probe(tmp_path, "0"), probe(tmp_path, "1")
    counts = memo.pop("counts"), plain.pop("counts")
    before = memo.pop("counts_before_set"), plain.pop("counts_before_set")
    assert memo == plain  # every value as ansible-core gives it
    assert memo["gets"][0]["ansible_hostname"] == "n1" and memo["after_change"] == "n1"
    assert memo["distinct"] and memo["deep"]
    cleaned = memo["cleaned"][0]
    assert "ansible_python_interpreter" not in cleaned and cleaned["ansible_nested"] == {
        "list": [1, 2]
    }
    assert memo["clean_again"] == cleaned
    assert memo["changed_clean"]["ansible_extra"] == "x"
    assert memo["new"][0]["ansible_hostname"] == "n1b" == memo["new"][1]["ansible_hostname"]
    # without the memo: a decode per get (7 before the set), a clean per call (4)
    assert before[1] == {"decode": 7, "clean": 4}
    # with it: one decode of the payload; one clean of it plus the changed copy's
    assert before[0] == {"decode": 1, "clean": 2}
    assert counts[0] == {"decode": 2, "clean": 3}  # the new payload: decoded and cleaned once


PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Cache a fact
      ansible.builtin.set_fact:
        dsc_probe: 1
        cacheable: true
    - name: Read it
      ansible.builtin.assert:
        that: ansible_facts.dsc_probe == 1 and dsc_probe == 1
    - name: Change it
      ansible.builtin.set_fact:
        dsc_probe: 2
        cacheable: true
    - name: Read the new value
      ansible.builtin.assert:
        that: ansible_facts.dsc_probe == 2

- hosts: localhost
  gather_facts: false
  tasks:
    - name: The next play reads the cache's value
      ansible.builtin.assert:
        that: ansible_facts.dsc_probe == 2 and dsc_probe == 2
"""


def run_playbook(tmp_path: pathlib.Path, switch: str) -> subprocess.CompletedProcess:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(PLUGIN.parent),
        "ANSIBLE_CALLBACKS_ENABLED": "facts_memo",
        "ANSIBLE_CACHE_PLUGIN": "jsonfile",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
        "DSCLUSTER_FACTS_MEMO": switch,
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
    }
    bindir = pathlib.Path(sys.executable).parent
    return subprocess.run(
        [str(bindir / "ansible-playbook"), "-vvv", "-i", "localhost,", "-c", "local",
         str(tmp_path / "play.yml")],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip


def test_a_playbook_reads_each_new_value_of_a_cached_fact(tmp_path):
    proc = run_playbook(tmp_path, "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "facts_memo: decoded and cleaned facts kept per payload" in proc.stdout
    assert "ok=5" in proc.stdout


def test_dscluster_facts_memo_0_turns_it_off(tmp_path):
    proc = run_playbook(tmp_path, "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "facts_memo: decoded and cleaned facts kept" not in proc.stdout
    assert "ok=5" in proc.stdout


def test_a_bad_switch_in_a_plain_run_warns_and_leaves_it_off(tmp_path):
    proc = run_playbook(tmp_path, "on")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DSCLUSTER_FACTS_MEMO='on' is neither 1 nor 0; facts_memo is off" in (
        proc.stdout + proc.stderr
    )
    assert "facts_memo: decoded and cleaned facts kept" not in proc.stdout

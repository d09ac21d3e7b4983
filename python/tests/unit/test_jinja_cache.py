"""plugins/callback/jinja_cache.py against the real ansible-core template engine: templates,
conditionals and expressions render the same with the cache as without it, under every compile
setting that changes the code (escape_backslashes, overrides); a process started later with
the same directory (as a forked worker finds it) compiles nothing it can load; a broken entry
is compiled again; the callback removes its directory when the run ends, and does nothing with
DSCLUSTER_JINJA_CACHE=0. Each case runs in its own Python: install() patches the process."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from tests import rolefiles

PLUGIN = rolefiles.REPO / "plugins" / "callback" / "jinja_cache.py"

# Renders a fixed set of templates and reports the results and how many times Jinja generated
# code (a cache hit generates none). argv: cache dir ('' = no cache), rounds.
RENDER = r"""
import importlib.util, json, sys
import jinja2.environment
from ansible.template import Templar, trust_as_template

generated = []
plain = jinja2.environment.Environment._generate
def counting(self, *args, **kwargs):
    generated.append(1)
    return plain(self, *args, **kwargs)
jinja2.environment.Environment._generate = counting

cache_dir, rounds = sys.argv[2], int(sys.argv[3])
if cache_dir:
    spec = importlib.util.spec_from_file_location("jinja_cache", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.install(cache_dir) is True

T = trust_as_template
templar = Templar(variables={"a": 2, "b": [1, 2, 3], "name": "n1", "path": "C:\\tmp\\x"})
results = []
for _ in range(rounds):
    results.append([
        templar.template(T("{{ a + 1 }}")),
        templar.template(T("{{ b | map('string') | join(',') }} on {{ name }}")),
        templar.template(T("{{ 'x\\ny' }}"), escape_backslashes=True),
        templar.template(T("{{ 'x\\ny' }}"), escape_backslashes=False),
        templar.template(T("[% a %] {{ a }}"),
                         overrides=dict(variable_start_string="[%", variable_end_string="%]")),
        templar.template(T("[% a %] {{ a }}")),
        templar.template(T("{% if a > 1 %}big{% else %}small{% endif %}\n")),
        templar.template(T("{{ path }}")),
        templar.evaluate_conditional(T("a > 1 and b | length == 3")),
        templar.evaluate_conditional(T("a > 5")),
        templar.evaluate_expression(T("b | sum + a")),
        templar.evaluate_expression(T("name ~ '-' ~ a")),
    ])
print(json.dumps({"results": results, "generated": len(generated)}))
"""


def render(cache_dir: pathlib.Path | str, rounds: int = 1) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", RENDER, str(PLUGIN), str(cache_dir), str(rounds)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_cached_results_equal_uncached_and_a_later_process_compiles_nothing(tmp_path):
    plain = render("", rounds=2)
    assert plain["results"][0] == plain["results"][1]
    expected = plain["results"][0]
    # the settings that change the code give different results: the cache must keep them apart
    assert expected[2] != expected[3]
    assert expected[4] == "2 {{ a }}" and expected[5] == "[% a %] 2"
    first = render(tmp_path, rounds=2)
    assert first["results"] == [expected, expected]
    entries = [p for p in tmp_path.iterdir() if not p.name.startswith(".part-")]
    assert len(entries) == len(expected)  # one entry per distinct template and setting
    assert first["generated"] == plain["generated"] // 2  # the second round came from memory
    later = render(tmp_path)
    assert later["results"] == [expected]
    assert later["generated"] == 0  # all read from the directory: nothing parsed or generated


def test_a_broken_entry_is_compiled_again(tmp_path):
    expected = render(tmp_path)["results"]
    for entry in tmp_path.iterdir():
        entry.write_bytes(b"\x00not marshal")
    again = render(tmp_path)
    assert again["results"] == expected
    assert again["generated"] > 0


PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  vars:
    items_in: [1, 2, 3]
  tasks:
    - name: Render in forked workers
      ansible.builtin.set_fact:
        total: "{{ items_in | sum }}"
    - name: Check the conditional and the value
      ansible.builtin.assert:
        that: total | int == 6 and (items_in | length) == 3
"""


def run_playbook(tmp_path: pathlib.Path, switch: str) -> tuple[subprocess.CompletedProcess, list]:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
        "ANSIBLE_CALLBACK_PLUGINS": str(PLUGIN.parent),
        "ANSIBLE_CALLBACKS_ENABLED": "jinja_cache",
        "DSCLUSTER_JINJA_CACHE": switch,
        "TMPDIR": str(tmpdir),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
    }
    bindir = pathlib.Path(sys.executable).parent
    proc = subprocess.run(
        [str(bindir / "ansible-playbook"), "-vvv", "-i", "localhost,", "-c", "local",
         str(tmp_path / "play.yml")],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    return proc, sorted(p.name for p in tmpdir.iterdir() if p.name.startswith("dscluster-jinja-"))


def test_the_callback_shares_a_directory_for_the_run_and_removes_it(tmp_path):
    proc, left = run_playbook(tmp_path, "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jinja_cache: compiled templates shared in " in proc.stdout
    assert "ok=2" in proc.stdout
    assert left == []  # removed when the run ended


def test_a_run_removes_the_directories_of_runs_that_are_gone(tmp_path):
    tmpdir = tmp_path / "tmp"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead, alive = int(gone.stdout), os.getpid()
    kept = [f"dscluster-jinja-{alive}-abc", "dscluster-jinja-nopid", "other-7-x"]
    for name in [f"dscluster-jinja-{dead}-abc", *kept]:
        (tmpdir / name).mkdir(parents=True)
        (tmpdir / name / "entry").write_bytes(b"code")
    proc, _ = run_playbook(tmp_path, "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"jinja_cache: removed dscluster-jinja-{dead}-abc, left by a run that is gone" in (
        proc.stdout
    )
    assert sorted(p.name for p in tmpdir.iterdir()) == sorted(kept)  # its own removed at exit
    assert (tmpdir / kept[0] / "entry").read_bytes() == b"code"


def test_dscluster_jinja_cache_0_turns_it_off(tmp_path):
    proc, left = run_playbook(tmp_path, "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "jinja_cache: compiled templates shared" not in proc.stdout
    assert "ok=2" in proc.stdout
    assert left == []


def test_a_bad_switch_in_a_plain_run_warns_and_leaves_it_off(tmp_path):
    proc, left = run_playbook(tmp_path, "yes")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "DSCLUSTER_JINJA_CACHE='yes' is neither 1 nor 0; jinja_cache is off" in (
        proc.stdout + proc.stderr
    )
    assert "jinja_cache: compiled templates shared" not in proc.stdout
    assert left == []

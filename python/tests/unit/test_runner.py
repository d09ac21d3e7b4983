from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from dscluster.errors import DsclusterError
from dscluster.runner import HostSummary, PlaybookResult, Progress, raise_for_failures


def ev(kind: str, **data) -> dict:
    return {"event": kind, "event_data": data}


def test_progress_counts_and_failures():
    p = Progress("site.yml", ["a", "b"])
    p.handle(ev("playbook_on_play_start", play="Base"))
    p.handle(ev("playbook_on_task_start", task="Install packages"))
    p.handle(ev("runner_on_ok", host="a", task="Install packages", res={"changed": True}))
    p.handle(ev("runner_on_ok", host="b", task="Install packages", res={"changed": False}))
    p.handle(ev("runner_on_failed", host="b", task="Check /dev/shm", res={"msg": "too\nsmall"}))
    p.handle(ev("runner_on_failed", host="a", task="Probe", res={"msg": "x"}, ignore_errors=True))
    p.handle(ev("runner_on_unreachable", host="a", task="Gather", res={"msg": "ssh: no route"}))
    assert p.play == "Base" and p.tasks_done == 1
    assert (p.hosts["a"].ok, p.hosts["a"].changed, p.hosts["a"].unreachable) == (1, 1, 1)
    assert (p.hosts["b"].ok, p.hosts["b"].changed, p.hosts["b"].failed) == (1, 0, 1)
    assert p.failures == [("b", "Check /dev/shm", "too small"), ("a", "Gather", "ssh: no route")]
    assert p.handle(ev("playbook_on_stats", ok={"a": 3})) is False
    assert p.stats == {"ok": {"a": 3}}
    assert "Base" in str(p.render().title)


def test_raise_for_failures_names_hosts_and_task():
    result = PlaybookResult(
        status="failed",
        rc=2,
        hosts={"a": HostSummary(ok=3), "b": HostSummary(failed=1), "c": HostSummary(unreachable=1)},
        failures=[("b", "Check /dev/shm", "64 MB < 512 MB"), ("c", "Gather", "no route")],
    )
    assert result.failed_hosts == ["b", "c"]
    with pytest.raises(DsclusterError) as info:
        raise_for_failures(result, "provisioning")
    msg = str(info.value)
    assert msg.startswith("provisioning failed on b, c: task 'Check /dev/shm' on b")
    assert "(+1 more)" in msg


def test_raise_for_failures_quiet_on_success():
    ok = PlaybookResult(status="successful", rc=0, hosts={"a": HostSummary(ok=1)}, failures=[])
    raise_for_failures(ok, "provisioning")


def test_profile_sums_each_task_across_hosts_and_ranks_the_costliest():
    p = Progress("site.yml", ["a", "b"])
    p.handle(ev("playbook_on_play_start", play="Base"))
    for host, task, seconds in (
        ("a", "Install packages", 2.5),
        ("b", "Install packages", 3.0),
        ("a", "Probe", 0.25),
        ("b", "Probe", 0.5),
        ("a", "Probe", 0.25),  # a loop or a second include of the same task adds up
        ("b", "Skipped one", 0.1),
    ):
        kind = "runner_on_skipped" if task == "Skipped one" else "runner_on_ok"
        p.handle(ev(kind, host=host, task=task, play="Base", duration=seconds, res={}))
    p.handle(ev("runner_on_ok", host="a", task="No timing", res={}))  # no duration: not counted
    prof = p.profile(top=2)
    assert prof["tasks"] == 3 and prof["results"] == 5
    assert [r["task"] for r in prof["top"]] == ["Install packages", "Probe"]
    assert prof["top"][0] == {
        "play": "Base", "task": "Install packages", "total_s": 5.5, "hosts": 2, "max_s": 3.0,
    }  # fmt: skip
    assert prof["top"][1]["total_s"] == 1.0 and prof["top"][1]["max_s"] == 0.5
    assert prof["task_seconds_per_host"] == {"a": 3.0, "b": 3.6}
    assert prof["play_seconds_max_host"] == {"Base": 3.6}


def test_mitogen_is_an_option_read_from_the_environment(monkeypatch):
    import importlib.util  # noqa: PLC0415

    from dscluster import runner  # noqa: PLC0415

    monkeypatch.delenv("DSCLUSTER_MITOGEN", raising=False)
    assert runner.mitogen_strategy_dir() is None
    assert "ANSIBLE_STRATEGY" not in runner.ansible_env()
    monkeypatch.setenv("DSCLUSTER_MITOGEN", "0")
    assert runner.mitogen_strategy_dir() is None
    monkeypatch.setenv("DSCLUSTER_MITOGEN", "1")
    if importlib.util.find_spec("ansible_mitogen") is not None:  # the dev venv has it
        env = runner.ansible_env()
        assert env["ANSIBLE_STRATEGY"] == "mitogen_linear"
        assert (pathlib.Path(env["ANSIBLE_STRATEGY_PLUGINS"]) / "mitogen_linear.py").is_file()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DsclusterError, match=r"pip install 'dscluster\[mitogen\]'"):
        runner.ansible_env()
    monkeypatch.setenv("DSCLUSTER_MITOGEN", "yes")
    with pytest.raises(DsclusterError, match="DSCLUSTER_MITOGEN='yes' is neither 1 nor 0"):
        runner.mitogen_strategy_dir()


def test_ansible_cfg_enables_no_callback_of_the_collection():
    """ansible.cfg's callbacks_enabled is the runner's base list, with no private-API patch."""
    import configparser  # noqa: PLC0415

    from dscluster import paths, runner  # noqa: PLC0415

    cfg = configparser.ConfigParser()
    cfg.read(paths.collection_root() / "ansible.cfg")
    enabled = [c.strip() for c in cfg["defaults"]["callbacks_enabled"].split(",")]
    assert enabled == runner.CALLBACKS_ENABLED.split(",")
    plugins = {p.stem for p in (paths.collection_root() / "plugins" / "callback").glob("*.py")}
    assert plugins >= {"jinja_cache", "facts_memo"} and not plugins & set(enabled)


@pytest.mark.parametrize(
    ("name", "plugin", "bad"),
    [
        ("DSCLUSTER_JINJA_CACHE", "jinja_cache.py", "false"),
        ("DSCLUSTER_FACTS_MEMO", "facts_memo.py", "no"),
    ],
)
def test_a_callback_switch_is_off_unless_1_and_a_bad_value_is_refused(
    monkeypatch, name: str, plugin: str, bad: str
):
    """The private-API callbacks are opt-in: unset or 0, none is enabled (ansible.cfg enables
    none); 1 enables that one on top of ansible.cfg's own list."""
    from dscluster import runner  # noqa: PLC0415

    for other in runner.CALLBACK_SWITCHES:
        monkeypatch.delenv(other, raising=False)
    assert runner.callback_switches()[name] == "0"
    env = runner.ansible_env()
    assert env[name] == "0" and "ANSIBLE_CALLBACKS_ENABLED" not in env
    monkeypatch.setenv(name, "1")
    assert runner.callback_switches()[name] == "1"
    env = runner.ansible_env()
    assert env[name] == "1"
    assert env["ANSIBLE_CALLBACKS_ENABLED"] == (
        f"ansible.posix.profile_tasks,{plugin.removesuffix('.py')}"
    )
    assert (pathlib.Path(env["ANSIBLE_CALLBACK_PLUGINS"]) / plugin).is_file()
    monkeypatch.setenv(name, bad)
    with pytest.raises(DsclusterError, match=f"{name}='{bad}' is neither 1 nor 0"):
        runner.ansible_env()


def run_local(tmp_path: pathlib.Path, play: pathlib.Path, hosts: list[str], extravars: dict):
    """A real ansible-runner run of `play` on local-connection hosts; (result, progress)."""
    import ansible_runner  # noqa: PLC0415 - slow import

    inventory = tmp_path / "hosts"
    python = f"ansible_python_interpreter={sys.executable}"
    inventory.write_text("".join(f"{h} ansible_connection=local {python}\n" for h in hosts))
    progress = Progress(play.name, hosts)
    (tmp_path / "private").mkdir()
    result = ansible_runner.run(
        private_data_dir=str(tmp_path / "private"),
        playbook=str(play),
        envvars={"PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"},
        inventory=str(inventory),
        extravars=extravars,
        quiet=True,
        event_handler=progress.handle,
    )
    return result, progress


def test_a_failed_loop_names_its_first_failed_item_and_why(tmp_path: pathlib.Path):
    """A real loop that fails (a copy of a file that is not there): Ansible's own message is
    only 'One or more items failed'; the failure kept names the item and the module's
    message."""
    (tmp_path / "here.txt").write_text("x")
    (tmp_path / "out").mkdir()
    play = tmp_path / "loop.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - name: Copy the job's files\n"
        "      ansible.builtin.copy:\n"
        "        src: '{{ stage }}/{{ item.name }}'\n"
        "        dest: '{{ dest }}/{{ item.name }}'\n"
        "      loop: [{name: here.txt}, {name: gone.txt}]\n"
        "      loop_control:\n        label: '{{ item.name }}'\n"
    )
    extravars = {"stage": str(tmp_path), "dest": str(tmp_path / "out")}
    result, progress = run_local(tmp_path, play, ["localhost"], extravars)
    assert result.rc != 0
    [(host, task, message)] = progress.failures
    assert (host, task) == ("localhost", "Copy the job's files")
    assert message.startswith("One or more items failed; first: gone.txt: "), message
    assert "gone.txt" in message.split("first: gone.txt: ", 1)[1], message
    assert (tmp_path / "out" / "here.txt").read_text() == "x"


def stats_play(value: str) -> str:
    """A play where b fails and every host then hands {host: value} over with set_stats."""
    return (
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - block:\n"
        "        - name: Fail on b\n"
        "          ansible.builtin.fail:\n            msg: no\n"
        "          when: inventory_hostname == 'b'\n"
        "      always:\n"
        "        - name: Hand over\n"
        "          ansible.builtin.set_stats:\n"
        "            data:\n"
        f'              found: "{{{{ {{inventory_hostname: {value}}} }}}}"\n'
        "            per_host: false\n"
        "            aggregate: true\n"
    )


def test_custom_stats_from_every_host_reach_the_controller_as_artifacts(tmp_path: pathlib.Path):
    """A real run: each host hands a dict over with set_stats (aggregate, not per host), a
    failed host in an always section too; the run's artifacts hold every host's entry."""
    play = tmp_path / "stats.yml"
    play.write_text(stats_play("{'n': inventory_hostname | length, 'tag': tag}"))
    result, progress = run_local(tmp_path, play, ["a", "b", "cc"], {"tag": "x"})
    assert result.rc != 0  # b failed
    assert progress.artifacts == {
        "found": {"a": {"n": 1, "tag": "x"}, "b": {"n": 1, "tag": "x"}, "cc": {"n": 2, "tag": "x"}}
    }
    assert Progress("x.yml", []).artifacts == {}  # no stats event: nothing, not an error


def test_events_whose_stdout_was_lost_are_recovered_from_runners_partial_files(
    tmp_path: pathlib.Path,
):
    """ansible-runner learns of each event from a marker in the child's stdout, read through a
    pty that can lose the last output before the child exits (then the stats, and the
    findings handed over in them, never came). Here a real ansible-playbook with runner's own
    callback writes its events and nobody reads its stdout at all: every event is left as a
    partial file, and recover_lost_events hands them over in order, stats included."""
    from ansible_runner.utils import get_callback_dir  # noqa: PLC0415

    from dscluster.runner import recover_lost_events  # noqa: PLC0415

    play = tmp_path / "stats.yml"
    play.write_text(stats_play("inventory_hostname | length"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n"
        + "".join(f"    {h}: {{ansible_connection: local}}\n" for h in ("a", "b", "cc"))
    )
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    env = {
        **os.environ,
        "ANSIBLE_STDOUT_CALLBACK": "awx_display",
        "ANSIBLE_CALLBACK_PLUGINS": get_callback_dir(),
        "AWX_ISOLATED_DATA_DIR": str(artifacts),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }
    bindir = pathlib.Path(sys.executable).parent
    done = subprocess.run(
        [str(bindir / "ansible-playbook"), "-i", str(inventory), str(play)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr  # b failed
    progress = Progress(play.name, ["a", "b", "cc"])
    assert recover_lost_events(progress, artifacts / "job_events") > 5
    assert progress.artifacts == {"found": {"a": 1, "b": 1, "cc": 2}}
    assert [(h, t) for h, t, _ in progress.failures] == [("b", "Fail on b")]
    assert progress.task == "Hand over"  # the events came in the order they were made
    assert {h: (s.ok, s.failed) for h, s in progress.hosts.items()} == {
        "a": (1, 0), "b": (1, 1), "cc": (1, 0)
    }  # fmt: skip
    # Nothing there, nothing done (a run whose stdout all arrived leaves no partial file).
    assert recover_lost_events(Progress("x.yml", []), tmp_path / "nowhere") == 0


def test_a_run_that_lost_nothing_leaves_nothing_to_recover(tmp_path: pathlib.Path):
    from dscluster.runner import recover_lost_events  # noqa: PLC0415

    play = tmp_path / "stats.yml"
    play.write_text(stats_play("inventory_hostname | length"))
    result, progress = run_local(tmp_path, play, ["a", "b", "cc"], {})
    assert progress.artifacts == {"found": {"a": 1, "b": 1, "cc": 2}}
    events = pathlib.Path(result.config.artifact_dir) / "job_events"
    assert recover_lost_events(progress, events) == 0
    assert progress.artifacts == {"found": {"a": 1, "b": 1, "cc": 2}}


def test_the_collection_modules_are_on_the_module_path(monkeypatch):
    """The roles call the collection's own modules by short name (cluster_ssh_files): a
    playbook run by the client finds them first, then a user's own ANSIBLE_LIBRARY."""
    from dscluster import runner  # noqa: PLC0415

    monkeypatch.setenv("ANSIBLE_LIBRARY", "/opt/mine")
    first, mine = runner.ansible_env()["ANSIBLE_LIBRARY"].split(os.pathsep)
    assert (pathlib.Path(first) / "cluster_ssh_files.py").is_file()
    assert mine == "/opt/mine"


def test_the_collection_actions_are_on_the_action_path(monkeypatch):
    """And its actions (controller_files) likewise, before a user's ANSIBLE_ACTION_PLUGINS;
    without one set, the collection's alone."""
    from dscluster import runner  # noqa: PLC0415

    monkeypatch.setenv("ANSIBLE_ACTION_PLUGINS", "/opt/mine")
    first, mine = runner.ansible_env()["ANSIBLE_ACTION_PLUGINS"].split(os.pathsep)
    assert (pathlib.Path(first) / "controller_files.py").is_file()
    assert mine == "/opt/mine"
    monkeypatch.delenv("ANSIBLE_ACTION_PLUGINS")
    assert runner.ansible_env()["ANSIBLE_ACTION_PLUGINS"] == first


def test_signals_kept_puts_back_the_handlers_ansible_runner_replaces():
    """ansible-runner's run() sets SIGINT/SIGTERM handlers and leaves them: Ctrl-C would then
    do nothing for the rest of the command (launch's live output could not be left)."""
    import signal  # noqa: PLC0415

    from dscluster.runner import signals_kept  # noqa: PLC0415

    outer = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Python's own (an earlier test's ansible-runner may have left its handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with signals_kept():
            signal.signal(signal.SIGINT, lambda *a: None)
            signal.signal(signal.SIGTERM, lambda *a: None)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        for sig, handler in outer.items():
            signal.signal(sig, handler)

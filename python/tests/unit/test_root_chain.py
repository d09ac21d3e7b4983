"""A path root runs from or writes through is root's up to / (SECURITY.md, issue 74):
plugins/module_utils/safe_fs.py's root_chain on real directories (a component of another
user's, one others may write, a link to either, a file of another user's), the doctor probe's
copy of it held to the same verdicts, and cluster_dirs' root_paths refusing before it makes
anything, in check mode too."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from .. import rolefiles

safe_fs = rolefiles.load_util("safe_fs")
probe = rolefiles.load("doctor", "doctor_probe.py")
PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "cluster_dirs_root_paths.yml"
USER = 1000  # the training user's uid on a stock cloud image

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to another user")


def tree(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """Root's directories with a venv in each, and what the training user could plant."""
    opt = tmp_path / "opt"
    venv = opt / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    home = tmp_path / "home"
    (home / "venv" / "bin").mkdir(parents=True)
    os.chown(home, USER, USER)
    script = opt / "record.py"
    script.write_text("")
    return {"opt": opt, "venv": venv, "home": home, "script": script}


def verdict(path: pathlib.Path | str) -> str:
    """'' where root_chain accepts the path, else its message; the probe must agree."""
    try:
        safe_fs.root_chain(str(path))
        message = ""
    except safe_fs.UnsafePath as exc:
        message = str(exc)
    assert bool(probe.root_chain(str(path))) == bool(message), (path, message)
    return message


def test_a_root_venv_and_what_it_links_to_are_accepted(tmp_path):
    t = tree(tmp_path)
    for path in (t["venv"], t["venv"] / "bin", t["venv"] / "bin" / "python", t["script"]):
        assert verdict(path) == ""
    # a missing tail below root's directories: root makes it later
    assert verdict(t["venv"] / "not" / "made") == ""
    # a sticky directory others write to (as /tmp) is a parent root may pass through
    sticky = tmp_path / "sticky"
    (sticky / "venv").mkdir(parents=True)
    sticky.chmod(0o1777)
    assert verdict(sticky / "venv") == ""
    # merged-usr's /bin -> usr/bin: a link root made, to root's directory
    link = t["opt"] / "bin"
    link.symlink_to("venv/bin")
    assert verdict(link / "python") == ""


def test_a_component_of_the_training_users_is_refused_naming_it_and_the_fix(tmp_path):
    t = tree(tmp_path)
    bad = t["home"] / "venv" / "bin"
    message = verdict(bad)
    assert message.startswith(f"{bad}: {t['home']} belongs to cloudsdk;"), message
    assert "chown root:root" in message and "\n" not in message
    # the venv itself the user's, under root's directories
    os.chown(t["venv"], USER, USER)
    assert f"{t['venv']} belongs to cloudsdk" in verdict(t["venv"] / "bin" / "python")
    # a missing tail below the user's directory: the user could make it first
    assert "belongs to cloudsdk" in verdict(t["home"] / "new" / "venv")


@pytest.mark.parametrize(("mode", "group"), [(0o777, 0), (0o775, USER), (0o757, 0)])
def test_a_directory_others_may_write_is_refused(tmp_path, mode, group):
    t = tree(tmp_path)
    os.chown(t["opt"], 0, group)
    t["opt"].chmod(mode)
    message = verdict(t["venv"] / "bin")
    assert f"{t['opt']} is writable by others (mode {mode:04o}" in message, message


def test_group_write_of_roots_own_group_is_roots(tmp_path):
    t = tree(tmp_path)
    t["opt"].chmod(0o775)  # group root
    assert verdict(t["venv"]) == ""


def test_a_link_is_followed_and_where_it_leads_checked(tmp_path):
    t = tree(tmp_path)
    target = t["home"] / "venv" / "bin" / "python"
    target.write_text("")
    (t["venv"] / "bin" / "python").unlink()
    (t["venv"] / "bin" / "python").symlink_to(target)
    message = verdict(t["venv"] / "bin" / "python")
    assert f"(through {t['venv']}/bin/python -> {target})" in message, message
    assert f"{t['home']} belongs to cloudsdk" in message
    # a link above the venv to the user's directory, relative
    (t["opt"] / "v2").symlink_to("../home/venv")
    assert f"{t['home']} belongs to cloudsdk" in verdict(t["opt"] / "v2" / "bin")
    # a loop of links
    (t["opt"] / "a").symlink_to("b")
    (t["opt"] / "b").symlink_to("a")
    assert "links on the way" in verdict(t["opt"] / "a" / "python")


def test_a_file_of_another_user_or_that_others_may_write_is_refused(tmp_path):
    t = tree(tmp_path)
    t["script"].chmod(0o666)
    assert f"{t['script']} is writable by others (mode 0666" in verdict(t["script"])
    t["script"].chmod(0o755)
    # a file where a directory is expected
    assert (
        verdict(t["script"] / "bin") == f"{t['script'] / 'bin'}: {t['script']} is not a directory"
    )
    os.chown(t["script"], USER, USER)
    assert f"{t['script']} belongs to cloudsdk" in verdict(t["script"])


def test_a_path_given_otherwise_than_plainly_is_refused(tmp_path):
    assert "not an absolute path" in verdict("opt/venv")
    assert verdict(f"{tmp_path}/../x")


def test_cluster_dirs_checks_root_paths_before_it_makes_anything(tmp_path):
    """The ml_stack role's case: a venv under the training user's home refuses the task in one
    line naming it, nothing made, in check mode the same; root's own venv passes."""
    t = tree(tmp_path)
    made = tmp_path / "made" / "pycache"
    cases = [
        {"root_paths": [str(t["home"] / "venv"), ""], "dirs": [{"path": str(made)}]},
        {"root_paths": [str(t["venv"]), str(t["venv"] / "bin" / "python"), ""], "dirs": []},
    ]
    rc, result, out = rolefiles.run_module_play(PLAYBOOK, {"cases": cases})
    assert rc == 0 and result is not None, out[-3000:]
    for key in ("run", "checked"):
        refused, accepted = result[key]
        assert refused["msg"].startswith(f"cluster_dirs: {t['home'] / 'venv'}: "), refused
        assert re.search(f"{t['home']} belongs to cloudsdk; .*chown root:root", refused["msg"])
        assert refused["made"] == [] and not refused.get("changed")
        assert "msg" not in accepted and accepted["changed"] is False, accepted
    assert not made.parent.exists()

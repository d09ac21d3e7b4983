"""The collection's one-run writer of directories and whole files
(plugins/modules/node_files.py, what nccl_env writes with) run by Ansible on localhost:
missing parents made, each file written only where it differs, idempotent, check mode and
diff writing nothing, and a link where a file is expected refused in one line. The same for
its controller side, the controller_files action (plugins/action), which writes in the
task's worker with no module run."""

from __future__ import annotations

import pathlib
import stat

import pytest

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "node_files.yml"
WRITERS = ["node_files", "controller_files"]


def run(
    tmp_path: pathlib.Path, writer: str = "node_files", **env: str
) -> tuple[int, dict | None, str]:
    """node_files.yml with its tasks calling `writer` (the playbook lies beside tmp_path)."""
    playbook = tmp_path.parent / f"{tmp_path.name}-{writer}.yml"
    playbook.write_text(PLAYBOOK.read_text().replace("node_files:", f"{writer}:"))
    return rolefiles.run_module_play(playbook, {"dir": str(tmp_path)}, **env)


def mode(path: pathlib.Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


@pytest.mark.parametrize("writer", WRITERS)
def test_writes_what_differs_once_and_check_mode_writes_nothing(tmp_path, writer):
    (tmp_path / "nccl.conf").write_text("NCCL_DEBUG=WARN\n")  # as wanted
    (tmp_path / "nccl.conf").chmod(0o666)  # but open to everyone

    rc, result, out = run(tmp_path, writer)
    assert rc == 0 and result is not None, out[-3000:]
    first = result["first"]
    assert first["changed"] is True
    assert first["written"] == [
        str(tmp_path / "opt"),
        str(tmp_path / "opt" / "bin"),
        str(tmp_path / "facts.d"),
        str(tmp_path / "opt" / "bin" / "helper.py"),
        str(tmp_path / "facts.d" / "nccl_env.fact"),
    ]  # nccl.conf only needed its mode
    assert (tmp_path / "opt" / "bin" / "helper.py").read_text() == "print('hi')\n"
    assert [mode(tmp_path / p) for p in ("opt", "opt/bin", "opt/bin/helper.py", "nccl.conf")] == [
        "0o755",
        "0o755",
        "0o755",
        "0o644",
    ]

    second = result["second"]
    assert second["changed"] is False and second["written"] == [], second

    checked = result["checked"]
    assert checked["changed"] is True and checked["written"] == [str(tmp_path / "nccl.conf")]
    assert checked["diff"][0]["before"].startswith("NCCL_DEBUG=WARN")
    assert checked["diff"][0]["after"].startswith("NCCL_DEBUG=INFO")
    assert (tmp_path / "nccl.conf").read_text() == "NCCL_DEBUG=WARN\n"

    missing = result["missing"]
    assert missing["changed"] is True and not (tmp_path / "new").exists()
    assert missing["written"] == [
        str(tmp_path / "new"),
        str(tmp_path / "new" / "bin"),
        str(tmp_path / "new" / "bin" / "sub"),  # below a directory check mode would make
        str(tmp_path / "new" / "bin" / "helper.py"),
    ], missing


@pytest.mark.parametrize("writer", WRITERS)
def test_a_link_where_a_file_goes_is_refused_and_its_target_left_alone(tmp_path, writer):
    target = tmp_path / "elsewhere"
    target.write_text("root's\n")
    (tmp_path / "facts.d").mkdir(mode=0o755)
    (tmp_path / "nccl.conf").symlink_to(target)
    rc, _result, out = run(tmp_path, writer)
    assert rc != 0
    assert f"{writer}: {tmp_path / 'nccl.conf'} is a symbolic link" in out, out[-3000:]
    assert target.read_text() == "root's\n"


def test_controller_files_without_its_action_fails_in_one_line(tmp_path):
    """Where a configuration finds the documentation module but not the action, the module
    says so and writes nothing (it would run on the target, not the controller)."""
    empty = tmp_path / "no-actions"
    empty.mkdir()
    rc, _result, out = run(tmp_path, "controller_files", ANSIBLE_ACTION_PLUGINS=str(empty))
    assert rc != 0
    assert "controller_files runs on the controller through its action plugin" in out, out[-3000:]
    assert not (tmp_path / "opt").exists()


ABSENT_PLAY = """
- name: Remove with controller_files
  hosts: localhost
  gather_facts: false
  tasks:
    - name: In check mode
      controller_files:
        absent: ["{{ dir }}/transfer", "{{ dir }}/link", "{{ dir }}/gone"]
      check_mode: true
      register: __checked
    - name: For real
      controller_files:
        absent: ["{{ dir }}/transfer", "{{ dir }}/link", "{{ dir }}/gone"]
      register: __removed
    - name: Again
      controller_files:
        absent: ["{{ dir }}/transfer", "{{ dir }}/link"]
      register: __again
    - name: Print the results
      ansible.builtin.debug:
        msg: "RESULT {{ {'checked': __checked, 'removed': __removed, 'again': __again} | to_json }}"
"""


def test_controller_files_removes_links_and_trees_without_following_a_link(tmp_path):
    """`absent`: the transfer directory of ml_stack's wheel copy and the like. A directory
    goes with all below it, a link inside it or in its place goes itself and what it names
    stays; check mode removes nothing; a path already gone is no change."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "transfer" / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep.txt").write_text("kept\n")
    (work / "transfer" / "sub" / "a.tar").write_text("x")
    (work / "transfer" / "to-outside").symlink_to(outside)
    (work / "link").symlink_to(outside / "keep.txt")
    playbook = tmp_path / "absent.yml"
    playbook.write_text(ABSENT_PLAY)
    rc, result, out = rolefiles.run_module_play(playbook, {"dir": str(work)})
    assert rc == 0 and result is not None, out[-3000:]
    two = [str(work / "transfer"), str(work / "link")]
    assert result["checked"]["changed"] is True and result["checked"]["removed"] == two
    assert result["removed"]["changed"] is True and result["removed"]["removed"] == two
    assert result["again"]["changed"] is False and result["again"]["removed"] == []
    assert sorted(p.name for p in work.iterdir()) == []
    assert (outside / "keep.txt").read_text() == "kept\n"


def test_controller_files_refuses_a_relative_path_to_remove(tmp_path):
    playbook = tmp_path / "absent.yml"
    playbook.write_text(ABSENT_PLAY.replace('"{{ dir }}/transfer"', '"transfer"'))
    (tmp_path / "transfer").mkdir()
    rc, _result, out = rolefiles.run_module_play(playbook, {"dir": str(tmp_path)})
    assert rc != 0
    assert "controller_files: transfer is not an absolute path" in out, out[-3000:]
    assert (tmp_path / "transfer").is_dir()


def test_controller_files_writes_a_mapping_content_as_json(tmp_path):
    """What copy's content did with a mapping: ansible-core before 2.19 hands a templated
    to_nice_json string over as one."""
    playbook = tmp_path / "mapping.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - controller_files:\n"
        "        files:\n"
        "          - {path: '{{ dir }}/r.json', content: {b: [1], a: x}, mode: '0600'}\n"
    )
    rc, _result, out = rolefiles.run_module_play(playbook, {"dir": str(tmp_path)})
    assert rc == 0, out[-3000:]
    written = (tmp_path / "r.json").read_text()
    assert written == '{\n    "a": "x",\n    "b": [\n        1\n    ]\n}\n'
    assert oct((tmp_path / "r.json").stat().st_mode & 0o777) == "0o600"


def test_controller_files_refuses_to_remove_through_a_link(tmp_path):
    """`absent` reaches the path's directory as the writes do: a link above it is refused,
    and what lies behind the link stays."""
    outside = tmp_path / "outside"
    (outside / "transfer").mkdir(parents=True)
    (tmp_path / "via").symlink_to(outside)
    playbook = tmp_path / "absent.yml"
    playbook.write_text(ABSENT_PLAY.replace('"{{ dir }}/transfer"', '"{{ dir }}/via/transfer"'))
    rc, _result, out = rolefiles.run_module_play(playbook, {"dir": str(tmp_path)})
    assert rc != 0
    assert f"controller_files: {tmp_path / 'via'}" in out, out[-3000:]
    assert (outside / "transfer").is_dir()

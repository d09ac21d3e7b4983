"""roles/deepspeed_launcher/files/write_facts.py, run as export.yml runs it on the controller:
one process writes the recorded facts of every host whose file differs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .. import rolefiles

WRITE = rolefiles.path("deepspeed_launcher", "files/write_facts.py")


def write(entries: list[dict[str, str]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(WRITE)],
        input=json.dumps(entries),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_new_and_differing_files_are_written_and_equal_ones_left(tmp_path):
    facts = tmp_path / "inventory" / "facts"  # its directory made on the way
    proc = write(
        [{"path": str(facts / f"n{i}.json"), "content": f'{{"host": "n{i}"}}\n'} for i in (1, 2)]
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [str(facts / "n1.json"), str(facts / "n2.json")]
    assert (facts / "n1.json").read_text() == '{"host": "n1"}\n'
    assert oct(facts.stat().st_mode & 0o777) == "0o755"
    for name in ("n1.json", "n2.json"):
        assert oct((facts / name).stat().st_mode & 0o777) == "0o644"
    os.utime(facts / "n1.json", (1, 1))
    proc = write(
        [
            {"path": str(facts / "n1.json"), "content": '{"host": "n1"}\n'},
            {"path": str(facts / "n2.json"), "content": '{"host": "n2", "address": "10.0.0.2"}\n'},
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [str(facts / "n2.json")]
    assert (facts / "n1.json").stat().st_mtime == 1  # the same content: not touched
    assert "10.0.0.2" in (facts / "n2.json").read_text()
    assert sorted(p.name for p in facts.iterdir()) == ["n1.json", "n2.json"]  # no temporaries


def test_a_path_that_is_not_an_absolute_json_file_is_refused_before_any_write(tmp_path):
    good = {"path": str(tmp_path / "facts" / "n1.json"), "content": "{}\n"}
    for bad in ("facts/n2.json", str(tmp_path / "facts" / "n2.txt"), f"{tmp_path}/../x/n2.json"):
        proc = write([good, {"path": bad, "content": "{}\n"}])
        assert proc.returncode != 0, bad
        assert repr(bad) in proc.stderr
        assert not (tmp_path / "facts").exists()

"""plugins/modules/pdsh_info.py, as the pdsh role runs it (the module, through Ansible, and
in check mode the same) and its reading called directly: the packages dpkg lists as
installed, and what `pdsh -q` prints for a host."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from tests import rolefiles

pdsh_info = rolefiles.load_plugin("pdsh_info")

RECORDED = pathlib.Path(__file__).parent / "fixtures" / "pdsh"


def read(request: dict) -> dict:
    state = rolefiles.info_state("pdsh", request)
    assert pdsh_info.read_state(request["packages"], request.get("query_host")) == state
    return state


def test_a_package_dpkg_does_not_know_is_not_installed():
    assert read({"packages": ["dscluster-no-such-package"]}) == {
        "installed": [],
        "query": None,
    }
    assert read({"packages": []}) == {"installed": [], "query": None}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg-query on this machine")
def test_an_installed_package_is_listed_and_an_unknown_one_is_not():
    got = read({"packages": ["dpkg", "dscluster-no-such-package"]})
    assert got == {"installed": ["dpkg"], "query": None}


def fake_pdsh(tmp_path: pathlib.Path, monkeypatch, recorded: str, status: int) -> pathlib.Path:
    """A `pdsh` first on PATH that records its arguments and answers as the recorded pdsh did."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stream = ">&2" if recorded.endswith(".stderr") else ""
    script = bin_dir / "pdsh"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" > "{tmp_path}/args"\n'
        f'cat "{RECORDED / recorded}" {stream}\n'
        f"exit {status}\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / "args"


def test_the_query_is_what_pdsh_q_prints_for_the_host(tmp_path, monkeypatch):
    args = fake_pdsh(tmp_path, monkeypatch, "pdsh-q_debian12_2.34.txt", 0)
    got = read({"packages": [], "query_host": "local-n1"})
    assert got["query"] == (RECORDED / "pdsh-q_debian12_2.34.txt").read_text()
    assert "Rcmd type\t\tssh" in got["query"]
    assert args.read_text() == "-q -w local-n1\n"


def test_a_failing_pdsh_or_none_reads_no_query(tmp_path, monkeypatch):
    fake_pdsh(tmp_path, monkeypatch, "pdsh-q-R_nosuch_debian12_2.34.stderr", 1)
    assert read({"packages": [], "query_host": "local-n1"})["query"] is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert pdsh_info.read_state([], "local-n1") == {"installed": [], "query": None}

"""plugins/modules/pdsh_info.py, as the pdsh role runs it (the module, through Ansible, and
in check mode the same) and its reading called directly: the packages dpkg lists as
installed."""

from __future__ import annotations

import shutil

import pytest

from tests import rolefiles

pdsh_info = rolefiles.load_plugin("pdsh_info")


def read(request: dict) -> dict:
    state = rolefiles.info_state("pdsh", request)
    assert pdsh_info.read_state(request["packages"]) == state
    return state


def test_a_package_dpkg_does_not_know_is_not_installed():
    assert read({"packages": ["dscluster-no-such-package"]}) == {"installed": []}
    assert read({"packages": []}) == {"installed": []}


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg-query on this machine")
def test_an_installed_package_is_listed_and_an_unknown_one_is_not():
    got = read({"packages": ["dpkg", "dscluster-no-such-package"]})
    assert got == {"installed": ["dpkg"]}

"""roles/efa/files: fi_info parser (recorded real outputs) and installer check (real gpg)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from .. import rolefiles

FILES = rolefiles.path("efa", "files")
FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "efa"


fi = rolefiles.load("efa", "efa_fi_info.py")
vi = rolefiles.load("efa", "efa_verify_installer.py")


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "devices", "names", "domains"),
    [
        (
            "fi_info_p4d_4x_rdm.txt",
            4,
            ["rdmap144s27", "rdmap160s27", "rdmap16s27", "rdmap32s27"],
            4,
        ),
        ("fi_info_efa_direct_1x.txt", 1, ["rdmap47s0"], 2),
        ("fi_info_hpc6a_1x.txt", 1, ["rdmap0s31"], 2),
    ],
)
def test_counts_distinct_devices_in_recorded_output(name, devices, names, domains):
    result = fi.parse(_fixture(name))
    assert result["devices"] == devices
    assert result["names"] == names
    assert len(result["domains"]) == domains
    assert result["error"] is None


def test_rdm_and_dgrm_of_one_device_count_once():
    result = fi.parse(_fixture("fi_info_hpc6a_1x.txt"))
    assert result["domains"] == ["rdmap0s31-dgrm", "rdmap0s31-rdm"]
    assert result["devices"] == 1


def test_recorded_enodata_is_zero_devices_not_an_error():
    stderr = _fixture("fi_info_no_device.stderr")
    assert fi.from_run("", stderr, 1)["devices"] == 0
    assert fi.from_run("", stderr, 1)["error"] is None
    # libfabric >= 1.x prints the errno text too, and fi_info exits with the errno.
    assert fi.from_run("", "fi_getinfo: -61 (No data available)\n", 61)["error"] is None


def test_other_failures_are_errors_naming_the_output():
    result = fi.from_run("", "fi_info: error while loading shared libraries: libfabric.so.1\n", 127)
    assert result["devices"] == 0
    assert "rc=127" in result["error"] and "libfabric.so.1" in result["error"]


def test_other_providers_are_not_counted():
    tcp = _fixture("fi_info_hpc6a_1x.txt").replace("provider: efa", "provider: tcp;ofi_rxm")
    assert fi.parse(tcp)["devices"] == 0
    # Layered names put the core provider first ("efa;ofi_rxd" in older libfabric).
    layered = _fixture("fi_info_hpc6a_1x.txt").replace("provider: efa", "provider: efa;ofi_rxd")
    assert fi.parse(layered)["devices"] == 1


def test_concatenated_outputs_of_different_machines_add_up():
    both = _fixture("fi_info_p4d_4x_rdm.txt") + _fixture("fi_info_efa_direct_1x.txt")
    assert fi.parse(both)["devices"] == 5


def test_cli_parse_reads_stdin():
    out = subprocess.run(
        [sys.executable, str(FILES / "efa_fi_info.py"), "parse"],
        input=_fixture("fi_info_p4d_4x_rdm.txt"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert '"devices": 4' in out.stdout


def test_cli_count_with_a_fi_info_that_finds_nothing(tmp_path):
    tool = tmp_path / "fi_info"
    tool.write_text('#!/bin/sh\necho "fi_getinfo: -61 (No data available)" >&2\nexit 61\n')
    tool.chmod(0o755)
    assert fi.main(["count", "--fi-info", str(tool)]) == 0
    missing = tmp_path / "absent"
    assert fi.main(["count", "--fi-info", str(missing)]) == 1


# ---- installer signature check, with real gpg ----

needs_gpg = pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg not installed")


def _gpg(home, *args):
    return subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--yes", *args],
        capture_output=True,
        text=True,
        check=True,
    )


@pytest.fixture
def signed(tmp_path):
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    _gpg(home, "--passphrase", "", "--quick-gen-key", "EFA test signer", "ed25519", "sign", "never")
    colons = _gpg(home, "--with-colons", "--fingerprint", "EFA test signer").stdout
    fpr = next(ln.split(":")[9] for ln in colons.splitlines() if ln.startswith("fpr:"))
    tarball = tmp_path / "aws-efa-installer-1.41.0.tar.gz"
    tarball.write_bytes(os.urandom(4096))
    _gpg(home, "--local-user", fpr, "--output", f"{tarball}.sig", "--detach-sign", str(tarball))
    key = tmp_path / "aws-efa-installer.key"
    key.write_text(_gpg(home, "--armor", "--export", fpr).stdout)
    return {"tarball": str(tarball), "signature": f"{tarball}.sig", "key": str(key), "fpr": fpr}


@needs_gpg
def test_good_signature_from_the_pinned_key(signed):
    spaced = " ".join(signed["fpr"][i : i + 4] for i in range(0, 40, 4)).lower()
    line = vi.verify(signed["tarball"], signed["signature"], signed["key"], spaced)
    assert signed["fpr"] in line


@needs_gpg
def test_tampered_tarball_is_refused(signed):
    with open(signed["tarball"], "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(vi.VerifyError, match="BADSIG"):
        vi.verify(signed["tarball"], signed["signature"], signed["key"], signed["fpr"])


@needs_gpg
def test_key_with_another_fingerprint_is_refused(signed):
    aws = "4E9091BCBB97A96B26B15E59A05480B1DD2D3CCC"
    with pytest.raises(vi.VerifyError, match="expected 4E9091BC"):
        vi.verify(signed["tarball"], signed["signature"], signed["key"], aws)


@needs_gpg
def test_signature_that_is_not_one_is_refused(signed):
    with pytest.raises(vi.VerifyError, match="does not verify"):
        vi.verify(signed["tarball"], signed["key"], signed["key"], signed["fpr"])


@needs_gpg
def test_cli_exit_codes(signed, capsys):
    args = ["--tarball", signed["tarball"], "--signature", signed["signature"], "--key"]
    assert vi.main([*args, signed["key"], "--fingerprint", signed["fpr"]]) == 0
    assert vi.main([*args, signed["key"], "--fingerprint", "0" * 40]) == 1
    assert "EFA installer verification failed" in capsys.readouterr().err

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from dscluster import cli


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dscluster", *args], capture_output=True, text=True, check=False
    )


def one_line_error(proc: subprocess.CompletedProcess[str], rc: int = 1) -> str:
    """rc 1: a failure the line explains; 2: an argument refused before anything ran."""
    assert proc.returncode == rc, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert lines[0].startswith("dscluster: error: ")
    return lines[0]


def test_missing_inventory_is_one_line(tmp_path: pathlib.Path):
    line = one_line_error(run_cli("hostfile", "-i", str(tmp_path / "nope")))
    assert "does not exist" in line and "-i inventories/<name>" in line


def test_inventory_dir_without_hosts(tmp_path: pathlib.Path):
    line = one_line_error(run_cli("hostfile", "-i", str(tmp_path)))
    assert "has no hosts.yml" in line


def test_unparseable_inventory(tmp_path: pathlib.Path):
    (tmp_path / "hosts.yml").write_text("all: [unclosed\n")
    line = one_line_error(run_cli("hostfile", "-i", str(tmp_path / "hosts.yml")))
    assert "cannot read" in line or "has no hosts" in line


def test_two_heads_refused(tmp_path: pathlib.Path):
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    head:\n      hosts:\n        a: {}\n        b: {}\n"
    )
    line = one_line_error(run_cli("hostfile", "-i", str(tmp_path)))
    assert "2 hosts in group 'head'" in line


def test_hostfile_without_facts_names_hosts(inventory_dir: pathlib.Path):
    for f in (inventory_dir / "facts").iterdir():
        f.unlink()
    line = one_line_error(run_cli("hostfile", "-i", str(inventory_dir)))
    assert "node-a, node-b, node-c" in line and "dscluster provision" in line
    assert not (inventory_dir / "hostfile").exists()


def test_hostfile_ok(inventory_dir: pathlib.Path):
    proc = run_cli("hostfile", "-i", str(inventory_dir))
    assert proc.returncode == 0, proc.stderr
    assert "8 slots on 3 hosts" in proc.stdout
    assert (inventory_dir / "hostfile").read_text().startswith("node-a slots=4\n")


def test_bad_cluster_name():
    line = one_line_error(run_cli("local", "up", "--name", "Bad_Name"), rc=2)
    assert "cluster name 'Bad_Name' is not usable" in line


def test_bad_zero_stage_is_usage_error(inventory_dir: pathlib.Path):
    proc = run_cli("smoke", "-i", str(inventory_dir), "--zero", "7")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr


def test_parser_lists_commands():
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])


def test_dsconfig_takes_one_zero_stage(inventory_dir: pathlib.Path):
    """--zero is spelled as in smoke; a config has one stage, so a list is one clear line."""
    line = one_line_error(run_cli("dsconfig", "-i", str(inventory_dir), "--zero", "1,2"), rc=2)
    assert "--zero 1,2: a config has one ZeRO stage" in line
    proc = run_cli("dsconfig", "-i", str(inventory_dir), "--zero", "4")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_master_port_from_the_inventory(inventory_dir: pathlib.Path):
    """--master-port, else the inventory's dscluster_master_port, else the one default."""
    from dscluster import inventory  # noqa: PLC0415

    inv = inventory.load(inventory_dir)
    assert inventory.master_port(inv) == inventory.DEFAULT_MASTER_PORT == 29500
    assert inventory.master_port(inv, 29411) == 29411
    hosts = inventory_dir / "hosts.yml"
    hosts.write_text(
        hosts.read_text().replace(
            "    dscluster_cpu_slots: 1\n",
            "    dscluster_cpu_slots: 1\n    dscluster_master_port: 29601\n",
        )
    )
    inv = inventory.load(inventory_dir)
    assert inventory.master_port(inv) == 29601
    assert inventory.master_port(inv, 29411) == 29411


@pytest.mark.parametrize("flag", ["--slots", "--cpu-slots", "--slots-per-node"])
def test_slots_spellings_are_one_option(flag: str):
    parser = cli.build_parser()
    for argv in (["local", "up"], ["inventory", "static", "--hosts", "a"],
                 ["inventory", "aws", "--cluster", "c"], ["inventory", "slurm"]):  # fmt: skip
        assert parser.parse_args([*argv, flag, "3"]).slots == 3, argv


def test_version_names_the_client_and_its_collection(tmp_path: pathlib.Path):
    """Both lines on stdout; the collection found through DSCLUSTER_COLLECTION, else a line
    that says none was found (and how to get one) instead of a traceback."""
    from dscluster import __version__  # noqa: PLC0415

    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == f"dscluster {__version__}"
    assert second.startswith("dscluster.cluster ") and " at " in second
    env = {"DSCLUSTER_COLLECTION": str(tmp_path), "PATH": "/usr/bin:/bin"}
    bad = subprocess.run(
        [sys.executable, "-m", "dscluster", "--version"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert bad.returncode == 0, bad.stderr
    assert f"DSCLUSTER_COLLECTION={tmp_path} holds no dscluster collection" in bad.stdout


def test_home_puts_inventories_under_it(tmp_path: pathlib.Path):
    proc = subprocess.run(
        [sys.executable, "-m", "dscluster", "--home", str(tmp_path / "h"), "inventory", "static",
         "--hosts", "a,b:2", "--name", "lab"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        tmp_path / "h" / "inventories" / "lab" / "hostfile"
    ).read_text() == "a slots=1\nb slots=2\n"
    assert not (tmp_path / "inventories").exists()


@pytest.mark.parametrize("home", ["", "  ", "/etc/hostname", "/etc/hostname/sub"])
def test_bad_home_is_one_line_and_writes_nothing(tmp_path: pathlib.Path, home: str):
    proc = subprocess.run(
        [sys.executable, "-m", "dscluster", "--home", home, "inventory", "static",
         "--hosts", "a", "--name", "lab"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dscluster: error: --home"), proc.stderr
    assert "give a directory" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DSCLUSTER_JINJA_CACHE", "off"),
        ("DSCLUSTER_FACTS_MEMO", "true"),
        ("DSCLUSTER_MITOGEN", "yes"),
    ],
)
def test_bad_switch_is_one_line_and_writes_nothing(tmp_path: pathlib.Path, name: str, value: str):
    proc = subprocess.run(
        [sys.executable, "-m", "dscluster", "--home", str(tmp_path), "inventory", "static",
         "--hosts", "a", "--name", "lab"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
        env={**os.environ, name: value},
    )  # fmt: skip
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        f"dscluster: error: {name}={value!r} is neither 1 nor 0; set {name}="
    )
    assert "or unset it" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "ref",
    ["debian:bookworm", "debian:trixie", "debian:12", "debian:13.1", "debian:trixie-slim",
     "debian", "registry.example/debian:foo", "ubuntu:24.04"],
)  # fmt: skip
def test_a_supported_debian_release_or_another_image_is_a_base(ref):
    from dscluster.cli.local import base_ref_type  # noqa: PLC0415

    assert base_ref_type(ref) == ref

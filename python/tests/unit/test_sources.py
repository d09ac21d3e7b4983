"""sources/: one cluster description per source, one writer, one set of name rules."""

from __future__ import annotations

import pathlib

import pytest

from dscluster.errors import DsclusterError
from dscluster.sources import cluster, local, names

# What `dscluster local up --name demo --nodes 2 --slots 2` wrote before sources/ existed
# (local._write_inventory), byte for byte, plus the ssh timeout of local nodes (issue 16).
LOCAL_HOSTS_YML = """\
---
# Written by `dscluster local up --name demo --nodes 2`: a local cluster
# of node containers on Docker network dsc-demo. Host keys were read from each
# container over `docker exec` into /s/kh.
all:
  vars:
    dscluster_cluster_name: demo
    dscluster_state_dir: /s
    dscluster_training_user: ds
    dscluster_shared_dir: /shared
    dscluster_shared_storage: external
    dscluster_cpu_slots: 2
    base_apt_deb_cache: /var/cache/dscluster/debs
    ansible_user: root
    ansible_ssh_private_key_file: /s/key
    ansible_ssh_common_args: -o UserKnownHostsFile=/s/kh -o StrictHostKeyChecking=yes
    ansible_ssh_timeout: 10
  children:
    head:
      hosts:
        demo-n1:
          ansible_host: 10.0.0.2
    workers:
      hosts:
        demo-n2:
          ansible_host: 10.0.0.3
"""


def test_local_inventory_is_written_as_before(tmp_path: pathlib.Path):
    nodes = [
        local.Node("demo-n1", "dsc-demo-n1", "10.0.0.2", "ssh-ed25519 AAAA"),
        local.Node("demo-n2", "dsc-demo-n2", "10.0.0.3", "ssh-ed25519 BBBB"),
    ]
    described = local.describe(
        "demo",
        nodes=nodes,
        key=pathlib.Path("/s/key"),
        known_hosts=pathlib.Path("/s/kh"),
        cpu_slots=2,
        sdir=pathlib.Path("/s"),
    )
    written = cluster.write(described, tmp_path)
    assert written.hosts_yml.read_text() == LOCAL_HOSTS_YML
    assert written.hostfile is None and not (tmp_path / "hostfile").exists()
    assert (described.head.name, described.total_slots) == ("demo-n1", 4)


def test_debian_13_nodes_get_the_torch_build_whose_lock_ships(tmp_path: pathlib.Path):
    """local.OS_VARS by the nodes' /etc/os-release: Debian 13's Python 3.13 has a hash lock
    for PyPI's torch only; Debian 12 nodes' inventory is as before."""
    nodes = [local.Node("t-n1", "dsc-t-n1", "10.0.0.2", "ssh-ed25519 AAAA")]
    paths = {"key": pathlib.Path("/s/key"), "known_hosts": pathlib.Path("/s/kh")}
    trixie = local.describe(
        "t", nodes=nodes, cpu_slots=1, sdir=pathlib.Path("/s"), **paths,
        os_vars=local.OS_VARS["debian-13"],
    )  # fmt: skip
    assert trixie.vars["ml_stack_torch_variant"] == "pypi"
    assert "debian-12" not in local.OS_VARS
    locks = pathlib.Path(__file__).parents[3] / "roles/ml_stack/files/locks"
    assert (locks / "pypi-torch2.13.0-ds0.19.8-cp313-x86_64.txt").is_file()


def test_the_last_image_or_base_given_is_the_one_a_later_up_uses(tmp_path, monkeypatch):
    """local up --base debian:trixie is remembered like --image; a later --base drops a
    remembered --image, and --image wins over a remembered base."""
    monkeypatch.setattr(local, "state_dir", lambda name: tmp_path / name)
    built: list[str] = []
    monkeypatch.setattr(local, "node_image", lambda base, console=None: built.append(base) or base)
    present = type("Done", (), {"returncode": 0})()
    monkeypatch.setattr(local, "run", lambda argv, check=True: present)
    sdir = tmp_path / "c"

    def up(image=None, base=None) -> str:
        chosen = local._image_for("c", image, base, console=None)
        local._remember(sdir, image, base)
        return chosen

    assert up() == "debian:bookworm" and not sdir.exists()  # nothing given: nothing kept
    assert up(base="debian:trixie") == "debian:trixie"
    assert up() == "debian:trixie"
    assert up(image="dscluster/baked:c") == "dscluster/baked:c"
    assert up() == "dscluster/baked:c"
    assert up(base="debian:bookworm") == "debian:bookworm"
    assert up() == "debian:bookworm"
    assert built == [
        "debian:bookworm",
        "debian:trixie",
        "debian:trixie",
        "debian:bookworm",
        "debian:bookworm",
    ]


def test_writer_writes_nothing_when_the_hostfile_is_refused(tmp_path: pathlib.Path):
    bad = cluster.Cluster(
        name="x",
        nodes=[cluster.Node("a", 1, {}), cluster.Node("a", 2, {})],
        vars={},
        header="---\n",
    )
    with pytest.raises(DsclusterError):
        cluster.write(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_one_set_of_name_rules():
    names.check_cluster_name("demo-1")
    names.check_inventory_name("site_a")
    with pytest.raises(DsclusterError, match="cluster name 'Bad_Name' is not usable"):
        names.check_cluster_name("Bad_Name")
    with pytest.raises(DsclusterError, match="inventory name 'Bad' is not usable"):
        names.check_inventory_name("Bad")
    assert names.HOSTNAME_RE.match("ip-10-0-0-12") and not names.HOSTNAME_RE.match("-x")


def test_writer_writes_hosts_yml_hostfile_and_known_hosts_as_one(tmp_path: pathlib.Path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "hosts.yml").write_text("old\n")
    (tmp_path / "kh").mkdir()  # the known_hosts target cannot be written
    described = cluster.Cluster(
        name="x",
        nodes=[cluster.Node("a", 1, {}), cluster.Node("b", 2, {})],
        vars={},
        header="---\n",
        known_hosts=tmp_path / "kh",
        known_hosts_text="a ssh-ed25519 AAAA\n",
    )
    with pytest.raises(DsclusterError, match="kh: it is a directory"):
        cluster.write(described, out)
    assert (out / "hosts.yml").read_text() == "old\n"
    assert sorted(p.name for p in out.iterdir()) == ["hosts.yml"]
    (tmp_path / "kh").rmdir()
    written = cluster.write(described, out)
    assert written.hostfile is not None
    assert written.hostfile.read_text() == "a slots=1\nb slots=2\n"
    assert (tmp_path / "kh").stat().st_mode & 0o777 == 0o600

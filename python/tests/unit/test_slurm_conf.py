"""roles/slurm's slurm.conf and gres.conf, rendered by Ansible from an inventory of facts as
the role's play sees them: GPU nodes of different sizes next to a CPU node (no GPU here, so
this is where Gres is checked; the e2e module runs the role on CPU containers). Each host's
facts (host var test_facts) are set as gathered facts, under ansible_facts, before rendering."""

from __future__ import annotations

import os
import pathlib
import re
import sys
import textwrap

from .. import rolefiles

ROLE = rolefiles.path("slurm")
PLAYBOOKS = pathlib.Path(__file__).parent / "playbooks"


def render(tmp_path: pathlib.Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "hosts.yml").write_text(
        textwrap.dedent(
            """\
            all:
              vars: {ansible_connection: local, dscluster_cluster_name: GpuTest}
              children:
                head:
                  hosts:
                    gpu-1:
                      test_facts:
                        ansible_hostname: ip-10-0-0-1
                        ansible_default_ipv4: {address: 10.0.0.1}
                        ansible_memtotal_mb: 1000000
                        ansible_local: {accelerators: {kind: cuda, count: 8, cpus: 96}}
                workers:
                  hosts:
                    gpu-2:
                      test_facts:
                        ansible_hostname: ip-10-0-0-2
                        ansible_default_ipv4: {address: 10.0.0.2}
                        ansible_memtotal_mb: 500000
                        ansible_local: {accelerators: {kind: cuda, count: 1, cpus: 48}}
                    cpu-1:
                      test_facts:
                        ansible_hostname: cpu-1
                        ansible_default_ipv4: {address: 10.0.0.3}
                        ansible_memtotal_mb: 0
                        ansible_processor_vcpus: 16
            """
        )
    )
    (tmp_path / "render.yml").write_text(
        textwrap.dedent(
            f"""\
            - hosts: all
              gather_facts: false
              vars_files: [{ROLE}/defaults/main.yml, {ROLE}/vars/main.yml]
              tasks:
                - recorded_facts:
                    facts: "{{{{ test_facts }}}}"
                - ansible.builtin.template:
                    src: "{ROLE}/templates/{{{{ item }}}}.j2"
                    dest: "{tmp_path}/{{{{ inventory_hostname }}}}.{{{{ item }}}}"
                    mode: '0644'
                  loop: [slurm.conf, gres.conf]
            """
        )
    )
    # the test playbooks' action plugin recorded_facts, beside this playbook
    (tmp_path / "action_plugins").symlink_to(PLAYBOOKS / "action_plugins")
    # the repository's ansible.cfg (facts only under ansible_facts); no fact cache of the user's
    rc, _, out = rolefiles.run_local_play(
        tmp_path / "render.yml",
        {"ansible_python_interpreter": sys.executable},
        "NONE",
        env=dict(os.environ, ANSIBLE_CACHE_PLUGIN="memory"),
        inventory=tmp_path / "hosts.yml",
    )
    assert rc == 0, out[-6000:]
    return {
        host: (
            (tmp_path / f"{host}.slurm.conf").read_text(),
            (tmp_path / f"{host}.gres.conf").read_text(),
        )
        for host in ("gpu-1", "gpu-2", "cpu-1")
    }


def test_gres_and_nodes_from_the_accelerator_facts(tmp_path: pathlib.Path):
    files = render(tmp_path)
    assert len(set(files.values())) == 1  # the same bytes on every node
    conf, gres = files["gpu-1"]
    assert "ClusterName=gputest\n" in conf
    # slurmctld finds itself by its own hostname, not the inventory name
    assert re.search(r"^SlurmctldHost=ip-10-0-0-1\(10\.0\.0\.1\)$", conf, re.M), conf
    assert "GresTypes=gpu\n" in conf
    nodes = {m[1]: m[0] for m in re.finditer(r"^NodeName=(\S+) .*$", conf, re.M)}
    assert set(nodes) == {"gpu-1", "gpu-2", "cpu-1"}
    assert "NodeHostname=ip-10-0-0-1 NodeAddr=10.0.0.1 CPUs=96" in nodes["gpu-1"]
    assert "Gres=gpu:8" in nodes["gpu-1"] and "RealMemory=900000" in nodes["gpu-1"]
    assert "CPUs=48" in nodes["gpu-2"] and "Gres=gpu:1" in nodes["gpu-2"]
    assert "CPUs=16" in nodes["cpu-1"] and "Gres" not in nodes["cpu-1"]
    assert "RealMemory" not in nodes["cpu-1"]  # unknown memory is left out, not 0
    assert re.search(r"^PartitionName=main Nodes=ALL Default=YES", conf, re.M)
    assert [ln for ln in gres.splitlines() if not ln.startswith("#")] == [
        "AutoDetect=off",
        "NodeName=gpu-1 Name=gpu File=/dev/nvidia[0-7]",
        "NodeName=gpu-2 Name=gpu File=/dev/nvidia0",
    ]

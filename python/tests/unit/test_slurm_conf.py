"""roles/slurm's slurm.conf and gres.conf, rendered by Ansible from an inventory of facts as
the role's play sees them: GPU nodes of different sizes next to a CPU node (no GPU here, so
this is where Gres is checked; the e2e module runs the role on CPU containers)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap

from .. import rolefiles

ROLE = rolefiles.path("slurm")


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
                      ansible_hostname: ip-10-0-0-1
                      ansible_default_ipv4: {address: 10.0.0.1}
                      ansible_memtotal_mb: 1000000
                      ansible_local: {accelerators: {kind: cuda, count: 8, cpus: 96}}
                workers:
                  hosts:
                    gpu-2:
                      ansible_hostname: ip-10-0-0-2
                      ansible_default_ipv4: {address: 10.0.0.2}
                      ansible_memtotal_mb: 500000
                      ansible_local: {accelerators: {kind: cuda, count: 1, cpus: 48}}
                    cpu-1:
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
                - ansible.builtin.template:
                    src: "{ROLE}/templates/{{{{ item }}}}.j2"
                    dest: "{tmp_path}/{{{{ inventory_hostname }}}}.{{{{ item }}}}"
                    mode: '0644'
                  loop: [slurm.conf, gres.conf]
            """
        )
    )
    proc = subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
         str(tmp_path / "hosts.yml"), str(tmp_path / "render.yml"),
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
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

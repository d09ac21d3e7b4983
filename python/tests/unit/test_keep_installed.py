"""A working driver, toolkit or Gaudi stack is kept (issue 58): the decisions of
nvidia_driver, cuda_toolkit and habana, rendered by Ansible from what their preflight reads
(nvidia-smi's answer, nvcc's, hl-smi's, the pin file each role writes when it installs),
given here as host variables in place of those tasks' results, for recorded Debian 12 and
Ubuntu 22.04 facts. The roles' defaults: driver branch 580, CUDA 13.0 (issue 75). And what a
kept driver is recorded as: nvidia_driver's fact.yml run against stub nvidia-smi answers."""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest
import yaml

from .. import rolefiles
from . import role_render

# hl-smi's log of a Gaudi2 host (SynapseAI 1.12.1: "Driver Version : 1.12.1-cb7a7bc"),
# fixtures/accelerators/SOURCES.md names it.
HL_SMI = (
    pathlib.Path(__file__).parent / "fixtures" / "accelerators" / "hl-smi-L-i_gaudi2_hl225.txt"
).read_text()

# nvidia-smi --query-gpu=driver_version --format=csv,noheader prints one line per GPU; its
# failure without a driver ("couldn't communicate with the NVIDIA driver") exits 9. 580 is the
# default branch; 570 the one before it (the old default), older than the branch.
SMI_580 = {"rc": 0, "stdout_lines": ["580.126.20", "580.126.20"]}
SMI_590 = {"rc": 0, "stdout_lines": ["590.48.01"]}
SMI_570 = {"rc": 0, "stdout_lines": ["570.172.08"]}
SMI_NONE = {"rc": 9, "stdout_lines": []}
NO_PIN = {"stat": {"exists": False}}
PIN = {"stat": {"exists": True}}
# nvcc --version's release line, as NVIDIA prints it (CUDA 13.0.2: V13.0.88, the default; 12.8.1:
# V12.8.93; the versions extensions/molecule/accelerators/standin/nvidia/packages.yml cites).
NVCC_130 = {"rc": 0, "stdout": "Cuda compilation tools, release 13.0, V13.0.88"}
NVCC_128 = {"rc": 0, "stdout": "Cuda compilation tools, release 12.8, V12.8.93"}
NVCC_NONE = {"rc": 2, "stdout": ""}


def driver(smi: dict, pin: dict, **more) -> dict:
    return {"__nvidia_driver_smi_version": smi, "__nvidia_driver_pin_stat": pin, **more}


def toolkit(nvcc: dict, pin: dict) -> dict:
    return {"__cuda_toolkit_nvcc_found": nvcc, "__cuda_toolkit_pin_stat": pin}


def gaudi(synapseai: str, pin: dict, rc: int = 0) -> dict:
    return {
        "__habana_smi_version": {"rc": rc, "stdout": HL_SMI if rc == 0 else ""},
        "__habana_pin_stat": pin,
        "os_vars_overrides": {"habana_synapseai_version": synapseai},
    }


CASES = {
    # name: (recorded facts, host vars, driver kept, toolkit kept)
    "same_branch": ("debian12", driver(SMI_580, NO_PIN) | toolkit(NVCC_130, NO_PIN), True, True),
    "newer_branch": ("ubuntu2204", driver(SMI_590, NO_PIN) | toolkit(NVCC_130, NO_PIN), True, True),
    "older_branch": ("debian12", driver(SMI_570, NO_PIN) | toolkit(NVCC_128, NO_PIN), False, False),
    "ours": ("debian12", driver(SMI_580, PIN) | toolkit(NVCC_130, PIN), False, False),
    "none": ("ubuntu2204", driver(SMI_NONE, NO_PIN) | toolkit(NVCC_NONE, NO_PIN), False, False),
    "asked": (
        "debian12",
        driver(SMI_NONE, PIN, os_vars_overrides={"nvidia_driver_keep_installed": True})
        | toolkit(NVCC_NONE, NO_PIN),
        True,
        False,
    ),
}
GAUDI = {
    # name: (recorded facts, host vars, stack kept)
    "gaudi_same": ("ubuntu2204", gaudi("1.12.1", NO_PIN), True),
    "gaudi_other": ("ubuntu2204", gaudi("1.21.1", NO_PIN), False),
    "gaudi_ours": ("debian12", gaudi("1.12.1", PIN), False),
    "gaudi_none": ("debian12", gaudi("1.12.1", NO_PIN, rc=127), False),
}
WANTED = {
    "cuda_toolkit": ["__cuda_toolkit_keep"],
    "nvidia_driver": ["__nvidia_driver_keep", "__nvidia_driver_running"],
    "habana": ["__habana_keep", "__habana_running"],
}


@pytest.fixture(scope="module")
def decided(tmp_path_factory) -> dict:
    hosts = {name: (facts, more) for name, (facts, more, _, _) in CASES.items()}
    hosts |= {name: (facts, more) for name, (facts, more, _) in GAUDI.items()}
    result, out = role_render.render(tmp_path_factory.mktemp("keep"), hosts, WANTED)
    assert set(result) == set(hosts), out[-3000:]
    return result


@pytest.mark.parametrize("name", CASES)
def test_a_working_driver_of_the_branch_or_newer_is_kept_unless_this_role_installed_it(
    decided, name
):
    _, _, driver_kept, toolkit_kept = CASES[name]
    assert decided[name]["nvidia_driver"]["__nvidia_driver_keep"] is driver_kept
    assert decided[name]["cuda_toolkit"]["__cuda_toolkit_keep"] is toolkit_kept


def test_the_running_driver_is_read_from_nvidia_smis_first_gpu(decided):
    assert decided["same_branch"]["nvidia_driver"]["__nvidia_driver_running"] == "580.126.20"
    assert decided["none"]["nvidia_driver"]["__nvidia_driver_running"] == ""


@pytest.mark.parametrize("name", GAUDI)
def test_a_running_gaudi_stack_of_the_wanted_release_is_kept_unless_this_role_installed_it(
    decided, name
):
    assert decided[name]["habana"]["__habana_keep"] is GAUDI[name][2]
    running = "1.12.1-cb7a7bc" if name != "gaudi_none" else ""
    assert decided[name]["habana"]["__habana_running"] == running


# What nvidia-smi prints (one line per GPU) to fact.yml's queries, a stub per host. A pre-510
# driver has no compute_cap field and refuses that query (modelled: a message on stdout, rc 2),
# answering the driver_version one. Without a driver both fail, exit 9. dpkg-query is stubbed
# too (no package known), so the driver is recorded from nvidia-smi, as on a kept driver.
ANSWERS = 'case "$*" in\n  *compute_cap*) {caps} ;;\n  *) {driver} ;;\nesac'
SMI_STUBS = {
    "h100": ANSWERS.format(
        caps="printf '580.126.20, 9.0\\n580.126.20, 9.0\\n'",
        driver="printf '580.126.20\\n580.126.20\\n'",
    ),
    "mixed": ANSWERS.format(
        caps="printf '590.48.01, 9.0\\n590.48.01, 8.0\\n'",
        driver="printf '590.48.01\\n590.48.01\\n'",
    ),
    "pre510": ANSWERS.format(
        caps="""echo 'Field "compute_cap" is not a valid field to query.'; exit 2""",
        driver="echo 470.256.02",
    ),
    "none": "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA"
    ' driver."; exit 9',
}
RECORDED = {
    "h100": ("580.126.20", ["9.0"]),
    "mixed": ("590.48.01", ["8.0", "9.0"]),
    "pre510": ("470.256.02", []),
    "none": ("", []),
}
FACT_PLAY = """
- name: Record the nvidia fact with the host's stub nvidia-smi first on PATH
  hosts: all
  gather_facts: false
  tasks:
    - name: Run nvidia_driver's fact.yml
      ansible.builtin.include_role:
        name: nvidia_driver
        tasks_from: fact
        apply:
          environment:
            PATH: "{{ stub_dir }}:{{ lookup('ansible.builtin.env', 'PATH') }}"
      vars:
        # the role's own var names /etc/ansible/facts.d/nvidia.fact: outranked here only
        __nvidia_driver_fact: "{{ fact_file }}"
    - name: Print the fact written
      ansible.builtin.debug:
        msg: "FACT {{ lookup('ansible.builtin.file', fact_file) | from_json | to_json }}"
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fact")
    hosts: dict = {}
    for name, body in SMI_STUBS.items():
        stub = tmp / name
        stub.mkdir()
        for tool, script in (("nvidia-smi", body), ("dpkg-query", "exit 1")):
            (stub / tool).write_text(f"#!/bin/sh\n{script}\n")
            (stub / tool).chmod(0o755)
        hosts[name] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "stub_dir": str(stub),
            "fact_file": str(stub / "facts.d" / "nvidia.fact"),
        }
    inventory = tmp / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    playbook = tmp / "fact.yml"
    playbook.write_text(FACT_PLAY)
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(rolefiles.ROLES))
    rc, _, out = rolefiles.run_local_play(playbook, {}, "FACT", env=env, inventory=inventory)
    assert rc == 0, out[-3000:]
    facts: dict = {}
    host = None
    for line in out.splitlines():
        if line.startswith("ok: ["):
            host = line[5:].split("]", 1)[0]
        if "FACT " in line and host is not None:
            facts[host] = next(rolefiles.tagged(line, "FACT"))
    assert set(facts) == set(SMI_STUBS), out[-3000:]
    return facts


@pytest.mark.parametrize("name", RECORDED)
def test_the_fact_records_the_running_driver_and_the_gpus_compute_capabilities(recorded, name):
    driver, caps = RECORDED[name]
    fact = recorded[name]
    assert (fact["driver"], fact["compute_caps"]) == (driver, caps), json.dumps(fact)
    assert fact["driver_package"] == ""

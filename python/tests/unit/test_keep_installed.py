"""A working driver, toolkit or Gaudi stack is kept (issue 58): the decisions of
nvidia_driver, cuda_toolkit and habana, rendered by Ansible from what their preflight reads
(nvidia-smi's answer, nvcc's, hl-smi's, the pin file each role writes when it installs),
given here as host variables in place of those tasks' results, for recorded Debian 12 and
Ubuntu 22.04 facts."""

from __future__ import annotations

import pathlib

import pytest

from . import role_render

# hl-smi's log of a Gaudi2 host (SynapseAI 1.12.1: "Driver Version : 1.12.1-cb7a7bc"),
# fixtures/accelerators/SOURCES.md names it.
HL_SMI = (
    pathlib.Path(__file__).parent / "fixtures" / "accelerators" / "hl-smi-L-i_gaudi2_hl225.txt"
).read_text()

# nvidia-smi --query-gpu=driver_version --format=csv,noheader prints one line per GPU; its
# failure without a driver ("couldn't communicate with the NVIDIA driver") exits 9.
SMI_570 = {"rc": 0, "stdout_lines": ["570.172.08", "570.172.08"]}
SMI_580 = {"rc": 0, "stdout_lines": ["580.65.06"]}
SMI_550 = {"rc": 0, "stdout_lines": ["550.163.01"]}
SMI_NONE = {"rc": 9, "stdout_lines": []}
NO_PIN = {"stat": {"exists": False}}
PIN = {"stat": {"exists": True}}
# nvcc --version's release line, as NVIDIA prints it (CUDA 12.8.1: V12.8.93; 12.9.1: V12.9.86;
# the versions extensions/molecule/accelerators/standin/nvidia/packages.yml cites).
NVCC_128 = {"rc": 0, "stdout": "Cuda compilation tools, release 12.8, V12.8.93"}
NVCC_129 = {"rc": 0, "stdout": "Cuda compilation tools, release 12.9, V12.9.86"}
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
    "same_branch": ("debian12", driver(SMI_570, NO_PIN) | toolkit(NVCC_128, NO_PIN), True, True),
    "newer_branch": ("ubuntu2204", driver(SMI_580, NO_PIN) | toolkit(NVCC_128, NO_PIN), True, True),
    "older_branch": ("debian12", driver(SMI_550, NO_PIN) | toolkit(NVCC_129, NO_PIN), False, False),
    "ours": ("debian12", driver(SMI_570, PIN) | toolkit(NVCC_128, PIN), False, False),
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
    assert decided["same_branch"]["nvidia_driver"]["__nvidia_driver_running"] == "570.172.08"
    assert decided["none"]["nvidia_driver"]["__nvidia_driver_running"] == ""


@pytest.mark.parametrize("name", GAUDI)
def test_a_running_gaudi_stack_of_the_wanted_release_is_kept_unless_this_role_installed_it(
    decided, name
):
    assert decided[name]["habana"]["__habana_keep"] is GAUDI[name][2]
    running = "1.12.1-cb7a7bc" if name != "gaudi_none" else ""
    assert decided[name]["habana"]["__habana_running"] == running

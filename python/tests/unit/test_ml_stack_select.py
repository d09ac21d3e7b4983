"""ml_stack per accelerator: the role's own preflight and selection logic, run by Ansible on
the controller with the accelerator facts a CPU, GPU or Gaudi build host would record
(facts the test gives, set as gathered facts, stand in for /etc/ansible/facts.d). No
download, no build."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

from .. import rolefiles

PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "ml_stack_select.yml"


def select(extra: dict) -> tuple[int, dict | None, str]:
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(rolefiles.ROLES), ANSIBLE_CACHE_PLUGIN="memory")
    extra = {
        "ansible_python_interpreter": sys.executable,
        "ml_stack_build_host": "localhost",
    } | extra
    # ansible_local, ansible_python, ...: laid over the gathered facts, under ansible_facts
    return rolefiles.run_local_play(PLAYBOOK, rolefiles.as_gathered(extra), "SELECTION", env=env)


def facts(**local) -> dict:
    return {"ansible_local": local}


def test_cpu_build_host_gets_cpu_torch_and_cpu_ops():
    rc, sel, out = select(facts(accelerators={"kind": "cpu", "count": 0}))
    assert rc == 0, out
    assert sel["variant"] == "cpu" and sel["torch"] == "torch==2.13.0+cpu"
    assert sel["ops"] == ["async_io", "cpu_adam", "deepspeed_shm_comm", "fused_adam"]
    assert sel["source_args"] == [] and sel["build_env"] == {"DS_ACCELERATOR": "cpu"}
    # torch==2.13.0+cpu is on PyTorch's index, not on PyPI
    assert sel["torch_index"] == "https://download.pytorch.org/whl/cpu"
    assert sel["key"].startswith("cpu-torch2.13.0-ds0.19.8-cp")


def test_only_a_cpu_build_starts_early_and_ml_stack_joins_only_its_own_key():
    cpu = facts(accelerators={"kind": "cpu", "count": 0})
    rc, sel, out = select(cpu)
    assert rc == 0, out
    # base brings a CPU build's toolchain: it may start right after base; ml_stack builds
    # in the foreground unless this run started this key's build
    assert sel["build_early"] is True and sel["build_phase"] == "all"
    rc, joined, out = select(cpu | {"__ml_stack_build_job": {"jid": "j1", "key": sel["key"]}})
    assert rc == 0, out
    assert joined["build_phase"] == "join"
    rc, other, out = select(cpu | {"__ml_stack_build_job": {"jid": "j1", "key": "cpu-other"}})
    assert rc == 0, out
    assert other["build_phase"] == "all"  # a build of another key is not this one's
    rc, off, out = select(cpu | {"ml_stack_build_early": False})
    assert rc == 0, out
    assert off["build_early"] is False
    # CUDA needs the toolkit of the accelerators play first
    gpu = facts(accelerators={"kind": "cuda", "count": 4}, nvidia={"cuda": "12.8"})
    rc, sel, out = select(gpu)
    assert rc == 0, out
    assert sel["build_early"] is False and sel["build_phase"] == "all"


def test_the_ranks_a_node_runs_decide_whether_the_install_compiles_a_jobs_bytecode():
    """__ml_stack_node.ranks (the node's hostfile slots): above 1, the seed task compiles what
    a job imports at install instead of leaving it to every rank of the first job."""
    cpu = facts(accelerators={"kind": "cpu", "count": 0})
    for slots in (1, 2):
        rc, sel, out = select(cpu | {"dscluster_cpu_slots": slots})
        assert rc == 0, out
        assert sel["node_ranks"] == slots
    gpu = facts(accelerators={"kind": "cuda", "count": 8}, nvidia={"cuda": "12.8"})
    rc, sel, out = select(gpu | {"dscluster_cpu_slots": 1})
    assert rc == 0, out
    assert sel["node_ranks"] == 8  # the GPUs, not the CPU slots


def test_a_converged_node_seeds_its_bytecode_again_only_when_it_now_runs_more_ranks():
    """__ml_stack_seed_needed: a converged node (venv ready, prefix directory there) skips the
    seed, unless it now runs several ranks and its ml_stack fact says the prefix lacks a job's
    imports (dscluster_cpu_slots raised after the install); the fact then records the warm-up
    (__ml_stack_pycache_warm), so the next run skips it again."""

    def seed(slots: int, recorded: dict | None, **more) -> dict:
        local = {"accelerators": {"kind": "cpu", "count": 0}}
        if recorded is not None:
            local["ml_stack"] = {"pycache_dir": "/opt/dscluster/pycache", **recorded}
        extra = {"ansible_local": local, "dscluster_cpu_slots": slots, "__ml_stack_ready": True}
        rc, sel, out = select(extra | more)
        assert rc == 0, out
        return {"needed": sel["seed_needed"], "warm": sel["pycache_warm"]}

    # converged with one rank a node: nothing to seed, nothing recorded as warm
    assert seed(1, {}) == {"needed": False, "warm": False}
    # cpu_slots raised to 2 after the install: seed once, with the warm-up, and record it
    assert seed(2, {})["needed"] is True
    assert seed(2, {"pycache_warm": False})["needed"] is True
    assert seed(2, {}, __ml_stack_seed=True)["warm"] is True
    # the next run reads the fact: nothing to do
    assert seed(2, {"pycache_warm": True}) == {"needed": False, "warm": True}
    # back to one rank: no seed; the prefix keeps what it has
    assert seed(1, {"pycache_warm": True}) == {"needed": False, "warm": True}
    # a seed with one rank (venv installed again) does not warm
    assert seed(1, {"pycache_warm": True}, __ml_stack_seed=True)["warm"] is False
    # the venv installed or read again, or a new prefix directory: seed
    assert seed(1, {}, __ml_stack_ready=False)["needed"] is True
    assert seed(1, {}, __ml_stack_dirs={"changed": True})["needed"] is True
    # no prefix: never
    assert seed(4, {}, ml_stack_pycache_dir="")["needed"] is False


@pytest.mark.parametrize(("cuda", "variant"), [("12.8.1", "cu128"), ("12.6", "cu126")])
def test_gpu_build_host_gets_the_torch_of_its_cuda(cuda, variant):
    rc, sel, out = select(facts(accelerators={"kind": "cuda", "count": 4}, nvidia={"cuda": cuda}))
    assert rc == 0, out
    assert sel["torch"] == f"torch==2.13.0+{variant}"
    assert sel["torch_index"] == f"https://download.pytorch.org/whl/{variant}"
    assert sel["source_args"] == []
    assert "async_io" in sel["ops"] and "fused_adam" in sel["ops"]
    assert sel["build_env"]["CUDA_HOME"] == f"/usr/local/cuda-{cuda[:4].rstrip('.')}"
    assert sel["build_env"]["DS_ACCELERATOR"] == "cuda"
    assert sel["key"].startswith(f"{variant}-torch2.13.0-")


PY313 = {"ansible_python": {"version": {"major": 3, "minor": 13, "micro": 5}}}


def test_pypi_torch_has_no_local_label_and_its_python_3_13_lock_ships():
    """ml_stack_torch_variant: pypi (Debian 13's local clusters): PyPI's own torch build, from
    the default index; the lock shipped for it is Python 3.13's, and the cpu build has none
    for 3.13 (its preflight refuses it in the lock's line)."""
    cpu = facts(accelerators={"kind": "cpu", "count": 0})
    rc, sel, out = select(cpu | PY313 | {"ml_stack_torch_variant": "pypi"})
    assert rc == 0, out
    assert sel["variant"] == "pypi" and sel["torch"] == "torch==2.13.0"
    assert sel["source_args"] == [] and sel["torch_index"] == ""
    assert sel["build_early"] is True
    assert sel["key"].startswith("pypi-torch2.13.0-ds0.19.8-cp313-x86_64-")
    assert sel["lock"] == "pypi-torch2.13.0-ds0.19.8-cp313-x86_64.txt"
    assert rolefiles.path("ml_stack", f"files/locks/{sel['lock']}").is_file()
    rc, sel, out = select(cpu | PY313)
    assert rc == 0, out
    assert sel["lock"] == "cpu-torch2.13.0-ds0.19.8-cp313-x86_64.txt"
    assert not rolefiles.path("ml_stack", f"files/locks/{sel['lock']}").exists()
    # PyPI's build ships for every Python the supported systems run (Ubuntu 22.04's 3.10 ...)
    for minor in (10, 11, 12):
        py = {"ansible_python": {"version": {"major": 3, "minor": minor, "micro": 1}}}
        rc, sel, out = select(cpu | py | {"ml_stack_torch_variant": "pypi"})
        assert rc == 0, out
        assert rolefiles.path("ml_stack", f"files/locks/{sel['lock']}").is_file(), sel["lock"]
    gpu = facts(accelerators={"kind": "cuda", "count": 4}, nvidia={"cuda": "13.0"})
    rc, sel, out = select(gpu | {"ml_stack_torch_variant": "pypi"})
    assert rc == 0, out
    assert sel["torch"] == "torch==2.13.0" and sel["torch_index"] == ""
    gaudi = facts(accelerators={"kind": "hpu", "count": 8}, habana={"synapseai": "1.21.1-16"})
    rc, _, out = select(gaudi | {"ml_stack_torch_variant": "pypi"})
    assert rc != 0 and "No torch wheel variant for hpu" in out


def test_cuda_without_a_torch_build_fails_preflight_naming_the_versions():
    rc, sel, out = select(facts(accelerators={"kind": "cuda", "count": 2}, nvidia={"cuda": "11.8"}))
    assert rc != 0 and sel is None
    assert "No torch wheel variant for cuda with CUDA 11.8" in out
    assert "12.6, 12.8, 13.0" in out


# The OS facts Ansible derives on Ubuntu 22.04 (fixtures/os_facts/ubuntu2204.json).
UBUNTU_2204 = {
    "ansible_distribution": "Ubuntu",
    "ansible_distribution_version": "22.04",
    "ansible_distribution_major_version": "22",
}


def test_gaudi_build_host_gets_the_habana_torch_and_deepspeed_fork():
    rc, sel, out = select(
        facts(accelerators={"kind": "hpu", "count": 8}, habana={"synapseai": "1.21.1-16"})
        | UBUNTU_2204
    )
    assert rc == 0, out
    assert sel["variant"] == "hpu" and sel["torch"] == "torch==2.6.0"
    assert sel["deepspeed"] == "0.14.4" and sel["sdist"] == "deepspeed-habana-1.21.1.tar.gz"
    assert "habana-torch-plugin==1.21.1.16" in sel["requirements"]
    assert sel["source_args"][0] == "--find-links" and sel["torch_index"] == ""


def test_gaudi_on_an_unsupported_os_or_synapseai_fails_preflight():
    rc, _, out = select(
        facts(accelerators={"kind": "hpu", "count": 8}, habana={"synapseai": "1.21.1-16"})
    )
    assert rc != 0
    assert "runs SynapseAI 1.21.1 on debian12" in out and "ubuntu22.04" in out
    rc, _, out = select(
        facts(accelerators={"kind": "hpu", "count": 8}, habana={"synapseai": "1.9.0-580"})
        | UBUNTU_2204
    )
    assert rc != 0
    assert "runs SynapseAI 1.9.0" in out and "1.21.1, 1.22.0" in out


def test_a_node_of_another_kind_than_the_wheelhouse_fails_preflight():
    rc, _, out = select(
        facts(accelerators={"kind": "cpu", "count": 0}) | {"ml_stack_accelerator": "cuda"}
    )
    assert rc != 0
    assert "localhost is a cpu node, but the wheelhouse is built for cuda" in out

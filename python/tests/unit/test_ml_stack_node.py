"""ml_stack's side of one node in Python (plugins/module_utils/ml_stack_node.py, issue 75):
the paths root checks, the training user's directories, the reading's and the seed's argv,
the ranks, and when a converged node seeds its bytecode again. The role runs it through the
ml_stack_node action (test_ml_stack_select.py runs that in a play)."""

from __future__ import annotations

import json

from .. import rolefiles

node_mod = rolefiles.load_util("ml_stack_node")
plan_mod = rolefiles.load_util("ml_stack_plan")

OPTIONS = {
    "ml_stack_python": "/usr/bin/python3",
    "ml_stack_venv": "/opt/dscluster/venv",
    "ml_stack_tools_venv": "/opt/dscluster/tools",
    "ml_stack_node_wheelhouse": "/opt/dscluster/wheelhouse",
    "ml_stack_node_user_wheelhouse": "/opt/dscluster/wheelhouse-user",
    "ml_stack_node_tools_wheelhouse": "/opt/dscluster/wheelhouse-tools",
    "ml_stack_torch_extensions_dir": "/opt/dscluster/torch_extensions",
    "ml_stack_pycache_dir": "/opt/dscluster/pycache",
    "dscluster_training_user": "ds",
    "dscluster_cpu_slots": 1,
}
PLAN = {
    "torch_version": "2.13.0",
    "deepspeed_version": "0.19.8",
    "ops": {"cpu_adam": "DS_BUILD_CPU_ADAM", "fused_adam": "DS_BUILD_FUSED_ADAM"},
    "user_layer": False,
    "user_key": "user-0123abcd",
}
WARM = ["torch._dynamo", "deepspeed.runtime.engine"]


def decide(local=None, plan=PLAN, **options):
    return node_mod.node_plan(
        plan,
        local or {},
        OPTIONS | options,
        digests={"lock.json": "ab" * 32},
        uv_version="0.9.5",
        warm_modules=WARM,
    )


def test_every_path_root_runs_from_is_checked_and_the_reading_carries_the_controllers_side():
    got = decide()
    assert got["root_paths"] == [
        "/usr/bin/python3",
        "/opt/dscluster/venv",
        "/opt/dscluster/venv/bin",
        "/opt/dscluster/venv/bin/python",
        "/opt/dscluster/tools",
        "/opt/dscluster/tools/bin",
        "/opt/dscluster/tools/bin/uv",
        "/opt/dscluster/wheelhouse",
        "/opt/dscluster/wheelhouse-user",
        "/opt/dscluster/wheelhouse-tools",
        "/opt/dscluster/bin",
    ]
    argv = got["reading_argv"]
    assert argv[:5] == [
        "/opt/dscluster/venv/bin/python",
        "/opt/dscluster/bin/record_versions.py",
        "/opt/dscluster/wheelhouse",
        "/opt/dscluster/wheelhouse-user",
        "/opt/dscluster/tools",
    ]
    assert argv[5] == "--want" and argv[7] == "--pip-check" and len(argv) == 8
    assert json.loads(argv[6]) == {
        "torch": "2.13.0",
        "deepspeed": "0.19.8",
        "ops": ["cpu_adam", "fused_adam"],
        "user_layer_key": "",
        "uv": "0.9.5",
        "digests": {"lock.json": "ab" * 32},
    }
    # with a user layer, its key is expected too
    layered = decide(plan=PLAN | {"user_layer": True})
    assert json.loads(layered["reading_argv"][6])["user_layer_key"] == "user-0123abcd"


def test_the_training_users_directories_are_made_only_where_configured():
    dirs = decide()["dirs"]
    assert [d["path"] for d in dirs] == [
        "/opt/dscluster/torch_extensions",
        "/opt/dscluster/pycache",
    ]
    assert {d["owner"] for d in dirs} == {"ds"} and {d["mode"] for d in dirs} == {"0755"}
    none = decide(ml_stack_torch_extensions_dir="", ml_stack_pycache_dir="")
    assert none["dirs"] == [] and none["seed_possible"] is False


def test_ranks_are_the_accelerators_else_the_cpu_slots_and_decide_the_warm_up():
    cpu = {"accelerators": {"kind": "cpu", "count": 0}}
    assert decide(cpu)["ranks"] == 1
    two = decide(cpu, dscluster_cpu_slots="2")
    assert two["ranks"] == 2
    assert two["seed_argv"][:7] == [
        "runuser",
        "-u",
        "ds",
        "--",
        "python3",
        "-I",
        "/opt/dscluster/bin/pycache_seed.py",
    ]
    assert two["seed_argv"][7:] == ["/opt/dscluster/venv", "/opt/dscluster/pycache", *WARM]
    # one rank: the seed copies the venv's bytecode, the first job compiles the rest
    assert decide(cpu)["seed_argv"][7:] == ["/opt/dscluster/venv", "/opt/dscluster/pycache"]
    gpu = decide({"accelerators": {"kind": "cuda", "count": 8}}, dscluster_cpu_slots=1)
    assert gpu["ranks"] == 8 and gpu["seed_argv"][-len(WARM) :] == WARM


def test_a_converged_node_with_more_ranks_seeds_again_until_its_fact_says_warm():
    cpu = {"accelerators": {"kind": "cpu", "count": 0}}
    assert decide(cpu, dscluster_cpu_slots=2)["seed_for_ranks"] is True
    warm = cpu | {"ml_stack": {"pycache_warm": True}}
    got = decide(warm, dscluster_cpu_slots=2)
    assert got["seed_for_ranks"] is False and got["pycache_warm_recorded"] is True
    assert decide(cpu)["seed_for_ranks"] is False  # one rank: no warm-up to do


def test_preflight_reads_this_nodes_python_synapseai_and_habana_os():
    options = {
        "__ml_stack_os_table": {
            "Debian-12": {"habana_os": "debian12"},
            "Ubuntu-22": {"habana_os": "ubuntu22.04"},
        },
        "ml_stack_habana_synapseai_version": "1.21.1",
        "ml_stack_habana_compat": {"1.21.1": {"os": ["ubuntu22.04", "ubuntu24.04"]}},
    }
    facts = {
        "python": {"version": {"major": 3, "minor": 10}},
        "distribution": "Ubuntu",
        "distribution_major_version": "22",
        "ansible_local": {"habana": {"synapseai": "1.21.1-16"}},
    }
    assert plan_mod.node_of(facts, options) == {
        "node_pyver": "3.10",
        "node_synapseai": "1.21.1",
        "node_habana_os": "ubuntu22.04",
        "node_habana_compat_os": "ubuntu22.04, ubuntu24.04",
    }
    # no habana fact: the configured release; an OS not in the table: Debian 12's name; a
    # release the table lacks: None (the refusal then lists no OS for it)
    other = plan_mod.node_of(
        {"python": {"version": {"major": 3, "minor": 11}}, "distribution": "Rocky"},
        options | {"ml_stack_habana_synapseai_version": "1.99.0"},
    )
    assert other["node_synapseai"] == "1.99.0" and other["node_habana_os"] == "debian12"
    assert other["node_habana_compat_os"] is None

"""ml_stack's build plan in Python (plugins/module_utils/ml_stack_plan.py, issue 75): every
value vars/main.yml rendered for 32 recorded cases (fixtures/ml_stack_plan: Debian 12 and 13,
Ubuntu 22.04 and 24.04 x cpu, CUDA, Gaudi, PyPI's torch, a lock and a user layer of the
inventory's) comes out of plan() unchanged, the wheelhouse keys above all; and the refusals
a node gets for a driver or a GPU too old for the build."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from .. import rolefiles

plan_mod = rolefiles.load_util("ml_stack_plan")
HERE = pathlib.Path(__file__).parent / "fixtures" / "ml_stack_plan"
ROLE = rolefiles.ROLES / "ml_stack"
CASES = json.loads((HERE / "cases.json").read_text())
BEFORE = json.loads((HERE / "rendered_before.json").read_text())
OS_FACTS = pathlib.Path(__file__).parent / "fixtures" / "os_facts"
PYTHON = "/controller/venv/bin/python"


# The defaults of the recording (commit 99d13ef) that issue 75 changed: a CUDA 13.0 node then
# took PyTorch's cu130, and CUDA 12.8 was assumed where the build host recorded none.
RECORDED_DEFAULTS = {
    "ml_stack_cuda_version": "12.8",
    "ml_stack_torch_cuda_variants": {"12.6": "cu126", "12.8": "cu128", "13.0": "cu130"},
}


def role_options(overrides: dict) -> dict:
    """The role's defaults and its OS table (as the play has them), then the overrides."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    table = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__ml_stack_os_table"]
    return defaults | {"__ml_stack_os_table": table} | overrides


def case_inputs(name: str) -> tuple[dict, dict]:
    """The case's build host facts (the OS recording, then what the case adds, by the names
    under ansible_facts) and its options, the fixtures' directory in place of {HERE}."""
    case = json.loads(json.dumps(CASES[name]).replace("{HERE}", str(HERE)))
    recorded = json.loads((OS_FACTS / f"{case['os']}.json").read_text())["ansible_facts"]
    given = case["facts"] | recorded  # a recorded fact wins, as the recorder's playbook had it
    facts = {k.removeprefix("ansible_") if k != "ansible_local" else k: v for k, v in given.items()}
    return facts, role_options(RECORDED_DEFAULTS | case["overrides"])


def expected(name: str) -> dict:
    text = json.dumps(BEFORE[name])
    for mark, path in (("{HERE}", HERE), ("{PYTHON}", PYTHON), ("{ROLE}", ROLE)):
        text = text.replace(mark, str(path))
    return {k.removeprefix("__ml_stack_"): v for k, v in json.loads(text).items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_plan_is_what_the_jinja_rendered(name):
    facts, options = case_inputs(name)
    got = plan_mod.plan(facts, options, role_path=str(ROLE), python=PYTHON)
    want = expected(name)
    # the wheelhouse key first: a changed key would rebuild every cached wheelhouse
    assert got["key"] == want["key"]
    # one change on purpose: the build names DeepSpeed's accelerator (not part of the key)
    if want["accelerator"] in ("cpu", "cuda"):
        want["accel_build_env"] = {"DS_ACCELERATOR": want["accelerator"]} | want["accel_build_env"]
    assert {k: got[k] for k in want} == want


def test_the_keys_of_every_recorded_os_and_accelerator_are_distinct_where_inputs_differ():
    keys = {name: expected(name)["key"] for name in CASES}
    # same inputs, same key: the early-build switch and a CUDA node built as cpu change nothing
    assert keys["d12_cpu"] == keys["d12_cpu_early_off"] == keys["d12_cuda_as_cpu"]
    assert (
        len({keys[n] for n in ("d12_cpu", "d12_cpu_amd", "d12_cpu_noproc", "d12_cpu_lockfile")})
        == 4
    )


def test_a_lock_file_the_controller_cannot_read_is_one_error_naming_it(tmp_path):
    facts, options = case_inputs("d12_cpu")
    missing = tmp_path / "nope.txt"
    with pytest.raises(plan_mod.PlanError) as err:
        plan_mod.plan(
            facts,
            options | {"ml_stack_base_lock_file": str(missing)},
            role_path=str(ROLE),
            python=PYTHON,
        )
    assert str(err.value) == (
        f"ml_stack_base_lock_file={missing} is not a file the controller can read (No such file "
        "or directory); point it at the file, or set it to ''."
    )
    with pytest.raises(
        plan_mod.PlanError, match=r"^ml_stack_requirements_file=reqs\.txt is not an absolute"
    ):
        plan_mod.plan(
            facts,
            options | {"ml_stack_requirements_file": "reqs.txt"},
            role_path=str(ROLE),
            python=PYTHON,
        )


def test_missing_python_facts_are_named():
    facts, options = case_inputs("d12_cpu")
    del facts["python"]
    with pytest.raises(plan_mod.PlanError, match="python"):
        plan_mod.plan(facts, options, role_path=str(ROLE), python=PYTHON)


# ---- The unit table: the four OSes x cpu / CUDA (new and old driver, old GPU) / Gaudi ----
# Each OS's python3 (test_os_vars.py: PYTHONS), on the recorded OS facts.
PYTHONS = {"debian12": (3, 11), "debian13": (3, 13), "ubuntu2204": (3, 10), "ubuntu2404": (3, 12)}
XEON = ["0", "GenuineIntel", "Intel(R) Xeon(R) Platinum 8488C"]
H100 = {"count": 8, "models": ["NVIDIA H100 80GB HBM3"]}
# The nvidia fact (nvidia_driver/tasks/fact.yml) of a node the NVIDIA roles' defaults made, of a
# node that kept an older driver (nvidia_driver_keep_installed), and of a V100 node.
NVIDIA = {
    "new": {"driver": "580.126.20", "cuda": "13.0", "compute_caps": ["9.0"]},
    "old_driver": {"driver": "570.172.08", "cuda": "13.0", "compute_caps": ["9.0"]},
    "old_gpu": {"driver": "580.126.20", "cuda": "13.0", "compute_caps": ["7.0"]},
}
MODELS = {"old_gpu": ["Tesla V100-SXM2-32GB"]}


def node_facts(os_name: str, kind: str) -> dict:
    recorded = json.loads((OS_FACTS / f"{os_name}.json").read_text())["ansible_facts"]
    facts = {k.removeprefix("ansible_"): v for k, v in recorded.items()}
    major, minor = PYTHONS[os_name]
    local: dict = {"accelerators": {"kind": "cpu", "count": 0}}
    if kind in NVIDIA:
        nvidia = H100 | {"models": MODELS.get(kind, H100["models"])}
        local = {"accelerators": {"kind": "cuda", "count": 8, "nvidia": nvidia}}
        local["nvidia"] = NVIDIA[kind]
    if kind == "gaudi":
        local = {"accelerators": {"kind": "hpu", "count": 8}, "habana": {"synapseai": "1.21.1"}}
    architecture = facts.get("architecture", "x86_64")
    return facts | {
        "python": {"version": {"major": major, "minor": minor}},
        "architecture": architecture,
        "processor": XEON,
        "ansible_local": local,
    }


def plan_for(os_name: str, kind: str) -> tuple[dict, str]:
    facts = node_facts(os_name, kind)
    options = role_options({"ml_stack_controller_wheelhouse": "/cache/wheelhouse"})
    built = plan_mod.plan(facts, options, role_path=str(ROLE), python=PYTHON)
    local = facts["ansible_local"]
    models = local["accelerators"].get("nvidia", {}).get("models", [])
    node = {"host": "gpu-1", "nvidia": local.get("nvidia", {}), "models": models}
    return built, plan_mod.node_refusal(built, node, options)


@pytest.mark.parametrize("os_name", sorted(PYTHONS))
def test_a_cuda_node_of_every_os_gets_a_build_whose_lock_ships(os_name):
    built, refusal = plan_for(os_name, "new")
    major, minor = PYTHONS[os_name]
    assert built["variant"] == "pypi" and built["torch_spec"] == "torch==2.13.0"
    assert built["torch_cuda"] == "13.0" and built["torch_index"] == ""
    assert built["lock_name"] == f"pypi-torch2.13.0-ds0.19.8-cp{major}{minor}-x86_64.txt"
    assert built["base_locked"] and (ROLE / "files" / "locks" / built["lock_name"]).is_file()
    assert built["key"].startswith(f"pypi-torch2.13.0-ds0.19.8-cp{major}{minor}-x86_64-")
    # DeepSpeed's CUDA ops: built against the toolkit of torch's CUDA, for the arch list
    assert built["accel_build_env"] == {
        "DS_ACCELERATOR": "cuda",
        "TORCH_CUDA_ARCH_LIST": "8.0;9.0",
        "CUDA_HOME": "/usr/local/cuda-13.0",
    }
    assert set(built["ops"]) == {"cpu_adam", "fused_adam", "fused_lamb", "async_io"}
    assert refusal == ""


@pytest.mark.parametrize("os_name", sorted(PYTHONS))
def test_a_kept_driver_too_old_for_the_build_is_refused_naming_both_ways_out(os_name):
    built, refusal = plan_for(os_name, "old_driver")
    major, minor = PYTHONS[os_name]
    assert built["variant"] == "pypi" and built["cuda_needs"]["driver_branch"] == 580
    assert refusal == (
        "gpu-1 runs NVIDIA driver 570.172.08; torch==2.13.0 (pypi: CUDA 13.0) needs driver branch "
        '580 or newer: set nvidia_driver_branch: "580" (nvidia_driver_keep_installed: false) to '
        "install it; or keep it and take an older CUDA: make a lock for it with `dscluster lock "
        f"--variant cu128 --python {major}.{minor} --arch x86_64`, then set "
        "ml_stack_base_lock_file to it, ml_stack_torch_variant: cu128 and cuda_toolkit_version: "
        '"12.8".'
    )


def test_a_gpu_older_than_the_builds_cuda_is_refused_naming_it_and_the_older_cuda():
    _, refusal = plan_for("debian12", "old_gpu")
    assert refusal == (
        "gpu-1 has Tesla V100-SXM2-32GB (compute capability 7.0); torch==2.13.0 (pypi: CUDA 13.0) "
        "runs on compute capability 7.5 and newer, so this GPU needs an older CUDA: make a lock "
        "for it with `dscluster lock --variant cu128 --python 3.11 --arch x86_64`, then set "
        "ml_stack_base_lock_file to it, ml_stack_torch_variant: cu128 and cuda_toolkit_version: "
        '"12.8".'
    )


def test_a_node_that_names_no_driver_or_gpu_generation_is_not_refused():
    """A container (no nvidia-smi) or a driver before compute_cap: nothing to judge by."""
    facts, options = node_facts("debian12", "new"), role_options({})
    built = plan_mod.plan(facts, options, role_path=str(ROLE), python=PYTHON)
    for nvidia in ({}, {"driver": "", "compute_caps": []}, {"driver": "580.126.20"}):
        assert plan_mod.node_refusal(built, {"host": "n", "nvidia": nvidia}, options) == ""


@pytest.mark.parametrize("os_name", sorted(PYTHONS))
def test_cpu_and_gaudi_nodes_of_every_os(os_name):
    major, minor = PYTHONS[os_name]
    built, refusal = plan_for(os_name, "cpu")
    assert (built["variant"], refusal) == ("cpu", "")
    # the cpu build's lock ships for Debian 12's Python; elsewhere the refusal makes one
    assert built["base_locked"] is (os_name == "debian12")
    command = f"`dscluster lock --variant cpu --python {major}.{minor} --arch x86_64`"
    assert command in built["base_lock_refusal"]
    built, refusal = plan_for(os_name, "gaudi")
    assert (built["variant"], built["torch_spec"], refusal) == ("hpu", "torch==2.6.0", "")
    assert built["key"].startswith(f"hpu-torch2.6.0-ds0.14.4-cp{major}{minor}-x86_64-")


def test_todays_wheelhouse_keys_are_the_tables_too():
    """The table's Debian 12 CPU node and Debian 13 pypi node are the recorded cases: same key."""
    assert plan_for("debian12", "cpu")[0]["key"] == expected("d12_cpu")["key"]
    facts = node_facts("debian13", "cpu")
    options = role_options({"ml_stack_controller_wheelhouse": "/cache/wheelhouse"})
    pypi = plan_mod.plan(
        facts, options | {"ml_stack_torch_variant": "pypi"}, role_path=str(ROLE), python=PYTHON
    )
    assert pypi["key"] == expected("d13_pypi")["key"]


def test_a_cuda_release_without_a_variant_is_refused_listing_those_with_one():
    facts = node_facts("ubuntu2204", "new")
    facts["ansible_local"]["nvidia"] = {"cuda": "11.8", "driver": "580.126.20"}
    options = role_options({})
    built = plan_mod.plan(facts, options, role_path=str(ROLE), python=PYTHON)
    assert plan_mod.node_refusal(built, {"host": "g"}, options) == (
        "No torch wheel variant for cuda with CUDA 11.8 (ml_stack_torch_variant=auto); CUDA "
        "versions with a variant: 12.6, 12.8, 13.0. Install one of those with cuda_toolkit, or "
        "add the variant to ml_stack_torch_cuda_variants."
    )
    as_cpu = options | {"ml_stack_torch_variant": "cpu"}
    gaudi_as_cpu = plan_mod.plan(
        node_facts("ubuntu2204", "gaudi"), as_cpu, role_path=str(ROLE), python=PYTHON
    )
    assert plan_mod.node_refusal(gaudi_as_cpu, {"host": "g"}, as_cpu).startswith(
        "No torch wheel variant for hpu (ml_stack_torch_variant=cpu)"
    )


def test_the_controllers_commands_on_the_layers_are_the_tasks_argvs():
    """What wheelhouse.yml, verify_wheelhouse.yml and user_layer.yml run, as their Jinja built
    it: the user layer of the recorded case, a Gaudi build's check, a locked download."""
    facts, options = case_inputs("d12_cpu_userlayer")
    built = plan_mod.plan(facts, options, role_path=str(ROLE), python="/py")
    key = expected("d12_cpu_userlayer")["key"]
    user = expected("d12_cpu_userlayer")["user_hash"]
    platforms = [f"--platform={tag}" for tag in options["ml_stack_platform_tags"]]
    assert built["user_layer_argv"] == [
        "/py", f"{ROLE}/files/user_layer.py", "--base", f"/cache/wheelhouse/{key}",
        "--out", f"/cache/wheelhouse-user/{key}/{user}", "--key", f"user-{user}",
        "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28",
        *platforms, "--requirement=transformers==4.57.1", "--requirement=datasets",
        "--requirements-file", str(HERE / "requirements.txt"),
        "--uv-arg=--index-url", "--uv-arg=https://mirror.example/simple",
        "--pip-arg=--index-url", "--pip-arg=https://mirror.example/simple",
    ]  # fmt: skip
    wheelhouse = f"/cache/wheelhouse/{key}"
    lock = str(ROLE / "files" / "locks" / "cpu-torch2.13.0-ds0.19.8-cp311-x86_64.txt")
    assert built["verify_argv"] == [
        "/py", f"{ROLE}/files/hash_wheels.py", "verify", wheelhouse,
        "--built", "deepspeed-0.19.8*.whl",
        "--sdist", f"{wheelhouse}/src/deepspeed-0.19.8.tar.gz", "--lock", lock,
    ]  # fmt: skip
    assert built["locked_download_argv"] == [
        "/py", f"{ROLE}/files/hash_wheels.py", "download", "--lock", built["base_lock"],
        "--dest", wheelhouse, "--exclude", "deepspeed",
        "--index-for=torch=https://download.pytorch.org/whl/cpu",
        *(f"--require={r}" for r in built["base_requirements"]), "--",
        *built["pip_download_argv"],
    ]  # fmt: skip
    facts, options = case_inputs("u2204_hpu_pinned")
    gaudi = plan_mod.plan(facts, options, role_path=str(ROLE), python="/py")
    wheelhouse = gaudi["wheelhouse"]
    assert gaudi["verify_argv"] == [
        "/py", f"{ROLE}/files/hash_wheels.py", "verify", wheelhouse,
        "--built", "deepspeed-0.14.4*.whl",
        "--sdist", f"{wheelhouse}/src/deepspeed-habana-1.21.1.tar.gz", "--sdist-sha256", "a" * 64,
    ]  # fmt: skip

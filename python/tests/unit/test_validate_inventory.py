"""validate_inventory over real inventories, run by Ansible on the controller: the storage
kind, the path set and the `storage` group (the role reads hostvars/groups and connects to
nothing), reported together, one numbered line per problem."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from .. import rolefiles

ROOT = rolefiles.REPO
PLAYBOOK = pathlib.Path(__file__).parent / "playbooks" / "validate_inventory.yml"
ANSIBLE = pathlib.Path(sys.executable).parent / "ansible-playbook"


def validate(
    tmp_path: pathlib.Path,
    variables: dict,
    storage: list[str] | None = None,
    host_vars: dict[str, dict] | None = None,
):
    host_vars = host_vars or {}
    workers = [h for h in host_vars if h != "h1"] or ["h2", "h3"]
    data: dict = {
        "all": {
            "vars": {"ansible_connection": "local", **variables},
            "children": {
                "head": {"hosts": {"h1": host_vars.get("h1", {})}},
                "workers": {"hosts": {h: host_vars.get(h, {}) for h in workers}},
            },
        }
    }
    if storage is not None:
        data["all"]["children"]["storage"] = {"hosts": {h: {} for h in storage}}
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(data))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(rolefiles.ROLES),
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_NOCOLOR="1",
    )
    proc = subprocess.run(
        [str(ANSIBLE), "-i", str(inv), str(PLAYBOOK)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("kind", ["nfs", "lustre", "external", "none"])
def test_every_storage_kind_with_the_path_set_passes(tmp_path, kind):
    rc, out = validate(
        tmp_path,
        {
            "dscluster_shared_storage": kind,
            "dscluster_shared_dir": "/fsx",
            "dscluster_jobs_dir": "/fsx/jobs",
            "dscluster_checkpoint_dir": "/fsx/ckpt",
            "dscluster_wheelhouse_dir": "/fsx/wheels",
            "dscluster_scratch_dir": "/opt/dlami/nvme",
        },
        storage=["h2"],
    )
    assert rc == 0, out


def test_problems_are_reported_together(tmp_path):
    rc, out = validate(
        tmp_path,
        {"dscluster_shared_storage": True, "dscluster_checkpoint_dir": "relative/ckpt"},
        storage=["s9"],
    )
    assert rc != 0
    assert "The inventory has 3 problem(s)" in out
    assert (
        '[1] dscluster_checkpoint_dir is "relative/ckpt"; it must be an absolute path' in out
        or 'dscluster_checkpoint_dir is \\"relative/ckpt\\"' in out
    )
    assert "dscluster_shared_storage is true; it must be one of nfs, lustre, external, none" in out
    assert "s9 is in `storage` but in neither `head` nor `workers`" in out


def test_unknown_storage_kind_names_the_value(tmp_path):
    rc, out = validate(tmp_path, {"dscluster_shared_storage": "nfs4"})
    assert rc != 0
    assert "The inventory has 1 problem(s)" in out
    assert 'dscluster_shared_storage is "nfs4"' in out or 'is \\"nfs4\\"' in out


def problems(out: str) -> list[str]:
    """The numbered problem lines of the report (Ansible may print them JSON-escaped)."""
    text = out.replace('\\"', '"').replace("\\n", "\n")
    return sorted({ln.strip() for ln in text.splitlines() if ln.strip().startswith("[")})


def test_every_rule_of_rules_yml_is_applied_and_reported_together(tmp_path):
    rc, out = validate(
        tmp_path,
        {
            "dscluster_master_port": 0,
            "dscluster_training_user": "root",
            "dscluster_training_uid": 12,
            "dscluster_extra_env": {"A-B": 1},
            "dscluster_nccl_socket_ifname": "eth 0",
            "dscluster_slurm": "yes",
            "dscluster_expected_slots": -1,
            "dscluster_venv": "venv",
            "dscluster_shared_dir": "/",
        },
    )
    assert rc != 0
    assert "The inventory has 9 problem(s)" in out
    for text in (
        "dscluster_master_port is 0; it must be a TCP port, a whole number from 1 to 65535",
        'dscluster_training_user is "root"; it must be a Linux user name other than root',
        "dscluster_training_uid is 12; it must be a whole number from 1000 to 65533",
        'dscluster_extra_env is {"A-B": 1}; it must be a mapping of environment variable names',
        'dscluster_nccl_socket_ifname is "eth 0"',
        'dscluster_slurm is "yes"; it must be true or false',
        "dscluster_expected_slots is -1; it must be a whole number from 0 to 1024",
        'dscluster_venv is "venv"; it must be an absolute path',
        "dscluster_shared_dir is \"/\"; it must be an absolute path other than '/'",
    ):
        assert any(text in line for line in problems(out)), (text, problems(out))


def test_base_extra_packages_must_be_a_list_of_package_names_per_host(tmp_path):
    """A list rule (files/rules.yml type list): the role refuses a string (apt would get one
    name, or the role's list join would break on the node) and an item that is no package name,
    each on its host, and passes a list of names with :arch and =version."""
    rc, out = validate(
        tmp_path,
        {},
        host_vars={
            "h1": {"base_extra_packages": "htop vim"},
            "h2": {"base_extra_packages": ["htop", "nvtop vim"]},
            "h3": {"base_extra_packages": ["htop", 3]},
            "h4": {"base_extra_packages": ["htop", "libc6:amd64", "nvtop=3.0.1-1", "g++-12"]},
            "h5": {"base_extra_packages": []},
        },
    )
    assert rc != 0
    assert "The inventory has 3 problem(s)" in out
    lines = problems(out)
    for host, shown in (
        ("h1", '"htop vim"'),
        ("h2", '["htop", "nvtop vim"]'),
        ("h3", '["htop", 3]'),
    ):
        want = (
            f"on {host}: base_extra_packages is {shown}; it must be a list of Debian package names"
        )
        assert any(want in ln for ln in lines), (want, lines)
    assert not any("h4" in ln or "h5" in ln for ln in lines), lines


def test_the_user_layer_is_refused_before_any_node(tmp_path):
    """ml_stack's user layer (files/rules.yml): a string instead of a list, a pip option as
    an item, a relative or missing requirements file and a string of index arguments are each
    refused by the first play (the ml_stack play would fail on them minutes later, after the
    base play changed the nodes); hosts that disagree on the layer are refused too."""
    lock = tmp_path / "requirements.txt"
    lock.write_text("transformers==4.57.1\n")
    rc, out = validate(
        tmp_path,
        {},
        host_vars={
            "h1": {"ml_stack_extra_requirements": "transformers==4.57.1"},
            "h2": {"ml_stack_extra_requirements": ["-r requirements.txt"]},
            "h3": {"ml_stack_requirements_file": "requirements.txt"},
            "h4": {"ml_stack_requirements_file": str(tmp_path / "missing.txt")},
            "h5": {"ml_stack_uv_compile_args": "--index-url https://mirror.example/simple"},
        },
    )
    assert rc != 0
    lines = problems(out)
    for host, text in (
        ("h1", 'ml_stack_extra_requirements is "transformers==4.57.1"; it must be a list of'),
        ("h2", 'ml_stack_extra_requirements is ["-r requirements.txt"]; it must be a list of'),
        ("h3", 'ml_stack_requirements_file is "requirements.txt"; it must be "" for none, or'),
        ("h4", f'ml_stack_requirements_file is "{tmp_path / "missing.txt"}" (no such file on the '
         "controller); it must be"),
        ("h5", 'ml_stack_uv_compile_args is "--index-url https://mirror.example/simple"; it'),
    ):  # fmt: skip
        assert any(f"on {host}: {text}" in ln for ln in lines), (host, text, lines)
    assert any(ln.startswith("[") and "ml_stack_extra_requirements differs" in ln for ln in lines)
    # The same variables, well formed and the same on every host: no problem.
    good = {
        "ml_stack_extra_requirements": [
            "transformers==4.57.1",
            "accelerate>=1.0,<2",
            "datasets[audio] == 4.4.1",
            "lightning==2.5.5; python_version >= '3.9'",
            "mypkg @ https://example.org/mypkg-1.0-py3-none-any.whl",
        ],
        "ml_stack_requirements_file": str(lock),
        "ml_stack_uv_compile_args": ["--index-url", "https://mirror.example/simple"],
        "ml_stack_pip_download_args": [],
    }
    rc, out = validate(tmp_path, good)
    assert rc == 0, problems(out)


def test_cpu_slots_refuses_bools_floats_strings_and_zero_per_host(tmp_path):
    rc, out = validate(
        tmp_path,
        {},
        host_vars={
            "h1": {"dscluster_cpu_slots": True},
            "h2": {"dscluster_cpu_slots": 2.7},
            "h3": {"dscluster_cpu_slots": "2"},
            "h4": {"dscluster_cpu_slots": 0},
            "h5": {"dscluster_cpu_slots": 1025},
            "h6": {"dscluster_cpu_slots": 4, "dscluster_extra_env": {"OMP_NUM_THREADS": 4}},
        },
    )
    assert rc != 0
    assert "The inventory has 5 problem(s)" in out
    lines = problems(out)
    for host, shown in (("h1", "true"), ("h2", "2.7"), ("h3", '"2"'), ("h4", "0"), ("h5", "1025")):
        assert any(f"on {host}: dscluster_cpu_slots is {shown};" in ln for ln in lines), lines
    assert not any("h6" in ln for ln in lines), lines


def test_a_host_named_like_a_group_is_refused(tmp_path):
    rc, out = validate(tmp_path, {}, host_vars={"h1": {}, "Workers": {}})
    assert rc != 0
    assert "on Workers: The host name cannot be used" in out.replace("\\n", " ")
    assert "not be a group name (all, ungrouped, head, workers, storage, localhost)" in out


def test_cuda_arch_list_with_an_arch_suffix_is_refused_before_any_node(tmp_path):
    """DeepSpeed's op builder reads MAJOR.MINOR[+PTX] only: '9.0a' stopped its build on an
    H200 (int('0a')); the play names the value, a good list passes."""
    rc, out = validate(tmp_path, {"ml_stack_cuda_arch_list": "8.0;9.0a"})
    assert rc != 0
    assert "The inventory has 1 problem(s)" in out
    [line] = [ln for ln in problems(out) if ln.startswith("[1]")]
    assert line.startswith('[1] on h1, h2, h3: ml_stack_cuda_arch_list is "8.0;9.0a"; it must be')
    assert "without a suffix such as 9.0a" in line
    assert 'e.g. ml_stack_cuda_arch_list: "8.0;9.0"' in line
    rc, out = validate(tmp_path, {"ml_stack_cuda_arch_list": "8.0 8.6;9.0+PTX"})
    assert rc == 0, out


def test_unknown_variables_and_disagreeing_hosts_are_named_per_host(tmp_path):
    """A typo is named on the host that has it (a site variable in the extra list passes); a
    cluster-wide variable set on some hosts only passes, two values on two hosts do not; a
    templated value is checked as Ansible renders it."""
    rc, out = validate(
        tmp_path,
        {"validate_inventory_extra_known_vars": ["dscluster_site_proxy"]},
        host_vars={
            "h1": {"dscluster_cpu_slot": 2, "dscluster_site_proxy": "http://proxy:3128"},
            "h2": {"dscluster_shared_dir": "/fsx", "dscluster_training_uid": 2000},
            "h3": {"dscluster_shared_dir": "/lustre", "dscluster_cpu_slots": "{{ 1 + 1 }}"},
        },
    )
    assert rc != 0
    assert "The inventory has 2 problem(s)" in out
    lines = problems(out)
    typo = "on h1: Unknown variable(s) dscluster_cpu_slot (a typo?)"
    assert any(ln.startswith("[") and typo in ln for ln in lines), lines
    differs = "dscluster_shared_dir differs between hosts: h1=(unset), h2=/fsx, h3=/lustre"
    assert any(differs in ln for ln in lines), lines
    wrong = ("dscluster_training_uid is", "Unknown variable(s) dscluster_site")
    assert not any(w in ln for w in wrong for ln in lines), lines
    rc, out = validate(tmp_path, {}, host_vars={"h1": {}, "h2": {"dscluster_cpu_slots": "{{ 0 }}"}})
    assert rc != 0
    assert any("on h2: dscluster_cpu_slots is 0;" in ln for ln in problems(out)), problems(out)


def test_a_refused_secret_names_its_keys_never_its_values(tmp_path):
    """dscluster_secret_env holds tokens: the role's refusal, the loop items Ansible prints
    and the client's own line name the keys and what is wrong, never a value."""
    rc, out = validate(
        tmp_path, {"dscluster_secret_env": {"HF_TOKEN": "hunter2-token", "BAD": ["hunter3"]}}
    )
    assert rc != 0
    assert any(
        'dscluster_secret_env is "{BAD, HF_TOKEN} (values hidden)"' in line
        for line in problems(out)
    ), problems(out)
    assert "hunter2" not in out and "hunter3" not in out
    from dscluster import rules  # noqa: PLC0415

    rule = rules.variables()["dscluster_secret_env"]
    line = rules.problem("dscluster_secret_env", {"HF_TOKEN": 1.5e400, "X": ["hunter3"]}, rule)
    assert line.startswith("dscluster_secret_env is {HF_TOKEN, X} (values hidden) (HF_TOKEN is")
    assert "hunter3" not in line and "inf" not in line
    assert rules.problem("dscluster_secret_env", "HF_TOKEN=hunter2", rule).startswith(
        "dscluster_secret_env is hidden (a string)"
    )

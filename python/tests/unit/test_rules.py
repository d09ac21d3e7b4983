"""rules.py: the inventory rules of roles/validate_inventory/files/rules.yml, applied by the
client; the file agrees with the role's defaults, sources/names.py and storage.py."""

from __future__ import annotations

import fnmatch
import pathlib

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dscluster import inventory, rules, storage
from dscluster.errors import DsclusterError
from dscluster.sources import names

from .. import rolefiles

DEFAULTS = yaml.safe_load(rolefiles.path("validate_inventory", "defaults/main.yml").read_text())


def make_inv(tmp_path: pathlib.Path, hostvars: dict, head=("n1",), workers=("n2", "n3")):
    source = tmp_path / "hosts.yml"
    source.write_text("all: {}\n")
    every = [*head, *workers]
    groups = {"all": every, "head": list(head), "workers": list(workers)}
    return inventory.Inventory(
        source=source, groups=groups, hostvars={h: dict(hostvars.get(h, {})) for h in every}
    )


def test_the_rules_file_ships_in_the_collection():
    galaxy = yaml.safe_load((rolefiles.REPO / "galaxy.yml").read_text())
    rel = str(rules.RULES_PATH)
    parts = pathlib.PurePosixPath(rel).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in galaxy.get("build_ignore") or []:
        assert not any(fnmatch.fnmatch(p, pattern) for p in prefixes), pattern
    assert (rolefiles.REPO / rules.RULES_PATH).is_file()


def test_the_role_defaults_agree_with_the_rules_file():
    variables = rules.variables()
    assert sorted(DEFAULTS["validate_inventory_known_vars"]) == sorted(variables)
    wide = [n for n, r in variables.items() if r.get("cluster_wide")]
    assert sorted(DEFAULTS["validate_inventory_cluster_wide_vars"]) == sorted(wide)
    kinds = variables["dscluster_shared_storage"]["choices"]
    assert kinds == DEFAULTS["validate_inventory_storage_kinds"] == list(storage.KINDS)
    assert variables["dscluster_training_uid"]["min"] == DEFAULTS["validate_inventory_min_uid"]


def test_host_rules_agree_with_names_py():
    hosts = rules.load_rules()["hosts"]
    assert hosts["pattern"] == names.HOSTNAME_RE.pattern
    assert set(hosts["reserved"]) == set(names.RESERVED_NAMES)


def test_every_rule_is_complete():
    for name, rule in rules.variables().items():
        assert rule["type"] in ("int", "str", "bool", "mapping", "list", "path", "enum"), name
        assert rule["must"] and rule["example"].startswith(f"{name}:"), name
        example = yaml.safe_load(rule["example"])[name]
        assert rules.value_ok(rule, example), (name, example)


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("dscluster_cpu_slots", 1, True),
        ("dscluster_cpu_slots", 1024, True),
        ("dscluster_cpu_slots", 0, False),
        ("dscluster_cpu_slots", 1025, False),
        ("dscluster_cpu_slots", True, False),
        ("dscluster_cpu_slots", 2.7, False),
        ("dscluster_cpu_slots", 2.0, False),
        ("dscluster_cpu_slots", "2", False),
        ("dscluster_cpu_slots", None, False),
        ("dscluster_master_port", 0, False),
        ("dscluster_master_port", 65535, True),
        ("dscluster_master_port", 70000, False),
        ("dscluster_expected_slots", 0, True),
        ("dscluster_expected_slots", -1, False),
        ("dscluster_training_user", "ds", True),
        ("dscluster_training_user", "root", False),
        ("dscluster_training_user", "ds\n", False),
        ("dscluster_training_uid", 999, False),
        ("dscluster_training_uid", 65534, False),
        ("dscluster_shared_dir", "/fsx", True),
        ("dscluster_shared_dir", "/", False),
        ("dscluster_shared_dir", "//", False),
        ("dscluster_shared_dir", "fsx", False),
        ("dscluster_shared_dir", "/a b", False),
        ("dscluster_shared_storage", "lustre", True),
        ("dscluster_shared_storage", "NFS", False),
        ("dscluster_extra_env", {"OMP_NUM_THREADS": 4, "A": "x", "B": 1.5, "C": True}, True),
        ("dscluster_extra_env", {}, True),
        ("dscluster_extra_env", {"A-B": 1}, False),
        ("dscluster_extra_env", {"1A": 1}, False),
        ("dscluster_extra_env", {"A": [1]}, False),
        ("dscluster_extra_env", {"A": None}, False),
        ("dscluster_extra_env", {"A": "x\ny"}, False),
        ("dscluster_extra_env", ["A=1"], False),
        ("dscluster_nccl_socket_ifname", "", True),
        ("dscluster_nccl_socket_ifname", "^docker,lo", True),
        ("dscluster_nccl_socket_ifname", "=eth0", True),
        ("dscluster_nccl_socket_ifname", "eth 0", False),
        ("dscluster_venv", "/opt/dscluster/venv", True),
        ("dscluster_venv", "venv", False),
        ("dscluster_slurm", False, True),
        ("dscluster_slurm", "yes", False),
        ("base_extra_packages", [], True),
        (
            "base_extra_packages",
            ["htop", "libstdc++6", "g++-12", "nvtop=3.0.1-1", "libc6:amd64"],
            True,
        ),
        ("base_extra_packages", "htop", False),
        ("base_extra_packages", "htop vim", False),
        ("base_extra_packages", ["htop vim"], False),
        ("base_extra_packages", ["htop,vim"], False),
        ("base_extra_packages", ["Htop"], False),
        ("base_extra_packages", ["h"], False),
        ("base_extra_packages", [3], False),
        ("base_extra_packages", [None], False),
        ("base_extra_packages", {"htop": True}, False),
        ("ml_stack_extra_requirements", [], True),
        (
            "ml_stack_extra_requirements",
            [
                "transformers==4.57.1",
                "accelerate>=1.0,<2",
                "datasets[audio] == 4.4.1",
                "lightning==2.5.5; python_version >= '3.9'",
                "mypkg @ https://example.org/mypkg-1.0-py3-none-any.whl",
                "torchmetrics",
            ],
            True,
        ),
        ("ml_stack_extra_requirements", "transformers==4.57.1", False),
        ("ml_stack_extra_requirements", ["-r requirements.txt"], False),
        ("ml_stack_extra_requirements", ["--index-url=https://x"], False),
        ("ml_stack_extra_requirements", [""], False),
        ("ml_stack_extra_requirements", ["transformers 4.57.1"], False),
        ("ml_stack_extra_requirements", ["transformers==4.57.1\naccelerate"], False),
        ("ml_stack_extra_requirements", [4.57], False),
        ("ml_stack_requirements_file", "", True),
        ("ml_stack_requirements_file", "/srv/req.txt", True),
        ("ml_stack_requirements_file", "~/project/requirements.txt", True),
        ("ml_stack_requirements_file", "requirements.txt", False),
        ("ml_stack_requirements_file", ["/srv/req.txt"], False),
        ("ml_stack_uv_compile_args", ["--index-url", "https://mirror.example/simple"], True),
        ("ml_stack_uv_compile_args", "--index-url https://mirror.example/simple", False),
        ("ml_stack_pip_download_args", ["--index-url", ""], False),
    ],
)
def test_value_rules(name, value, ok):
    assert rules.value_ok(rules.variables()[name], value) is ok


def test_check_value_names_value_kind_and_example():
    with pytest.raises(DsclusterError) as exc:
        rules.check_value("dscluster_cpu_slots", "eight")
    assert str(exc.value).startswith("dscluster_cpu_slots is 'eight' (a string); it must be")
    assert "e.g. dscluster_cpu_slots: 2" in str(exc.value)
    rules.check_value("dscluster_cpu_slots", "{{ slots }}")  # a template: Ansible's business
    rules.check_value("dscluster_site_thing", object())  # not a rule


def test_check_inventory_one_error_naming_host_value_file_and_fix(tmp_path):
    inv = make_inv(tmp_path, {"n2": {"dscluster_cpu_slots": "eight"}})
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    workers:\n      hosts:\n        n2: {dscluster_cpu_slots: eight}\n"
    )
    with pytest.raises(DsclusterError) as exc:
        rules.check_inventory(inv)
    msg = str(exc.value)
    assert msg.startswith("dscluster_cpu_slots on n2 is 'eight' (a string); it must be a whole")
    assert msg.endswith(f"fix it in {rules._display(tmp_path / 'hosts.yml')}")


def test_check_inventory_lists_every_problem_and_says_every_host(tmp_path):
    bad = {"dscluster_master_port": 0, "dscluster_cpu_slot": 2}
    every = {h: bad for h in ("n1", "n2", "n3")}
    inv = make_inv(tmp_path, every, head=("n1", "n2"), workers=("n3",))
    with pytest.raises(DsclusterError) as exc:
        rules.check_inventory(inv)
    msg = str(exc.value)
    assert "has 3 problems" in msg
    assert "2 hosts in group 'head' (n1, n2)" in msg
    assert "dscluster_master_port on every host is 0; it must be a TCP port" in msg
    assert "dscluster_cpu_slot on every host is not a dscluster variable (did you mean " in msg


def test_a_controller_file_rule_needs_the_file_on_the_controller(tmp_path, monkeypatch):
    """ml_stack_requirements_file: written right but missing is refused, naming the value and
    that it is missing; an existing file, ~ expanded, and "" pass."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "req.txt").write_text("transformers==4.57.1\n")
    for good in ("", str(tmp_path / "req.txt"), "~/req.txt"):
        rules.check_inventory(make_inv(tmp_path, {"n1": {"ml_stack_requirements_file": good}}))
    missing = str(tmp_path / "nope.txt")
    every = {h: {"ml_stack_requirements_file": missing} for h in ("n1", "n2", "n3")}
    inv = make_inv(tmp_path, every)
    with pytest.raises(DsclusterError) as exc:
        rules.check_inventory(inv)
    assert str(exc.value).startswith(
        f"ml_stack_requirements_file on every host is {missing!r} (no such file on the "
        "controller); it must be"
    )
    with pytest.raises(DsclusterError, match=r"'~/nope.txt' \(no such file on the controller\)"):
        rules.check_value("ml_stack_requirements_file", "~/nope.txt")
    # A relative path is refused for how it is written, not as a missing file.
    with pytest.raises(DsclusterError) as exc:
        rules.check_value("ml_stack_requirements_file", "req.txt")
    assert "no such file" not in str(exc.value)


def test_site_variables_listed_in_extra_known_vars_pass(tmp_path):
    site = {"dscluster_site_proxy": "http://p", rules.EXTRA_KNOWN: ["dscluster_site_proxy"]}
    rules.check_inventory(make_inv(tmp_path, {"n1": site, "n2": site, "n3": site}))


def test_templates_are_left_to_ansible(tmp_path):
    hv = {"dscluster_cpu_slots": "{{ 2 }}", "dscluster_shared_dir": "{{ base }}/x"}
    rules.check_inventory(make_inv(tmp_path, {"n1": hv}))


def test_reserved_and_bad_host_names_refused(tmp_path):
    inv = make_inv(tmp_path, {}, workers=("n2", "all"))
    with pytest.raises(DsclusterError, match="host name 'all' is reserved"):
        rules.check_inventory(inv)


def test_cluster_wide_values_may_not_differ(tmp_path):
    inv = make_inv(tmp_path, {"n1": {"dscluster_training_uid": 2000}, "n2": {}})
    rules.check_inventory(inv)
    inv = make_inv(
        tmp_path, {"n1": {"dscluster_training_uid": 2000}, "n2": {"dscluster_training_uid": 2001}}
    )
    with pytest.raises(DsclusterError, match=r"n1=2000, n2=2001\); it must be the same"):
        rules.check_inventory(inv)


@pytest.mark.parametrize("port", [0, 70000, "abc", True, 2.5])
def test_master_port_var_refuses_instead_of_defaulting(tmp_path, port):
    inv = make_inv(tmp_path, {"n1": {"dscluster_master_port": port}})
    with pytest.raises(DsclusterError, match=r"dscluster_master_port is .*1 to 65535"):
        inventory.master_port_var(inv)


def test_master_port_var_reads_a_good_port(tmp_path):
    assert inventory.master_port_var(make_inv(tmp_path, {"n1": {"dscluster_master_port": 1}})) == 1
    assert inventory.master_port_var(make_inv(tmp_path, {})) is None


YAML_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(rules.variables())), value=YAML_VALUES)
def test_any_value_is_accepted_or_refused_with_one_line(name, value):
    try:
        rules.check_value(name, value)
    except DsclusterError as exc:
        text = str(exc)
        assert text.startswith(f"{name} is ") and "it must be" in text and "e.g." in text


def test_ansible_vault_values_are_not_yaml_errors(tmp_path: pathlib.Path):
    """Inline `!vault` values (and `!unsafe`) are Ansible's YAML tags: an inventory with them
    loads; the encrypted text is Ansible's to decrypt."""
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(
        "all:\n  vars:\n    motd: !unsafe '{{ not a template }}'\n  children:\n"
        "    head:\n      hosts:\n        n1: {}\n    workers:\n      hosts:\n        n2: {}\n"
    )
    (inv / "group_vars" / "all.yml").write_text(
        "db_password: !vault |\n"
        "  $ANSIBLE_VAULT;1.1;AES256\n"
        "  62313365396662343061393464336163383764373764613633653634306231386433626436623361\n"
        "dscluster_cpu_slots: 2\n"
    )
    loaded = inventory.load(inv)
    assert loaded.hosts == ["n1", "n2"]
    assert loaded.var("n2", "dscluster_cpu_slots") == 2

"""The storage path set: Python's defaults and the roles' defaults agree, bad values fail."""

from __future__ import annotations

import jinja2
import pytest
import yaml

from dscluster import storage
from dscluster.errors import DsclusterError

from .. import rolefiles

# role default -> the Paths field it must equal
ROLE_PATHS = {
    ("deepspeed_launcher", "deepspeed_launcher_job_root"): "jobs_dir",
    ("deepspeed_launcher", "deepspeed_launcher_checkpoint_dir"): "checkpoint_dir",
    ("deepspeed_launcher", "deepspeed_launcher_scratch_dir"): "scratch_dir",
    ("deepspeed_launcher", "deepspeed_launcher_shared_storage"): "kind",
    ("ml_stack", "ml_stack_node_wheelhouse"): "wheelhouse_dir",
    ("ml_stack", "ml_stack_shared_storage"): "kind",
    ("doctor", "doctor_scratch_dir"): "scratch_dir",
    ("_dscluster_defaults", "dscluster_jobs_dir"): "jobs_dir",
    ("_dscluster_defaults", "dscluster_checkpoint_dir"): "checkpoint_dir",
    ("_dscluster_defaults", "dscluster_wheelhouse_dir"): "wheelhouse_dir",
    ("_dscluster_defaults", "dscluster_scratch_dir"): "scratch_dir",
    ("_dscluster_defaults", "dscluster_shared_storage"): "kind",
}

CASES = [
    {},
    {"dscluster_shared_storage": "none"},
    {"dscluster_shared_storage": "external"},
    {"dscluster_shared_storage": "nfs", "dscluster_shared_dir": "/fsx"},
    {"dscluster_shared_storage": "lustre", "dscluster_shared_dir": "/lustre/team"},
    {"dscluster_shared_storage": "none", "dscluster_shared_dir": "/data"},
    {
        "dscluster_shared_storage": "nfs",
        "dscluster_jobs_dir": "/home/jobs",
        "dscluster_checkpoint_dir": "/ckpt",
        "dscluster_wheelhouse_dir": "/srv/wheels",
        "dscluster_scratch_dir": "/opt/dlami/nvme",
    },
]


def _render(template: object, context: dict) -> object:
    if not isinstance(template, str):
        return template
    return jinja2.Environment().from_string(template).render(**context).strip()


def cluster_vars(variables: dict) -> dict:
    """roles/_dscluster_defaults' values under the inventory's, each rendered in terms of the
    others as Ansible does lazily (the controller-side cache paths, env lookups, are left out)."""
    defaults = yaml.safe_load(
        rolefiles.path("_dscluster_defaults", "defaults/main.yml").read_text()
    )
    raw = {k: v for k, v in defaults.items() if "lookup(" not in str(v)} | variables
    context = dict(raw)
    for _ in range(len(raw)):  # a chain of references is at most this long
        context = {k: _render(v, context) for k, v in raw.items()}
    return context


def render_role_default(role: str, name: str, variables: dict) -> str:
    if name in variables:  # the inventory's value beats any role default
        return str(variables[name])
    defaults = yaml.safe_load(rolefiles.path(role, "defaults/main.yml").read_text())
    return str(_render(str(defaults[name]), cluster_vars(variables)))


@pytest.mark.parametrize("variables", CASES)
def test_role_defaults_match_python(variables):
    expected = storage.paths(variables)
    for (role, name), field in ROLE_PATHS.items():
        assert render_role_default(role, name, variables) == getattr(expected, field), (
            f"{role} {name} disagrees with storage.paths for {variables}"
        )


def test_defaults_follow_the_storage_kind():
    shared = storage.paths({"dscluster_shared_storage": "nfs"})
    assert shared.shared
    assert shared.jobs_dir == "/shared/dscluster/jobs"
    assert shared.checkpoint_dir == "/shared/dscluster/checkpoints"
    assert shared.wheelhouse_dir == "/shared/dscluster/wheelhouse"
    assert shared.scratch_dir == "/var/lib/dscluster/scratch"
    local = storage.paths({})
    assert local.kind == "none" and not local.shared
    assert local.jobs_dir == "/shared/dscluster/jobs"  # same path, pushed to every node
    assert local.checkpoint_dir == "/var/lib/dscluster/checkpoints"
    assert local.wheelhouse_dir == "/opt/dscluster/wheelhouse"


@pytest.mark.parametrize("value", [True, False, "NFS", "nfs4", "", 1])
def test_bad_storage_kind_names_the_values(value):
    with pytest.raises(DsclusterError, match="one of nfs, lustre, external, none"):
        storage.paths({"dscluster_shared_storage": value})


@pytest.mark.parametrize("value", ["relative/dir", "/", "/with space", "/a,b", "/a:b"])
def test_bad_path_is_refused(value):
    with pytest.raises(DsclusterError, match=r"dscluster_checkpoint_dir .* absolute path"):
        storage.paths({"dscluster_checkpoint_dir": value})


def test_validate_inventory_knows_the_path_set():
    defaults = yaml.safe_load(
        (rolefiles.path("validate_inventory", "defaults/main.yml")).read_text()
    )
    for name in ("dscluster_shared_storage", "dscluster_shared_dir", *storage.PATH_VARS):
        assert name in defaults["validate_inventory_known_vars"]
        assert name in defaults["validate_inventory_cluster_wide_vars"]
    assert defaults["validate_inventory_storage_kinds"] == list(storage.KINDS)


def test_the_secrets_file_is_where_the_rank_wrappers_read_it():
    """deepspeed_launcher writes the job secrets where storage.SOURCE_SECRETS (every rank
    wrapper) reads them, in the directory of the node-local paths."""
    defaults = yaml.safe_load(rolefiles.path("deepspeed_launcher", "defaults/main.yml").read_text())
    assert defaults["deepspeed_launcher_secret_env_file"] == storage.SECRETS_FILE
    assert storage.SECRETS_FILE.startswith(storage.LOCAL_ROOT + "/")

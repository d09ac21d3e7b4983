"""Where things live on the nodes: the shared-storage kind and the one path set.

The inventory holds the answer (`dscluster_shared_storage`, `dscluster_shared_dir` and the
`dscluster_*_dir` path variables, documented in inventories/sample/group_vars/all/storage.yml);
this module turns it into paths with the same defaults the roles use, so the Python layer
(launch, smoke, dsconfig, doctor) and Ansible agree. A unit test renders the roles' defaults
and compares them with `paths()` here.

    kind        what provides dscluster_shared_dir          files a job needs
    nfs         nfs_server on the storage/head node         on shared storage, written once
    lustre      lustre_client on every node                  on shared storage, written once
    external    something else (a docker volume, a site)     on shared storage, written once
    none        nothing: a plain local directory per node    pushed to every node
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DsclusterError

KINDS = ("nfs", "lustre", "external", "none")
DEFAULT_SHARED_DIR = "/shared"
# Node-local places (used when there is no shared storage, and for scratch always).
LOCAL_ROOT = "/var/lib/dscluster"
# Job secrets (dscluster_secret_env) on every node: the training user's alone (0600) in root's
# LOCAL_ROOT, written by deepspeed_launcher and sourced by every rank wrapper.
SECRETS_FILE = f"{LOCAL_ROOT}/secrets.env"
# What a job makes is the training user's alone (SECURITY.md): every rank wrapper and launch.sh
# set it before anything else of the job runs, so logs, checkpoints and reports are 0600/0700.
JOB_UMASK = "umask 077"
SOURCE_SECRETS = f"{JOB_UMASK}; if [ -r {SECRETS_FILE} ]; then . {SECRETS_FILE}; fi"
LOCAL_WHEELHOUSE = "/opt/dscluster/wheelhouse"

PATH_VARS = (
    "dscluster_jobs_dir",
    "dscluster_checkpoint_dir",
    "dscluster_wheelhouse_dir",
    "dscluster_scratch_dir",
)


@dataclass(frozen=True)
class Paths:
    kind: str
    shared_dir: str
    jobs_dir: str
    checkpoint_dir: str
    wheelhouse_dir: str
    scratch_dir: str

    @property
    def shared(self) -> bool:
        """True when the shared directory is one filesystem seen by every node."""
        return self.kind != "none"


def storage_kind(value) -> str:
    """The storage kind of an inventory value; a clear error for anything else."""
    if value is None:
        return "none"
    if isinstance(value, str) and value in KINDS:
        return value
    raise DsclusterError(
        f"dscluster_shared_storage is {value!r}; set it to one of {', '.join(KINDS)} "
        "(nfs: served from the storage/head node; lustre: set lustre_client_*; external: "
        "already mounted at dscluster_shared_dir; none: files are pushed to every node)"
    )


def _path(name: str, value, default: str) -> str:
    if value is None or value == "":
        return default
    text = str(value)
    if not text.startswith("/") or text.rstrip("/") == "" or any(c in text for c in " \t,:"):
        raise DsclusterError(
            f"{name} is {value!r}; it must be an absolute path other than '/', without "
            "spaces, commas or colons — fix it in the inventory"
        )
    return text.rstrip("/")


def paths(variables: dict) -> Paths:
    """The path set from one host's (or the cluster's) variables.

    Defaults: job files and the wheelhouse under `<shared_dir>/dscluster/` on shared storage;
    without it, job files still go to the same path on each node (pushed), the wheelhouse to
    /opt/dscluster/wheelhouse and checkpoints to node-local /var/lib/dscluster/checkpoints
    (DeepSpeed's use_node_local_storage). Scratch (NVMe offload swap) is node-local always.
    """
    kind = storage_kind(variables.get("dscluster_shared_storage"))
    shared_dir = _path(
        "dscluster_shared_dir", variables.get("dscluster_shared_dir"), DEFAULT_SHARED_DIR
    )
    base = f"{shared_dir}/dscluster"
    on_shared = kind != "none"
    return Paths(
        kind=kind,
        shared_dir=shared_dir,
        jobs_dir=_path("dscluster_jobs_dir", variables.get("dscluster_jobs_dir"), f"{base}/jobs"),
        checkpoint_dir=_path(
            "dscluster_checkpoint_dir",
            variables.get("dscluster_checkpoint_dir"),
            f"{base}/checkpoints" if on_shared else f"{LOCAL_ROOT}/checkpoints",
        ),
        wheelhouse_dir=_path(
            "dscluster_wheelhouse_dir",
            variables.get("dscluster_wheelhouse_dir"),
            f"{base}/wheelhouse" if on_shared else LOCAL_WHEELHOUSE,
        ),
        scratch_dir=_path(
            "dscluster_scratch_dir", variables.get("dscluster_scratch_dir"), f"{LOCAL_ROOT}/scratch"
        ),
    )


def inventory_paths(inv) -> Paths:
    """The path set of an inventory, read from its head (these variables are cluster-wide;
    validate_inventory rejects hosts that disagree)."""
    names = ("dscluster_shared_storage", "dscluster_shared_dir", *PATH_VARS)
    return paths({name: inv.var(inv.head, name) for name in names})

"""Where dscluster finds its Ansible collection and where it keeps the user's state.

Three places, each with one rule, none found by walking up from this file:

* the collection `dscluster.cluster` (roles, playbooks): `DSCLUSTER_COLLECTION` if set, else
  the clone an editable install records (`dscluster/_source_tree`), else the copy shipped
  inside this package (`dscluster/_collection/...`, put there when the wheel or sdist is
  built), else an installed one on Ansible's collections path (`ansible-galaxy collection
  install`);
* the node image sources (`docker/node`, `base-image.sh`): shipped beside the collection the
  same way (`dscluster/_docker`), or the clone's `docker/`;
* the user's inventories: `<home>/inventories/<name>`, home being `--home`, else
  `DSCLUSTER_HOME`, else the working directory; caches (keys, known_hosts, wheelhouse, run
  dirs) under `DSCLUSTER_CACHE`, else `$XDG_CACHE_HOME/dscluster`, else `~/.cache/dscluster`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib

import yaml

from .errors import DsclusterError

NAMESPACE = "dscluster"
NAME = "cluster"
FQCN = f"{NAMESPACE}.{NAME}"

_PACKAGE = pathlib.Path(__file__).resolve().parent
# Written by the wheel/sdist build (a copy) or by an editable install (a one-line file naming
# the clone): see python/build_backend.py.
_SHIPPED = _PACKAGE / "_collection" / "ansible_collections" / NAMESPACE / NAME
_SHIPPED_DOCKER = _PACKAGE / "_docker"
_EDITABLE = _PACKAGE / "_source_tree"


def _is_collection(path: pathlib.Path) -> bool:
    return (path / "playbooks" / "site.yml").is_file() and (path / "roles").is_dir()


def _editable_root() -> pathlib.Path | None:
    try:
        text = _EDITABLE.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return pathlib.Path(text) if text else None


def _ansible_collection_paths() -> list[pathlib.Path]:
    """Ansible's own default collections search path, as `ansible-galaxy` installs into it."""
    env = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS")
    if env:
        return [pathlib.Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [
        pathlib.Path("~/.ansible/collections").expanduser(),
        pathlib.Path("/usr/share/ansible/collections"),
    ]


@functools.cache
def collection_root() -> pathlib.Path:
    """The root of the `dscluster.cluster` collection this client drives."""
    env = os.environ.get("DSCLUSTER_COLLECTION")
    if env:
        path = pathlib.Path(env).expanduser().resolve()
        if not _is_collection(path):
            raise DsclusterError(
                f"DSCLUSTER_COLLECTION={env} holds no dscluster collection "
                "(playbooks/site.yml, roles/); point it at one or unset it"
            )
        return path
    # An editable install's clone before the shipped copy: in a clone, the copy exists only
    # while a wheel or sdist is being built from it (build_backend.py stages it in src/ and
    # removes it after), and a command that picked it then lost its files mid-run.
    for cand in (_editable_root(), _SHIPPED):
        if cand is not None and _is_collection(cand):
            return cand.resolve()
    for base in _ansible_collection_paths():
        cand = base / "ansible_collections" / NAMESPACE / NAME
        if _is_collection(cand):
            return cand.resolve()
    raise DsclusterError(
        f"cannot find the {FQCN} collection: reinstall dscluster (pip install dscluster), "
        f"run 'ansible-galaxy collection install {FQCN}', or set DSCLUSTER_COLLECTION to a clone"
    )


def collection_version() -> str:
    """The collection's version from its MANIFEST.json (installed) or galaxy.yml (source)."""
    root = collection_root()
    try:
        manifest = root / "MANIFEST.json"
        if manifest.is_file():
            data = yaml.safe_load(manifest.read_text(encoding="utf-8"))
            return str(data["collection_info"]["version"])
        data = yaml.safe_load((root / "galaxy.yml").read_text(encoding="utf-8"))
        return str(data["version"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return "unknown"


def collections_path() -> pathlib.Path:
    """A directory holding `ansible_collections/dscluster/cluster` for ANSIBLE_COLLECTIONS_PATH.

    An installed or shipped collection already sits in that layout; a clone does not, so a
    symlink to it is kept under the cache (one per clone path)."""
    root = collection_root()
    if root.parent.name == NAMESPACE and root.parent.parent.name == "ansible_collections":
        return root.parent.parent.parent
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    base = cache_dir() / "collections" / digest
    link = base / "ansible_collections" / NAMESPACE / NAME
    if not (link.is_symlink() and link.resolve() == root):
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{NAME}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(root, target_is_directory=True)
        os.replace(tmp, link)
    return base


def playbook(name: str) -> pathlib.Path:
    """playbooks/<name> of the collection."""
    path = collection_root() / "playbooks" / name
    if not path.is_file():
        raise DsclusterError(
            f"playbook {name} is not in the {FQCN} collection at {collection_root()}; "
            "reinstall dscluster"
        )
    return path


def docker_dir() -> pathlib.Path:
    """The node image's build inputs: docker/node and base-image.sh (and docker/bake)."""
    clone = collection_root() / "docker"
    # The clone's own first where this is an editable install (see collection_root).
    order = (clone, _SHIPPED_DOCKER) if _editable_root() else (_SHIPPED_DOCKER, clone)
    for cand in order:
        if (cand / "node").is_dir() and (cand / "base-image.sh").is_file():
            return cand
    raise DsclusterError(
        "cannot find the node image sources (docker/node); reinstall dscluster "
        "or set DSCLUSTER_COLLECTION to a clone"
    )


def home(override: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Where the user's inventories live: --home, else DSCLUSTER_HOME, else the working dir."""
    value = override or os.environ.get("DSCLUSTER_HOME")
    return pathlib.Path(value).expanduser() if value else pathlib.Path.cwd()


def inventory_dir(name: str) -> pathlib.Path:
    """<home>/inventories/<name>: where dscluster writes an inventory it makes."""
    return home() / "inventories" / name


def cache_root() -> pathlib.Path:
    """Where the per-user cache is, made or not (cache_dir() makes it)."""
    base = os.environ.get("DSCLUSTER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dscluster"
    )
    return pathlib.Path(base)


def cache_dir() -> pathlib.Path:
    """Per-user cache outside any clone: keys, known_hosts, wheelhouse, run dirs."""
    path = cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_dir(cluster: str) -> pathlib.Path:
    """Controller-side state of one cluster (bootstrap key, known_hosts, cluster key)."""
    path = cache_dir() / "clusters" / cluster
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path

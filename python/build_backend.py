"""PEP 517 backend: setuptools, plus the collection shipped inside the package.

The `dscluster` wheel carries the `dscluster.cluster` collection it was built with (under
`dscluster/_collection/ansible_collections/dscluster/cluster`) and the node image's build
inputs (`dscluster/_docker`), so `pip install dscluster` gives a client whose roles and
playbooks are exactly the ones it was tested with, with no clone and no Galaxy (which many
clusters cannot reach). Built from a clone (`../galaxy.yml` exists), both are copied in first,
with galaxy.yml's `build_ignore` applied as `ansible-galaxy collection build` applies it; built
from an sdist, they are already inside. An editable install (`pip install -e python`, as
`make venv` does) ships nothing: it records the clone's path in `dscluster/_source_tree`, so
edits to roles take effect at once.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import pathlib
import shutil

import yaml
from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401 - re-exported hooks
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

HERE = pathlib.Path(__file__).resolve().parent
PACKAGE = HERE / "src" / "dscluster"
CLONE = HERE.parent
COLLECTION = PACKAGE / "_collection"
DOCKER = PACKAGE / "_docker"
SOURCE_TREE = PACKAGE / "_source_tree"
# ansible-galaxy's own always-ignored paths (ansible.galaxy.collection's files manifest walk);
# like it, every pattern is matched with fnmatch against the path relative to the root.
GALAXY_IGNORES = ("MANIFEST.json", "FILES.json", "galaxy.yml", "galaxy.yaml", ".git", "*.pyc",
                  "*.retry", "tests/output", "*-*-*.tar.gz")  # fmt: skip
DOCKER_FILES = ("node", "bake", "base-image.sh", "ensure-engine.sh")


def _from_clone() -> bool:
    return (CLONE / "playbooks" / "site.yml").is_file() and (CLONE / "roles").is_dir()


def _ignored(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) for p in patterns)


def _copy_collection() -> None:
    galaxy = yaml.safe_load((CLONE / "galaxy.yml").read_text(encoding="utf-8"))
    patterns = [*GALAXY_IGNORES, *(galaxy.get("build_ignore") or [])]
    dest = COLLECTION / "ansible_collections" / galaxy["namespace"] / galaxy["name"]
    shutil.rmtree(COLLECTION, ignore_errors=True)
    for dirpath, dirnames, filenames in os.walk(CLONE):
        rel_dir = pathlib.Path(dirpath).relative_to(CLONE).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not _ignored(rel_dir + d, patterns))
        for name in sorted(filenames):
            rel = rel_dir + name
            src = pathlib.Path(dirpath) / name
            if _ignored(rel, patterns) or src.is_symlink():
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    # The source form's metadata: paths.collection_version() and `ansible-galaxy collection
    # list` read it.
    shutil.copy2(CLONE / "galaxy.yml", dest / "galaxy.yml")


def _copy_docker() -> None:
    shutil.rmtree(DOCKER, ignore_errors=True)
    for name in DOCKER_FILES:
        src = CLONE / "docker" / name
        if src.is_dir():
            shutil.copytree(src, DOCKER / name)
        else:
            DOCKER.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, DOCKER / name)


@contextlib.contextmanager
def _staged():
    """The collection and docker inputs copied in while building from a clone, and removed
    after, so that the clone's editable install never finds a stale copy in src/.

    The editable install's record of the clone (`_source_tree`) stays where it is: MANIFEST.in
    and pyproject's exclude-package-data keep it out of the sdist and the wheel, and
    paths.collection_root() reads it before the staged copy, so a dscluster command running
    from this clone while a build stages and removes the copy (make test's installed lane
    beside the e2e lanes) keeps the clone's files."""
    if not _from_clone():
        yield
        return
    try:
        _copy_collection()
        _copy_docker()
        yield
    finally:
        shutil.rmtree(COLLECTION, ignore_errors=True)
        shutil.rmtree(DOCKER, ignore_errors=True)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with _staged():
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    with _staged():
        return _setuptools.build_sdist(sdist_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    if _from_clone():
        shutil.rmtree(COLLECTION, ignore_errors=True)
        shutil.rmtree(DOCKER, ignore_errors=True)
        SOURCE_TREE.write_text(str(CLONE) + "\n", encoding="utf-8")
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)

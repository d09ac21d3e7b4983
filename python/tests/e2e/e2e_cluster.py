"""The local container cluster the end-to-end modules share (one per test session).

DSCLUSTER_E2E_NAME names it (default e2e). DSCLUSTER_E2E_REUSE=1 uses an existing,
provisioned cluster of that name as it is (no down/up, nothing removed at the end), for
running one module by hand during development.

DSCLUSTER_E2E_IMAGE_CACHE=1 (make test's e2e-cluster lane) starts the session cluster from
the image test_e2e_bake baked in an earlier run from the same inputs (cache_tag), where
there is one: its provision is then the verify pass and the cluster's own parts instead of
the install from the node image. The second cluster (bake, grow, replace), the installed
package's and the molecule scenarios' nodes still start from the plain node image every
run, so every run also provisions from scratch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys

from dscluster.paths import cache_root

from .. import rolefiles

NAME = os.environ.get("DSCLUSTER_E2E_NAME", "e2e")
REUSE = os.environ.get("DSCLUSTER_E2E_REUSE") == "1"
NODES = 3
USE_IMAGE_CACHE = os.environ.get("DSCLUSTER_E2E_IMAGE_CACHE") == "1"
CACHE_REPO = "dscluster/e2e-cache"
# What a provisioned node is made of, besides the node image and the wheelhouse: a change to
# any file here is a new key (a cold provision, then a new image).
CACHE_INPUTS = (
    "roles", "playbooks", "plugins", "python/src/dscluster", "docker", "ansible.cfg",
    "galaxy.yml", "requirements.yml", "site.yml",
)  # fmt: skip


def dsc(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dscluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def docker(*args: str, timeout: int = 300) -> str:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, check=True, timeout=timeout
    ).stdout


def cache_tag() -> str:
    """dscluster/e2e-cache:<key>, the key hashing CACHE_INPUTS' files, the node image's id and
    each wheelhouse's lock and build record (a wheelhouse built again is a new key)."""
    digest = hashlib.sha256()
    # git's list (tracked, and new files not ignored): not what the build leaves beside them
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
         *CACHE_INPUTS],
        cwd=rolefiles.REPO, capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        path = rolefiles.REPO / name
        digest.update(name.encode() + b"\0")
        digest.update((path.read_bytes() if path.is_file() else b"-") + b"\0")
    node = dsc("image", timeout=900)
    assert node.returncode == 0, node.stderr
    image_id = docker("image", "inspect", "-f", "{{.Id}}", node.stdout.strip().splitlines()[-1])
    digest.update(image_id.strip().encode())
    for lock in sorted((cache_root() / "wheelhouse").glob("*/lock.json")):
        for part in (lock, lock.with_name("build-info.json")):
            digest.update(part.as_posix().encode() + b"\0")
            digest.update(part.read_bytes() if part.is_file() else b"-")
    return f"{CACHE_REPO}:{digest.hexdigest()[:16]}"


@functools.cache
def cached_image() -> str | None:
    """The session cluster's image when USE_IMAGE_CACHE and one for these inputs is here.
    Looked up once per session: the report header and the cluster fixture both ask."""
    if not USE_IMAGE_CACHE:
        return None
    tag = cache_tag()
    found = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    return tag if found.returncode == 0 else None


def keep_as_cache(image: str) -> str:
    """Tag a freshly baked image as the cache for these inputs; other keys' tags are removed
    (their images with them, where nothing else names them). Returns the tag."""
    tag = cache_tag()
    docker("tag", image, tag)
    for old in docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", CACHE_REPO).split():
        if old != tag:  # one a container still runs stays until the next bake
            subprocess.run(["docker", "image", "rm", old], capture_output=True, check=False)
    return tag

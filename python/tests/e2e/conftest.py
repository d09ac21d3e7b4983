"""The end-to-end session's local cluster, and the order its modules run in."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest
import yaml

from .. import rolefiles
from . import cpu_profile
from .e2e_cluster import NAME, NODES, REUSE, USE_IMAGE_CACHE, cached_image, docker, dsc

# Distributions whose version and install time user_stack compares before and after.
STACK = ("torch", "deepspeed", "transformers", "accelerate", "lightning")
_VERSIONS = """
import importlib.metadata as md, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        out[name] = "absent"
        continue
    records = [f for f in dist.files or () if f.name == "RECORD"]
    mtime = dist.locate_file(records[0]).stat().st_mtime_ns if records else 0
    out[name] = f"{dist.version} {mtime}"
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def cluster() -> pathlib.Path:
    """A local cluster of NODES containers, made fresh for the session and removed after it.

    The end-to-end modules share it: test_e2e provisions it, later modules build on that."""
    if REUSE:
        yield rolefiles.REPO / "inventories" / NAME
        return
    dsc("local", "down", "--name", NAME)  # clear what an earlier run may have left
    image = cached_image()
    from_image = ("--image", image) if image else ()
    up = dsc("local", "up", "--name", NAME, "--nodes", str(NODES), *from_image)
    assert up.returncode == 0, up.stderr
    inv = pathlib.Path(up.stdout.split("inventory ")[-1].strip()).parent
    yield inv
    down = dsc("local", "down", "--name", NAME)
    assert down.returncode == 0, down.stderr
    assert docker("ps", "-a", "-q", "--filter", f"label=dscluster.cluster={NAME}") == ""


@pytest.fixture(scope="session")
def first_provision(cluster: pathlib.Path) -> subprocess.CompletedProcess[str]:
    """The session's one full provision (site.yml) of the cluster, run when a test first asks
    for it: test_e2e's test_provision on the shared cluster (it asserts on the run), or the
    first second_cluster module where that session has no test_e2e. Not asserted here."""
    # On a machine with no wheelhouse this provision builds DeepSpeed's ops (up to ≈ 40 min
    # beside the other lanes): 30 min cut it off in a cold `make test` and every later e2e
    # test failed for want of facts.
    return dsc("provision", "-i", str(cluster), timeout=3600)


@pytest.fixture(scope="session")
def provisioned(cluster: pathlib.Path, request: pytest.FixtureRequest) -> pathlib.Path:
    """The session cluster, provisioned: for modules that need the stack and the facts.
    With DSCLUSTER_E2E_REUSE=1 the cluster is taken as provisioned already (no run here)."""
    if REUSE:
        return cluster
    proc = request.getfixturevalue("first_provision")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cluster


def pytest_report_header(config) -> str | None:
    """Which image the session cluster starts from, where make test's lane asks for the cache."""
    if not USE_IMAGE_CACHE or REUSE:
        return None
    image = cached_image()
    return (
        f"e2e cluster: from {image}"
        if image
        else "e2e cluster: no cached image for these inputs; from the node image"
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked `disruptive` (they stop nodes) run after every other test."""
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)


def stack_versions(cluster: pathlib.Path) -> dict[str, dict[str, str]]:
    """host -> distribution -> "version RECORD-mtime" in the cluster venv ("absent" if none)."""
    found = {}
    for i in range(1, NODES + 1):
        host = f"{NAME}-n{i}"
        venv = json.loads((cluster / "facts" / f"{host}.json").read_text())["versions"]["venv"]
        out = subprocess.run(
            ["docker", "exec", f"dsc-{host}", f"{venv}/bin/python", "-c", _VERSIONS, *STACK],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout  # fmt: skip
        found[host] = json.loads(out)
    return found


@pytest.fixture(scope="session")
def user_stack(cluster: pathlib.Path):
    """The example projects' requirements (examples/requirements.txt) added to the provisioned
    cluster as the wheelhouse's user layer: (the provision run, versions before, after).
    Left in place for the rest of the session (test_e2e_slurm's Lightning job uses it)."""
    before = stack_versions(cluster)
    path = cluster / "group_vars" / "all.yml"
    data = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
    data["ml_stack_requirements_file"] = str(rolefiles.REPO / "examples" / "requirements.txt")
    path.parent.mkdir(exist_ok=True)
    path.write_text("---\n" + yaml.safe_dump(data, sort_keys=True))
    # The ml_stack play alone: only the stack changes (the whole site.yml adds ≈ 60 s of
    # zero-change plays on a busy machine; test_e2e covers it)
    proc = dsc("provision", "-i", str(cluster), "--tags", "ml_stack", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    return proc, before, stack_versions(cluster)


_PROFILE = cpu_profile.Profile() if cpu_profile.CLUSTERS else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's CPU (setup, call and teardown), where DSCLUSTER_TEST_CPU asks for it."""
    began = _PROFILE.start() if _PROFILE else None
    yield
    if _PROFILE and began:
        _PROFILE.end(item.nodeid, began, item.stash.get(_BEFORE_TEARDOWN, None))


_BEFORE_TEARDOWN = pytest.StashKey[dict]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """The nodes' counters as the teardown begins: one may take its cluster down."""
    if _PROFILE:
        item.stash[_BEFORE_TEARDOWN] = cpu_profile.node_counters()
    yield


def pytest_terminal_summary(terminalreporter):
    if _PROFILE and (lines := _PROFILE.lines()):
        terminalreporter.section("CPU by test")
        for line in lines:
            terminalreporter.write_line(line)

"""dscluster as a user installs it: the wheel and the collection built from this clone,
installed into a fresh venv and a collections path with no clone anywhere on a path, used
from empty directories: `inventory static`, `local up --nodes 2` -> `provision` -> `smoke`,
and a user's own playbook applying `dscluster.cluster.base` and `.cluster_ssh` by FQCN,
converged twice (the second run changes nothing).

Slow (a venv with Ansible is installed from the package index, two nodes provisioned); needs
a Docker engine. The wheelhouse and node image caches are shared with the other tests.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tarfile
import textwrap

import pytest
import yaml

from .. import rolefiles

# Tests run in file order: static inventory, then on the 2-node cluster the user's own
# playbook first (fresh nodes), then dscluster provision and smoke over it.

pytestmark = [pytest.mark.docker, pytest.mark.installed]

REPO = rolefiles.REPO
NAME = os.environ.get("DSCLUSTER_INSTALLED_NAME", "pipcl")
# What a shell in a clone may carry that would let the installed tool find the clone.
CLONE_VARS = (
    "DSCLUSTER_HOME", "DSCLUSTER_COLLECTION", "ANSIBLE_CONFIG", "ANSIBLE_ROLES_PATH",
    "ANSIBLE_COLLECTIONS_PATH", "PYTHONPATH", "VIRTUAL_ENV", "MAKEFLAGS", "MFLAGS",
)  # fmt: skip


def run(argv, cwd, env, timeout=1800) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Build both artifacts from the clone, install them away from it; return the layout."""
    top = tmp_path_factory.mktemp("installed")
    dist = top / "dist"
    clone_bin = pathlib.Path(sys.executable).parent
    # The sdist, then the wheel built from the sdist: both must carry the collection.
    build = run(
        [sys.executable, "-m", "build", "--outdir", dist, REPO / "python"],
        cwd=top, env=os.environ.copy(), timeout=900,
    )  # fmt: skip
    assert build.returncode == 0, explain(build)
    galaxy = run(
        [clone_bin / "ansible-galaxy", "collection", "build", "--output-path", dist, REPO],
        cwd=top, env=os.environ.copy(), timeout=300,
    )  # fmt: skip
    assert galaxy.returncode == 0, explain(galaxy)
    wheel = next(dist.glob("dscluster-*.whl"))
    assert next(dist.glob("dscluster-*.tar.gz"))
    tarball = next(dist.glob("dscluster-cluster-*.tar.gz"))

    venv = top / "venv"
    made = run([sys.executable, "-m", "venv", venv], cwd=top, env=os.environ.copy())
    assert made.returncode == 0, explain(made)
    # PYTHONDONTWRITEBYTECODE is this machine's, not a user's: without it each process of
    # the installed tool writes the bytecode of what it imports, once
    env = {k: v for k, v in os.environ.items() if k not in (*CLONE_VARS, "PYTHONDONTWRITEBYTECODE")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and str(REPO) not in p]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    # --no-compile: the same files, without pip compiling every module of the ansible package
    # up front (≈ 29 of its 41 CPU-seconds here); what the tests import is compiled on import
    pip = run(
        [venv / "bin" / "pip", "install", "--disable-pip-version-check", "-q", "--no-compile",
         wheel],
        cwd=top, env=env, timeout=1500,
    )  # fmt: skip
    assert pip.returncode == 0, explain(pip)
    collections = top / "collections"
    # --no-deps: the collections it depends on come with the `ansible` package (and Galaxy
    # is out of reach here); requirements.yml lists them for installs without that package.
    # --force: ansible-galaxy installs nothing when any configured path already has this
    # version (molecule's prerun puts one in ~/.ansible/collections), and the test below
    # proves the playbook runs from this path.
    coll = run(
        [venv / "bin" / "ansible-galaxy", "collection", "install", "--no-deps", "--force",
         "-p", collections, tarball],
        cwd=top, env=env, timeout=300,
    )  # fmt: skip
    assert coll.returncode == 0, explain(coll)
    work = top / "work"
    work.mkdir()
    return {
        "top": top, "venv": venv, "env": env, "work": work, "collections": collections,
        "tarball": tarball,
    }  # fmt: skip


def dsc(layout: dict, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    return run(
        [layout["venv"] / "bin" / "dscluster", *args],
        cwd=layout["work"], env=layout["env"], timeout=timeout,
    )  # fmt: skip


def test_nothing_of_the_clone_is_used(installed: dict):
    proc = dsc(installed, "--version")
    assert proc.returncode == 0, explain(proc)
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"dscluster \d+\.\d+\.\d+", lines[0]), lines
    site = installed["venv"] / "lib"
    assert re.fullmatch(
        rf"dscluster\.cluster \d+\.\d+\.\d+ at {re.escape(str(site))}/\S+", lines[1]
    )
    assert str(REPO) not in proc.stdout
    shipped = next(site.glob("python3*/site-packages/dscluster/_collection/ansible_collections"))
    roles = shipped / "dscluster" / "cluster" / "roles"
    assert (roles / "base" / "tasks" / "main.yml").is_file()
    assert not list(shipped.rglob("molecule")), "molecule/ must not be shipped"
    assert not (shipped.parent.parent / "_source_tree").exists()


def test_the_wheel_ships_what_ansible_galaxy_builds(installed: dict):
    """The copy inside the wheel has exactly the files of the collection tarball."""
    site = installed["venv"] / "lib"
    shipped = next(site.glob("python3*/site-packages/dscluster/_collection/ansible_collections"))
    root = shipped / "dscluster" / "cluster"
    # __pycache__ is Python's (what the tool imported from here), not the wheel's.
    in_wheel = {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    with tarfile.open(installed["tarball"]) as tar:
        in_tarball = {m.name for m in tar.getmembers() if m.isfile()}
    in_wheel -= {"galaxy.yml"}  # the source form's metadata; the tarball has MANIFEST.json
    in_tarball -= {"MANIFEST.json", "FILES.json"}
    assert in_wheel == in_tarball, (sorted(in_wheel - in_tarball), sorted(in_tarball - in_wheel))
    assert "inventories/sample/hosts.yml" in in_tarball
    assert not [
        p
        for p in in_tarball
        if p.startswith(("python/", "extensions/molecule/", "docker/", ".ansible/"))
    ]


def test_inventory_static_from_an_empty_directory(installed: dict):
    proc = dsc(installed, "inventory", "static", "--hosts", "gpu-01:4,gpu-02:2", "--name", "lab")
    assert proc.returncode == 0, explain(proc)
    inv = installed["work"] / "inventories" / "lab"
    assert (inv / "hostfile").read_text() == "gpu-01 slots=4\ngpu-02 slots=2\n"
    data = yaml.safe_load((inv / "hosts.yml").read_text())
    assert list(data["all"]["children"]["head"]["hosts"]) == ["gpu-01"]


@pytest.fixture(scope="module")
def pip_cluster(installed: dict):
    dsc(installed, "local", "down", "--name", NAME, timeout=300)  # an earlier run's leftovers
    up = dsc(installed, "local", "up", "--name", NAME, "--nodes", "2", timeout=900)
    assert up.returncode == 0, explain(up)
    inv = installed["work"] / "inventories" / NAME
    assert (inv / "hosts.yml").is_file(), up.stdout
    yield inv
    down = dsc(installed, "local", "down", "--name", NAME, timeout=300)
    assert down.returncode == 0, explain(down)


RECAP = re.compile(
    r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
)


def test_user_playbook_applies_roles_by_fqcn(installed: dict, pip_cluster: pathlib.Path):
    user = installed["top"] / "user"
    user.mkdir()
    (user / "cluster.yml").write_text(
        textwrap.dedent(
            """\
            ---
            - name: My cluster's base, by the collection's role names
              hosts: all
              become: true
              roles:
                - role: dscluster.cluster.base
                - role: dscluster.cluster.cluster_ssh
            """
        )
    )
    env = dict(installed["env"], ANSIBLE_COLLECTIONS_PATH=str(installed["collections"]))
    # The roles come from the collection ansible-galaxy installed, not the wheel's copy.
    listed = run(
        [installed["venv"] / "bin" / "ansible-galaxy", "collection", "list", "dscluster.cluster"],
        cwd=user, env=env, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, explain(listed)
    assert str(installed["collections"]) in listed.stdout, listed.stdout
    argv = [
        installed["venv"] / "bin" / "ansible-playbook", "-i", pip_cluster / "hosts.yml",
        "cluster.yml",
    ]  # fmt: skip
    recaps = []
    for _ in range(2):
        proc = run(argv, cwd=user, env=env, timeout=1200)
        assert proc.returncode == 0, explain(proc)
        recap = {m[0]: tuple(int(x) for x in m[1:]) for m in RECAP.findall(proc.stdout)}
        assert sorted(recap) == [f"{NAME}-n1", f"{NAME}-n2"], proc.stdout[-2000:]
        recaps.append(recap)
    # Fresh nodes (this runs before dscluster provision): the first run changes them.
    assert all(
        ok > 0 and changed > 0 and unreachable == 0 and failed == 0
        for ok, changed, unreachable, failed in recaps[0].values()
    )
    assert {h: r[1] for h, r in recaps[1].items()} == {f"{NAME}-n1": 0, f"{NAME}-n2": 0}, recaps[1]


def test_local_up_provision_smoke(installed: dict, pip_cluster: pathlib.Path):
    prov = dsc(installed, "provision", "-i", f"inventories/{NAME}")
    assert prov.returncode == 0, explain(prov)
    assert "provisioned 2 hosts" in prov.stdout
    smoke = dsc(installed, "smoke", "-i", f"inventories/{NAME}", timeout=1200)
    assert smoke.returncode == 0, explain(smoke)
    assert "2 ranks" in smoke.stdout, smoke.stdout[-2000:]
    assert list((pip_cluster / "reports").glob("*.json")), "smoke wrote no report"

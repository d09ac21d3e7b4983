"""The roles' OS-specific names (issue 58): repository URLs, file names and package names of
nvidia_driver, cuda_toolkit, habana, efa, lustre_client, nfs_client, nfs_server, base, slurm and
ml_stack,
rendered by Ansible for facts recorded on Debian 12, Debian 13, Ubuntu 22.04 and Ubuntu 24.04
(fixtures/os_facts/README.md names each recording), each value checked against the vendor's
published layout named next to it. Debian 12 renders exactly what it rendered before the
names moved into each role's OS table; another OS fails in one preflight line."""

from __future__ import annotations

import json

import pytest

from . import role_render

FIXTURES = role_render.FIXTURES
PLAN = role_render.rolefiles.load_util("ml_stack_plan")
OSES = ["debian12", "debian13", "ubuntu2204", "ubuntu2404"]
# The running kernel of the nodes whose recordings carry none (only the Debian 12 one was
# recorded in full): test inputs, for the kernel-named Lustre module package only.
KERNELS = {
    "debian13": "6.12.48+deb13-amd64",
    "ubuntu2204": "5.15.0-1063-aws",
    "ubuntu2404": "6.8.0-1021-aws",
}
# The python3 each OS ships (its Python facts are not in the recordings), from the distributions'
# package pages: Debian's python3 in bookworm 3.11.2, in trixie 3.13.5 (packages.debian.org);
# Ubuntu's in jammy 3.10.6, in noble 3.12.3 (packages.ubuntu.com). ml_stack's lock is per cpXY.
PYTHONS = {"debian12": (3, 11), "debian13": (3, 13), "ubuntu2204": (3, 10), "ubuntu2404": (3, 12)}
# What each role renders, in the order the play renders them (cuda_toolkit before
# nvidia_driver: it follows nvidia_driver's repository when that role's defaults are loaded).
WANTED = {
    "cuda_toolkit": [
        "cuda_toolkit_repo_url",
        "cuda_toolkit_repo_key_url",
        "cuda_toolkit_repo_key_fingerprints",
        "__cuda_toolkit_repo_file",
        "__cuda_toolkit_keyring",
        "__cuda_toolkit_pins",
    ],
    "nvidia_driver": [
        "nvidia_driver_repo_url",
        "nvidia_driver_repo_key_url",
        "nvidia_driver_repo_key_fingerprints",
        "__nvidia_driver_repos",
        "__nvidia_driver_packages",
        "__nvidia_driver_install_names",
        "__nvidia_driver_all",
        "__nvidia_driver_versioned",
        "__nvidia_driver_pin",
        "__nvidia_driver_dkms_package",
        "__nvidia_driver_kernel_headers",
        "nvidia_driver_version",
    ],
    "habana": [
        "habana_repo_url",
        "habana_repo_key_url",
        "habana_repo_suite",
        "__habana_repo_file",
        "__habana_all_packages",
        "__habana_package_version",
    ],
    "efa": ["__efa_packages"],
    "lustre_client": [
        "lustre_client_repo_url",
        "lustre_client_repo_suite",
        "lustre_client_repo_components",
        "lustre_client_repo_key_url",
        "__lustre_client_list_name",
        "__lustre_client_keyring",
        "__lustre_client_packages",
    ],
    "nfs_client": ["nfs_client_packages"],
    "nfs_server": ["nfs_server_packages", "nfs_server_service"],
    "base": ["base_packages"],
    "slurm": ["slurm_packages", "slurm_controller_packages"],
    # ml_stack's build plan (variant, lock, refusal) is Python's: test_ml_stack_plan.py; its
    # node's OS names come from the rendered table (test_ml_stack_os_names).
    "ml_stack": ["__ml_stack_os_table"],
}
CUDA = "https://developer.download.nvidia.com/compute/cuda/repos"
CODENAMES = {
    "debian12": "bookworm",
    "debian13": "trixie",
    "ubuntu2204": "jammy",
    "ubuntu2404": "noble",
}


def _inputs(name: str) -> dict:
    """The host vars: the facts a recording lacks (its kernel and Python, os_facts_more: set
    with the recorded ones as gathered facts, under ansible_facts), and the role overrides."""
    more: dict = {"ansible_kernel": KERNELS[name]} if name in KERNELS else {}
    if name in PYTHONS:
        major, minor = PYTHONS[name]
        more["ansible_python"] = {"version": {"major": major, "minor": minor}}
        more.setdefault("ansible_architecture", "x86_64")
    overrides = {"ml_stack_build_host": name}
    return {"os_facts_more": more, "os_vars_overrides": overrides}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    """{os: {role: {name: value}}} for the four supported OSes, and "rocky9": the output of its
    run (an unsupported OS, stopped at its first role)."""
    hosts = {name: (name, _inputs(name)) for name in [*OSES, "rocky9"]}
    # Debian 12 again, with the NVIDIA roles' defaults of f8b5e1a (BEFORE_DEFAULTS).
    before = _inputs("debian12")
    before["os_vars_overrides"] = before["os_vars_overrides"] | BEFORE_DEFAULTS
    hosts["debian12_before"] = ("debian12", before)
    result, out = role_render.render(tmp_path_factory.mktemp("os_vars"), hosts, WANTED)
    for name in [*OSES, "debian12_before"]:
        assert set(result.get(name, {})) == set(WANTED), out[-3000:]
    return result | {"rocky9": out}


# The defaults of f8b5e1a that fixtures/os_facts/debian12_rendered_before.json holds: driver branch
# 570 at 570.172.08-1, CUDA 12.8 at 12.8.1-1, NCCL 2.26.2-1+cuda12.8. Since issue 75 the defaults
# are branch 580 and CUDA 13.0; given as overrides, the names must come out as they did then.
BEFORE_DEFAULTS = {
    "nvidia_driver_branch": "570",
    "nvidia_driver_version": "570.172.08-1",
    "cuda_toolkit_version": "12.8",
    "cuda_toolkit_package_version": "12.8.1-1",
    "cuda_toolkit_nccl_version": "2.26.2-1",
}


def test_debian12_renders_what_it_rendered_before_the_os_files(rendered):
    """Recorded with the roles of f8b5e1a (before the OS tables) for the same Debian 12 facts,
    rendered here with that commit's driver and CUDA defaults (BEFORE_DEFAULTS)."""
    before = json.loads((FIXTURES / "debian12_rendered_before.json").read_text())
    for role, values in before.items():
        if role in WANTED:
            assert {k: rendered["debian12_before"][role][k] for k in values} == values, role


def test_an_unsupported_os_fails_in_one_line_naming_the_supported_ones(rendered):
    lines = [line for line in rendered["rocky9"].splitlines() if "runs Rocky Linux" in line]
    assert lines, rendered["rocky9"][-3000:]
    assert (
        "cuda_toolkit: rocky9 runs Rocky Linux 9.3 (Rocky Linux-9); supported: "
        "Debian-12, Debian-13, Ubuntu-22, Ubuntu-24." in lines[0]
    )


# NVIDIA's CUDA repository directories, as NVIDIA publishes them: the "Index of
# /compute/cuda/repos/debian12/x86_64" listing (developer.download.nvidia.com, with 3bf863cc.pub),
# and the ubuntu2204 / ubuntu2404 directories of NVIDIA's CUDA installation guide for Linux
# ("Network Repository Installation": $distro is ubuntu2204, ubuntu2404, debian12).
# debian13: NOT confirmed from NVIDIA's own pages here (no listing of it was reachable); the
# name is the one public Debian 13 setups use (.../repos/debian13/x86_64/cuda-keyring_1.1-1_all.deb,
# several projects found with the code search), and NVIDIA names every repository <id><VERSION_ID>.
CUDA_REPOS = {
    "debian12": "debian12",
    "debian13": "debian13",
    "ubuntu2204": "ubuntu2204",
    "ubuntu2404": "ubuntu2404",
}
# Each repository's signing key there and its primary fingerprint. 3bf863cc: NVIDIA's driver
# installation guide ("GPG Keys Used to Sign the Packages") and the debian12 listing. Debian 13's
# repository is signed by a key of its own, 8793F200 ("Kitmaker (Debian 13 Trixie)
# <kitmaker@nvidia.com>"), which a public Chef recipe pins beside 3bf863cc for Debian 12 and
# Ubuntu 24.04, and a public CI job checks against the debian13 InRelease's signature (both
# found with the code search; NVIDIA's own page for it was not reachable here).
NVIDIA_KEYS = {
    "debian12": ("3bf863cc.pub", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    "debian13": ("8793F200.pub", "02182E60104FCDC26EAE1B8597A5D4CB8793F200"),
    "ubuntu2204": ("3bf863cc.pub", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    "ubuntu2404": ("3bf863cc.pub", "EB693B3035CD5710E231E123A4B469963BF863CC"),
}


@pytest.mark.parametrize("name", OSES)
def test_cuda_repository_and_file_names_follow_nvidias_directories(rendered, name):
    repo = CUDA_REPOS[name]
    key, fingerprint = NVIDIA_KEYS[name]
    for role in ("cuda_toolkit", "nvidia_driver"):
        values = rendered[name][role]
        assert values[f"{role}_repo_url"] == f"{CUDA}/{repo}/x86_64/"
        assert values[f"{role}_repo_key_url"] == f"{CUDA}/{repo}/x86_64/{key}"
        assert values[f"{role}_repo_key_fingerprints"] == [fingerprint]
    # cuda-keyring's own source file name: /etc/apt/sources.list.d/cuda-<repo>-x86_64.list
    assert rendered[name]["cuda_toolkit"]["__cuda_toolkit_repo_file"] == f"cuda-{repo}-x86_64"
    nvidia = rendered[name]["nvidia_driver"]["__nvidia_driver_repos"]["nvidia"]
    assert nvidia["filename"] == f"cuda-{repo}-x86_64" and nvidia["suite"] == "/"
    assert nvidia["keyring"] == "/usr/share/keyrings/cuda-archive-keyring.gpg"
    assert nvidia["key_fingerprints"] == [fingerprint]


# Driver packages in NVIDIA's repository. Debian: NVIDIA repackages Debian's names
# (nvidia-driver, nvidia-kernel-dkms, nvidia-smi, libcuda1, nvidia-persistenced) plus its
# cuda-drivers-<branch> meta, as the debian12 listing shows; debian13 is assumed to keep the
# debian12 names (not confirmed: the Debian 13 setups found install nvidia-open or
# nvidia-driver-cuda, which this role does not use). Ubuntu: NVIDIA's ubuntu2204/ubuntu2404
# repositories carry Ubuntu's per-branch names (a public ubuntu2404 install:
# `apt install nvidia-driver-570=570.124.06-0ubuntu1` from NVIDIA's local repo), hence no
# Debian "-1" revision default there.
DEBIAN_NVIDIA = [
    "cuda-drivers-580",
    "nvidia-driver",
    "nvidia-kernel-dkms",
    "nvidia-smi",
    "libcuda1",
    "nvidia-persistenced",
]
UBUNTU_NVIDIA = [
    "cuda-drivers-580",
    "nvidia-driver-580",
    "nvidia-dkms-580",
    "nvidia-utils-580",
    "libnvidia-compute-580",
    "nvidia-compute-utils-580",
]


@pytest.mark.parametrize(
    ("name", "packages", "version"),
    [
        ("debian12", DEBIAN_NVIDIA, "580.126.20-1"),
        ("debian13", DEBIAN_NVIDIA, ""),
        ("ubuntu2204", UBUNTU_NVIDIA, ""),
        ("ubuntu2404", UBUNTU_NVIDIA, ""),
    ],
)
def test_driver_packages_from_nvidias_repository(rendered, name, packages, version):
    values = rendered[name]["nvidia_driver"]
    assert values["__nvidia_driver_packages"]["nvidia"] == {"versioned": packages, "other": []}
    # the kernel module's package, whose version the handlers compare with the loaded module
    assert values["__nvidia_driver_dkms_package"] == packages[2]
    # NVIDIA's driver installation guide, Debian and Ubuntu: apt install linux-headers-$(uname -r)
    kernel = KERNELS.get(name, "6.18.44-fc-v1252")
    assert values["__nvidia_driver_kernel_headers"] == f"linux-headers-{kernel}"
    assert values["nvidia_driver_version"] == version
    assert values["__nvidia_driver_pin"] == (version or "580.*")
    assert values["__nvidia_driver_install_names"] == (
        [f"{p}={version}" for p in packages] if version else packages
    )


# The default CUDA (issue 75): 13.0, the CUDA of PyPI's own torch build, at 13.0.2-1 (nvcc
# V13.0.88), with NCCL's build for it, libnccl2=2.28.9-1+cuda13.0 (both as public installs pin
# them from NVIDIA's repositories); the same on every OS.
@pytest.mark.parametrize("name", OSES)
def test_cuda_toolkit_pins_cuda_13_0_and_its_nccl_build(rendered, name):
    nccl = "2.28.9-1+cuda13.0"
    assert rendered[name]["cuda_toolkit"]["__cuda_toolkit_pins"] == {
        "cuda-toolkit-13-0": "13.0.2-1",
        "libnccl2": nccl,
        "libnccl-dev": nccl,
    }


# The OS's own driver packages (nvidia_driver_source: distribution).
# Debian: contrib + non-free + non-free-firmware of deb.debian.org (packages.debian.org:
# nvidia-driver, nvidia-kernel-dkms, nvidia-smi, libcuda1 in non-free; nvidia-persistenced in
# contrib; bookworm 535.x, trixie 550.163.01).
# Ubuntu: restricted of archive.ubuntu.com, each branch updated in <codename>-updates
# (packages.ubuntu.com: source nvidia-graphics-drivers-570 builds libnvidia-extra-570
# 570.211.01-0ubuntu1.24.04.1 in noble-updates [restricted]; nvidia-utils-470,
# libnvidia-compute-470 and nvidia-compute-utils-470 in jammy and noble [restricted], the last
# one carrying nvidia-persistenced; nvidia-dkms-<branch> as apt names it in
# "nvidia-dkms-535 : Depends: nvidia-kernel-common-535").
DEBIAN_ARCHIVE = {
    "url": "http://deb.debian.org/debian",
    "components": ["contrib", "non-free", "non-free-firmware"],
    "packages": {
        "versioned": ["nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1"],
        "other": ["nvidia-persistenced"],
    },
}
UBUNTU_ARCHIVE = {
    "url": "http://archive.ubuntu.com/ubuntu",
    "components": ["restricted"],
    "packages": {"versioned": UBUNTU_NVIDIA[1:], "other": []},
}


@pytest.mark.parametrize(
    ("name", "suite", "archive"),
    [
        ("debian12", "bookworm", DEBIAN_ARCHIVE),
        ("debian13", "trixie", DEBIAN_ARCHIVE),
        ("ubuntu2204", "jammy-updates", UBUNTU_ARCHIVE),
        ("ubuntu2404", "noble-updates", UBUNTU_ARCHIVE),
    ],
)
def test_driver_packages_from_the_os_archive(rendered, name, suite, archive):
    values = rendered[name]["nvidia_driver"]
    repo = values["__nvidia_driver_repos"]["distribution"]
    assert (repo["url"], repo["suite"], repo["components"]) == (
        archive["url"],
        suite,
        archive["components"],
    )
    assert repo["keyring"] == "" and repo["key_fingerprints"] == []
    assert values["__nvidia_driver_packages"]["distribution"] == archive["packages"]


# Habana's vault (vault.habana.ai/artifactory/debian): habanalabs-installer.sh and Intel Gaudi's
# "Installation Guide" write `deb https://vault.habana.ai/artifactory/debian <codename> main`;
# its source file is /etc/apt/sources.list.d/artifactory.list. The support matrices of
# SynapseAI 1.21/1.22 list Ubuntu 22.04 and 24.04 (jammy, noble); the Debian suites follow
# the same scheme but are NOT confirmed to exist on the vault.
@pytest.mark.parametrize(("name", "suite"), CODENAMES.items())
def test_habana_vault_suite_is_the_codename(rendered, name, suite):
    values = rendered[name]["habana"]
    assert values["habana_repo_url"] == "https://vault.habana.ai/artifactory/debian"
    assert values["habana_repo_key_url"] == "https://vault.habana.ai/artifactory/api/gpg/key/public"
    assert values["habana_repo_suite"] == suite
    assert values["__habana_repo_file"] == "artifactory"
    assert values["__habana_all_packages"] == [
        "habanalabs-firmware",
        "habanalabs-dkms",
        "habanalabs-firmware-tools",
        "habanalabs-thunk",
        "habanalabs-graph",
        "habanalabs-rdma-core",
        "habanalabs-qual",
    ]


# AWS's "Installing the Lustre client" (FSx for Lustre user guide), Ubuntu 22.04 and 24.04:
# key fsx-ubuntu-public-key.asc in /usr/share/keyrings, source
# /etc/apt/sources.list.d/fsxlustreclientrepo.list with
# "https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu <codename> main", packages
# lustre-client-utils and lustre-client-modules-$(uname -r). FSx has no Debian suite: a Debian
# node asks for its own codename and preflight's repository read refuses it, as before.
@pytest.mark.parametrize(("name", "suite"), CODENAMES.items())
def test_fsx_lustre_suites_are_ubuntu_codenames(rendered, name, suite):
    values = rendered[name]["lustre_client"]
    kernel = KERNELS.get(name, "6.18.44-fc-v1252")
    assert (
        values["lustre_client_repo_url"] == "https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu"
    )
    assert (values["lustre_client_repo_suite"], values["lustre_client_repo_components"]) == (
        suite,
        ["main"],
    )
    assert values["lustre_client_repo_key_url"] == (
        "https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc"
    )
    assert values["__lustre_client_list_name"] == "fsxlustreclientrepo"
    assert values["__lustre_client_keyring"] == "/usr/share/keyrings/fsx-ubuntu-public-key.asc"
    assert values["__lustre_client_packages"] == [
        "lustre-client-utils",
        f"lustre-client-modules-{kernel}",
    ]


# The same names in all four archives. Checked here: packages.ubuntu.com/noble/slurm-wlm
# (23.11.4, universe; depends on slurm-client, slurmctld, slurmd; slurmd depends on munge) and
# packages.debian.org/src:slurm-wlm (bookworm 22.05.8: slurm-client, slurmctld, slurmd among
# its binaries). From the Debian and Ubuntu package indexes, not re-checked here: nfs-common
# and nfs-kernel-server (source nfs-utils; nfs-kernel-server ships nfs-server.service), the
# jammy (21.08) and trixie (24.11) Slurm, gpg, gpgv, python3, tar, gzip, and base's list
# (build-essential, python3-dev, python3-venv, libaio-dev, ninja-build, chrony, iproute2,
# rsync, acl, pciutils, openmpi-bin; on Ubuntu ninja-build, openmpi-bin and Slurm are in
# universe).
BASE = [
    "build-essential",
    "python3-dev",
    "python3-venv",
    "libaio-dev",
    "ninja-build",
    "chrony",
    "iproute2",
    "rsync",
    "acl",
    "pciutils",
    "openmpi-bin",
]


@pytest.mark.parametrize("name", OSES)
def test_archive_package_and_service_names(rendered, name):
    values = rendered[name]
    assert values["nfs_client"]["nfs_client_packages"] == ["nfs-common"]
    assert values["nfs_server"] == {
        "nfs_server_packages": ["nfs-kernel-server"],
        "nfs_server_service": "nfs-server",
    }
    assert values["slurm"] == {
        "slurm_packages": ["munge", "slurmd", "slurm-client"],
        "slurm_controller_packages": ["slurmctld"],
    }
    assert values["efa"]["__efa_packages"] == ["gpg", "gpgv", "python3", "tar", "gzip"]
    assert values["base"]["base_packages"] == BASE


# Habana's OS names: its vault's gaudi-pt-modules paths and the compatibility table
# (ml_stack_habana_compat's "os" lists: ubuntu22.04, ubuntu24.04), as Intel's Gaudi support
# matrix names them; Debian's have no pytorch_modules build there, so Gaudi refuses them.
HABANA_OS = {
    "debian12": "debian12",
    "debian13": "debian13",
    "ubuntu2204": "ubuntu22.04",
    "ubuntu2404": "ubuntu24.04",
}


@pytest.mark.parametrize("name", OSES)
def test_ml_stack_os_names(rendered, name):
    """The node's OS key (from its recorded facts) is in the rendered table, and the plan's
    node_of (plugins/module_utils/ml_stack_plan.py) names Habana's OS from them."""
    table = rendered[name]["ml_stack"]["__ml_stack_os_table"]
    key = {"debian12": "Debian-12", "debian13": "Debian-13", "ubuntu2204": "Ubuntu-22"}
    assert key.get(name, "Ubuntu-24") in table
    recorded = json.loads((FIXTURES / f"{name}.json").read_text())["ansible_facts"]
    facts = {k.removeprefix("ansible_"): v for k, v in recorded.items() if "distribution" in k}
    node = PLAN.node_of(facts, {"__ml_stack_os_table": table})
    assert node["node_habana_os"] == HABANA_OS[name]


def test_ml_stack_habana_names_are_the_compat_tables():
    """Every OS the Gaudi compatibility table lists is one the OS table names."""
    defaults = role_render.yaml.safe_load(
        (role_render.rolefiles.ROLES / "ml_stack" / "defaults" / "main.yml").read_text()
    )
    listed = {os for build in defaults["ml_stack_habana_compat"].values() for os in build["os"]}
    assert listed <= set(HABANA_OS.values())
    assert {HABANA_OS["ubuntu2204"], HABANA_OS["ubuntu2404"]} <= listed

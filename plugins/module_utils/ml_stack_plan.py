"""ml_stack's build plan: which torch and DeepSpeed build a cluster gets, from the build host's
facts and the role's variables, and why a node cannot run it.

The plan (what vars/main.yml derived in Jinja until issue 75) decides the accelerator, the
torch variant and spec, the wheelhouse key and path, the base layer's lock and refusal, the
controller's download arguments, the build environment and the user layer's key. The
ml_stack_plan action (plugins/action) calls plan() once per host, on the controller; the
role's tasks read the result as __ml_stack_plan. Pure: no Ansible, no network; it reads only
the lock and requirements files the inventory names (their content is part of the keys).

Every key a wheelhouse was built under before is kept byte for byte: the unit test feeds the
cases recorded from the Jinja (tests/unit/fixtures/ml_stack_plan) through plan().
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# The role variables the plan reads (the action passes exactly these).
OPTIONS = (
    "ml_stack_accelerator",
    "ml_stack_torch_variant",
    "ml_stack_torch_version",
    "ml_stack_deepspeed_version",
    "ml_stack_deepspeed_requirements",
    "ml_stack_deepspeed_prebuilt_ops",
    "ml_stack_deepspeed_build_env",
    "ml_stack_cuda_version",
    "ml_stack_torch_cuda_variants",
    "ml_stack_torch_index_url",
    "ml_stack_cuda_arch_list",
    "ml_stack_cuda_requirements",
    "ml_stack_pypi_torch_cuda",
    "ml_stack_habana_synapseai_version",
    "ml_stack_habana_compat",
    "ml_stack_habana_pytorch_modules_sha256",
    "ml_stack_habana_deepspeed_commit",
    "ml_stack_habana_deepspeed_sha256",
    "ml_stack_controller_wheelhouse",
    "ml_stack_controller_user_wheelhouse",
    "ml_stack_base_lock_file",
    "ml_stack_platform_tags",
    "ml_stack_pip_download_args",
    "ml_stack_build_early",
    "ml_stack_extra_requirements",
    "ml_stack_requirements_file",
    "ml_stack_uv_compile_args",
)

_CUDA_RELEASE = re.compile(r"^(\d+\.\d+).*$")
_SYNAPSEAI_RELEASE = re.compile(r"^(\d+\.\d+\.\d+).*$")
_INDEXED_VARIANT = re.compile(r"^(cpu|cu[0-9]+)$")
_CUDA_VARIANT = re.compile(r"^cu(\d+)(\d)$")
# The variants each accelerator kind runs (PyPI's own torch runs on CUDA and on CPU nodes).
_VARIANTS_OF = {"cuda": r"^(cu[0-9]+|pypi)$", "cpu": r"^(cpu|pypi)$", "hpu": r"^hpu$"}


class PlanError(ValueError):
    """An input the plan cannot be made from (a missing fact, an unreadable file)."""


def _release(value: Any, pattern: re.Pattern) -> str:
    """The X.Y (or X.Y.Z) a version string starts with, as the Jinja's regex_replace made it."""
    return pattern.sub(r"\1", str(value))


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8"), usedforsecurity=False).hexdigest()


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as err:
        raise PlanError(err.strerror or str(err)) from err


def _controller_file(name: str, value: Any, read_text: Callable[[str], str]) -> tuple[str, str]:
    """(path, content) of a file the inventory names on the controller; ('', '') when unset."""
    path = os.path.expanduser(str(value or ""))
    if not path:
        return "", ""
    if not path.startswith("/"):
        raise PlanError(
            f"{name}={value} is not an absolute path on the controller (~ allowed); "
            "point it at the file, or set it to ''."
        )
    try:
        return path, read_text(path)
    except PlanError as err:
        raise PlanError(
            f"{name}={value} is not a file the controller can read ({err}); "
            "point it at the file, or set it to ''."
        ) from err


def _nocase(item: Any) -> Any:
    """Jinja's sort key for sort and dictsort (case_sensitive=False): strings lower-cased."""
    return item.lower() if isinstance(item, str) else item


def _nocase_sorted(items: Sequence[Any]) -> list:
    return sorted(items, key=_nocase)


def torch_cuda(variant: str, options: Mapping[str, Any]) -> str:
    """The CUDA release a torch variant is built for ('' for cpu, hpu and an unknown one):
    cu128 -> 12.8; pypi -> ml_stack_pypi_torch_cuda (PyPI's own build of the pinned torch)."""
    if variant == "pypi":
        return str(options.get("ml_stack_pypi_torch_cuda") or "")
    match = _CUDA_VARIANT.match(variant)
    return f"{match.group(1)}.{match.group(2)}" if match else ""


def cuda_needs(cuda: str, options: Mapping[str, Any]) -> dict:
    """{'driver_branch': int, 'compute_capability': 'X.Y'} a CUDA release runs with (its major's
    row of ml_stack_cuda_requirements); {} when the table has none."""
    row = (
        (options.get("ml_stack_cuda_requirements") or {}).get(cuda.split(".", maxsplit=1)[0])
        if cuda
        else None
    )
    if not row:
        return {}
    return {
        "driver_branch": int(row["driver_branch"]),
        "compute_capability": str(row["compute_capability"]),
    }


def _capability(value: str) -> tuple[int, int]:
    major, _, minor = str(value).partition(".")
    return int(major), int(minor or 0)


def _habana(synapseai: str, options: Mapping[str, Any]) -> dict:
    """The compatibility table's entry for this SynapseAI with the checksums and the fork's
    commit (the inventory's ml_stack_habana_* first), and the fork's archive at that commit."""
    opt = options.get
    entry = dict((opt("ml_stack_habana_compat") or {}).get(synapseai) or {})
    commit = opt("ml_stack_habana_deepspeed_commit") or entry.get("deepspeed_commit", "")
    return entry | {
        "pytorch_modules_sha256": opt("ml_stack_habana_pytorch_modules_sha256")
        or entry.get("pytorch_modules_sha256", ""),
        "deepspeed_commit": commit,
        "deepspeed_sha256": opt("ml_stack_habana_deepspeed_sha256")
        or entry.get("deepspeed_sha256", ""),
        "deepspeed_source_url": f"https://github.com/HabanaAI/DeepSpeed/archive/{commit}.tar.gz",
    }


def _habana_os(facts: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """The OS's name in Habana's tables (__ml_stack_os_table; Debian 12's for one not in it)."""
    os_table = options.get("__ml_stack_os_table") or {}
    os_key = f"{facts.get('distribution', '')}-{facts.get('distribution_major_version', '')}"
    return str((os_table.get(os_key) or os_table.get("Debian-12") or {}).get("habana_os", ""))


def _user_hash(key: str, options: Mapping[str, Any], requirements: str) -> str:
    """The user layer's key: the base key and every input of its resolution (the requirements
    file's content, not its path), joined by a backslash and an n as the Jinja's '\\n' in a
    YAML block scalar was."""
    opt = options.get
    inputs = [
        key,
        *(opt("ml_stack_extra_requirements") or []),
        "--requirements-file",
        requirements,
        "--uv",
        *(opt("ml_stack_uv_compile_args") or []),
        "--pip",
        *(opt("ml_stack_pip_download_args") or []),
    ]
    return _sha1("\\n".join(str(item) for item in inputs))[:8]


def _accel_build_env(accelerator: str, cuda_version: str, options: Mapping[str, Any]) -> dict:
    """The build's environment for its accelerator. DeepSpeed's ops are built for the planned
    accelerator, not the one DeepSpeed detects on the build host: without a visible GPU it
    detects the CPU and builds CPU ops for a CUDA wheelhouse (seen: a CUDA build without a GPU,
    accelerator_name 'cpu' in the wheel). Gaudi's fork is left to detect its own (its override
    imports Habana's runtime). CUDA ops: the architectures and cuda_toolkit's toolkit."""
    named = {"DS_ACCELERATOR": accelerator} if accelerator in ("cpu", "cuda") else {}
    if accelerator != "cuda":
        return named
    return named | {
        "TORCH_CUDA_ARCH_LIST": options.get("ml_stack_cuda_arch_list"),
        "CUDA_HOME": f"/usr/local/cuda-{cuda_version}",
    }


def _cpu_model(facts: Mapping[str, Any]) -> str:
    """The build host's CPU model (its ops are compiled with -march=native): the processor
    fact's third item, as the Jinja's `processor[2] | default('unknown-cpu')` read it."""
    processor = facts.get("processor")
    if isinstance(processor, Sequence) and not isinstance(processor, str) and len(processor) > 2:
        return str(processor[2])
    return "unknown-cpu"


def _prefixed(flag: str, values: Sequence[Any] | None) -> list[str]:
    return [f"{flag}{value}" for value in values or []]


def _argvs(
    built: Mapping[str, Any], options: Mapping[str, Any], role_path: str, python: str
) -> dict:
    """The controller's commands on the layers (files/hash_wheels.py, files/user_layer.py), as
    the tasks run them: the locked download, the check of the wheelhouse against its locks
    (the task adds --lock-json where it checks lock.json too), the user layer's resolution."""
    files = f"{role_path}/files"
    wheelhouse, hpu = built["wheelhouse"], built["variant"] == "hpu"
    download = [python, f"{files}/hash_wheels.py", "download", "--lock", built["base_lock"]]
    download += ["--dest", wheelhouse, "--exclude", "deepspeed"]
    download += [f"--index-for=torch={built['torch_index']}"] if built["torch_index"] else []
    download += [*_prefixed("--require=", built["base_requirements"]), "--"]
    verify = [python, f"{files}/hash_wheels.py", "verify", wheelhouse]
    verify += ["--built", built["ds_wheel_glob"]]
    if built["base_locked"] or hpu:
        verify += ["--sdist", f"{wheelhouse}/src/{built['sdist']}"]
    verify += ["--lock", built["base_lock"]] if built["base_locked"] else []
    verify += ["--sdist-sha256", built["habana"].get("deepspeed_sha256", "")] if hpu else []
    user = [python, f"{files}/user_layer.py", "--base", wheelhouse]
    user += ["--out", built["user_wheelhouse"], "--key", built["user_key"]]
    user += ["--python-version", built["pyver"], "--python-platform", built["uv_platform"]]
    user += _prefixed("--platform=", options.get("ml_stack_platform_tags"))
    user += _prefixed("--requirement=", options.get("ml_stack_extra_requirements"))
    if built["requirements_file"]:
        user += ["--requirements-file", built["requirements_file"]]
    user += _prefixed("--uv-arg=", options.get("ml_stack_uv_compile_args"))
    user += _prefixed("--pip-arg=", options.get("ml_stack_pip_download_args"))
    return {
        "locked_download_argv": download + list(built["pip_download_argv"]),
        "verify_argv": verify,
        "user_layer_argv": user,
    }


def plan(
    facts: Mapping[str, Any],
    options: Mapping[str, Any],
    *,
    role_path: str,
    python: str,
    read_text: Callable[[str], str] = _read_text,
    is_file: Callable[[str], bool] = os.path.isfile,
) -> dict:
    """The build plan for the build host's facts (ansible_facts' names: python, architecture,
    processor, distribution, distribution_major_version, 'ansible_local' with accelerators,
    nvidia, habana) and the role's variables (OPTIONS, plus __ml_stack_os_table). python: the
    controller's interpreter (the download's argv[0]); role_path: where the shipped locks are."""
    try:
        version = facts["python"]["version"]
        pytag = f"{version['major']}{version['minor']}"
        pyver = f"{version['major']}.{version['minor']}"
        arch = str(facts["architecture"])
    except (KeyError, TypeError) as err:
        raise PlanError(f"the build host's facts lack {err} (python, architecture)") from err
    local = facts.get("ansible_local") or {}
    accelerators = local.get("accelerators") or {}
    opt = options.get

    accelerator = (
        accelerators.get("kind", "cpu")
        if opt("ml_stack_accelerator") == "auto"
        else opt("ml_stack_accelerator")
    )
    # The CUDA the build host has (cuda_toolkit's nvidia fact), else the configured one.
    cuda_version = _release(
        (local.get("nvidia") or {}).get("cuda") or opt("ml_stack_cuda_version"),
        _CUDA_RELEASE,
    )
    synapseai = _release(
        (local.get("habana") or {}).get("synapseai") or opt("ml_stack_habana_synapseai_version"),
        _SYNAPSEAI_RELEASE,
    )
    habana = _habana(synapseai, options)

    variant = opt("ml_stack_torch_variant")
    if variant == "auto":
        if accelerator in ("cpu", "hpu"):
            variant = accelerator
        else:
            variant = (opt("ml_stack_torch_cuda_variants") or {}).get(cuda_version, "none")
    hpu = variant == "hpu"
    torch_version = habana.get("torch", "none") if hpu else opt("ml_stack_torch_version")
    label = "" if variant in ("hpu", "pypi") else f"+{variant}"
    torch_spec = f"torch=={torch_version}{label}"
    deepspeed_version = (
        habana.get("deepspeed_version", "none") if hpu else opt("ml_stack_deepspeed_version")
    )
    accel_requirements = list(habana.get("requirements", [])) if hpu else []
    ops = dict((opt("ml_stack_deepspeed_prebuilt_ops") or {}).get(accelerator) or {})
    # PyTorch's index of the cpu and CUDA builds (torch==X+cpu is not on PyPI).
    torch_index = (
        f"{opt('ml_stack_torch_index_url')}/{variant}" if _INDEXED_VARIANT.match(variant) else ""
    )
    habana_os = _habana_os(facts, options)
    accel_build_env = _accel_build_env(accelerator, cuda_version, options)

    # The base layer's key: only what changes DeepSpeed's build or which torch it is, and a
    # lock of the user's own. (Joined and hashed as the Jinja did: keys built before stay.)
    build_env = (opt("ml_stack_deepspeed_build_env") or {}).get(accelerator) or {}
    cpu_model = _cpu_model(facts)
    lock_file, lock_text = _controller_file(
        "ml_stack_base_lock_file", opt("ml_stack_base_lock_file"), read_text
    )
    inputs = (
        [
            torch_spec,
            *accel_requirements,
            *(opt("ml_stack_deepspeed_requirements") or []),
        ]
        + _nocase_sorted(list(ops))
        + [f"{k}={v}" for k, v in sorted(build_env.items(), key=lambda kv: _nocase(kv[0]))]
        + [cpu_model]
        + ([f"lock={_sha1(lock_text)}"] if lock_file else [])
    )
    inputs_hash = _sha1(",".join(str(item) for item in inputs))[:8]
    key = f"{variant}-torch{torch_version}-ds{deepspeed_version}-cp{pytag}-{arch}-{inputs_hash}"
    wheelhouse = f"{opt('ml_stack_controller_wheelhouse')}/{key}"

    lock_name = f"{variant}-torch{torch_version}-ds{deepspeed_version}-cp{pytag}-{arch}.txt"
    base_lock = lock_file or f"{role_path}/files/locks/{lock_name}"
    refusal_lock = (
        f"No hash lock {base_lock} for {torch_spec} and DeepSpeed {deepspeed_version} "
        f"(cp{pytag}): make one on the controller with `dscluster lock --variant {variant} "
        f"--python {pyver} --arch {arch}` and set ml_stack_base_lock_file to it, or set "
        "ml_stack_trust_first_download: true."
    )
    tags = [str(tag) for tag in opt("ml_stack_platform_tags") or []]
    manylinux = [tag for tag in tags if tag.startswith("manylinux_")]

    requirements_file, requirements = _controller_file(
        "ml_stack_requirements_file", opt("ml_stack_requirements_file"), read_text
    )
    extra = list(opt("ml_stack_extra_requirements") or [])
    user_hash = _user_hash(key, options, requirements)
    cuda = torch_cuda(variant, options) if accelerator == "cuda" else ""

    built = {
        "pytag": pytag,
        "pyver": pyver,
        "architecture": arch,
        "accelerator": accelerator,
        "cuda_version": cuda_version,
        "synapseai_version": synapseai,
        "habana": habana,
        "habana_os": habana_os,
        "variant": variant,
        "torch_version": torch_version,
        "torch_spec": torch_spec,
        "torch_cuda": cuda,
        "cuda_needs": cuda_needs(cuda, options),
        "deepspeed_version": deepspeed_version,
        "accel_requirements": accel_requirements,
        "ops": ops,
        "torch_index": torch_index,
        "torch_source_args": (["--find-links", f"{wheelhouse}/src/pytorch_modules"] if hpu else []),
        "accel_build_env": accel_build_env,
        "inputs_hash": inputs_hash,
        "key": key,
        "wheelhouse": wheelhouse,
        "sdist": (
            f"deepspeed-habana-{synapseai}.tar.gz"
            if hpu
            else f"deepspeed-{opt('ml_stack_deepspeed_version')}.tar.gz"
        ),
        "ds_wheel_glob": f"deepspeed-{deepspeed_version}*.whl",
        "lock_name": lock_name,
        "base_lock": base_lock,
        "base_locked": is_file(base_lock),
        "base_lock_refusal": refusal_lock,
        "base_requirements": [
            torch_spec,
            "setuptools",
            "wheel",
            *accel_requirements,
            *(opt("ml_stack_deepspeed_requirements") or []),
        ],
        "pip_download_argv": [
            python,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--quiet",
            "--dest",
            wheelhouse,
            "--only-binary=:all:",
            "--implementation",
            "cp",
            "--python-version",
            pyver,
            "--abi",
            f"cp{pytag}",
            *(f"--platform={tag}" for tag in tags),
            *(opt("ml_stack_pip_download_args") or []),
            *(["--find-links", f"{wheelhouse}/src/pytorch_modules"] if hpu else []),
        ],
        # Only a CPU build needs nothing the accelerators play installs (its toolchain is base's).
        "build_early": bool(opt("ml_stack_build_early")) and accelerator == "cpu",
        "requirements_file": requirements_file,
        "user_layer": bool(extra) or bool(requirements_file),
        "user_hash": user_hash,
        "user_key": f"user-{user_hash}",
        "user_wheelhouse": f"{opt('ml_stack_controller_user_wheelhouse')}/{key}/{user_hash}",
        # uv's platform for the nodes: the first (newest) manylinux tag the downloads take.
        "uv_platform": (
            f"{arch}-{re.sub('_' + re.escape(arch) + '$', '', manylinux[0])}" if manylinux else ""
        ),
    }
    return built | _argvs(built, options, role_path, python)


def _older_variant(options: Mapping[str, Any], fits: Callable[[dict], bool]) -> str:
    """The newest CUDA variant of ml_stack_torch_cuda_variants whose CUDA fits ('' if none)."""
    found = []
    for release, name in (options.get("ml_stack_torch_cuda_variants") or {}).items():
        needs = cuda_needs(torch_cuda(str(name), options), options)
        if _CUDA_VARIANT.match(str(name)) and needs and fits(needs):
            found.append((_capability(str(release)), str(name)))
    return max(found)[1] if found else ""


def node_refusal(
    built: Mapping[str, Any], node: Mapping[str, Any], options: Mapping[str, Any]
) -> str:
    """One line when this node cannot run the planned build, '' when it can. node: its name
    (host), its NVIDIA fact (nvidia: driver, compute_caps) and its GPUs' names (models)."""
    host = node.get("host", "")
    accelerator, variant = built["accelerator"], built["variant"]
    if variant == "none" or not re.match(_VARIANTS_OF.get(accelerator, ".*"), variant):
        cuda = f" with CUDA {built['cuda_version']}" if accelerator == "cuda" else ""
        listed = ", ".join(str(k) for k in (options.get("ml_stack_torch_cuda_variants") or {}))
        return (
            f"No torch wheel variant for {accelerator}{cuda} (ml_stack_torch_variant="
            f"{options.get('ml_stack_torch_variant')}); CUDA versions with a variant: {listed}. "
            "Install one of those with cuda_toolkit, or add the variant to "
            "ml_stack_torch_cuda_variants."
        )
    needs = built.get("cuda_needs") or {}
    if built["accelerator"] != "cuda" or not needs:
        return ""
    nvidia = node.get("nvidia") or {}
    build = f"{built['torch_spec']} ({built['variant']}: CUDA {built['torch_cuda']})"
    how = (
        "make a lock for it with `dscluster lock --variant {v} --python "
        f"{built['pyver']} --arch {built['architecture']}`, then set ml_stack_base_lock_file to "
        'it, ml_stack_torch_variant: {v} and cuda_toolkit_version: "{c}"'
    )
    driver = str(nvidia.get("driver") or "")
    branch = driver.split(".", maxsplit=1)[0]
    if branch.isdigit() and int(branch) < needs["driver_branch"]:
        older = _older_variant(options, lambda n: n["driver_branch"] <= int(branch))
        way = how.format(v=older, c=torch_cuda(older, options))
        other = f"; or keep it and take an older CUDA: {way}" if older else ""
        return (
            f"{host} runs NVIDIA driver {driver}; {build} needs driver branch "
            f"{needs['driver_branch']} or newer: set nvidia_driver_branch: "
            f'"{needs["driver_branch"]}" (nvidia_driver_keep_installed: false) to install it'
            f"{other}."
        )
    caps = [
        str(cap) for cap in nvidia.get("compute_caps") or [] if re.match(r"^\d+\.\d+$", str(cap))
    ]
    floor = needs["compute_capability"]
    if caps and min(map(_capability, caps)) < _capability(floor):
        oldest = min(caps, key=_capability)
        models = ", ".join(node.get("models") or []) or "a GPU"
        older = _older_variant(
            options,
            lambda n: _capability(n["compute_capability"]) <= _capability(oldest),
        )
        other = f": {how.format(v=older, c=torch_cuda(older, options))}" if older else ""
        return (
            f"{host} has {models} (compute capability {oldest}); {build} runs on compute "
            f"capability {floor} and newer, so this GPU needs an older CUDA{other}."
        )
    return ""


def node_of(facts: Mapping[str, Any], options: Mapping[str, Any]) -> dict:
    """What preflight.yml compares with the plan, of this node's own facts: its Python (X.Y),
    its SynapseAI release (the habana fact, else the configured one), its OS's name in
    Habana's tables (__ml_stack_os_table; Debian 12's for an OS not in it) and the OSes
    ml_stack_habana_compat lists for that release (None where it has no entry)."""
    version = (facts.get("python") or {}).get("version") or {}
    local = facts.get("ansible_local") or {}
    synapseai = (local.get("habana") or {}).get("synapseai") or options.get(
        "ml_stack_habana_synapseai_version"
    )
    release = _release(synapseai, _SYNAPSEAI_RELEASE)
    compat = options.get("ml_stack_habana_compat") or {}
    return {
        "node_pyver": f"{version.get('major')}.{version.get('minor')}",
        "node_synapseai": release,
        "node_habana_compat_os": (
            ", ".join(str(name) for name in compat[release].get("os") or [])
            if release in compat
            else None
        ),
        "node_habana_os": _habana_os(facts, options),
    }

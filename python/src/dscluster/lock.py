"""`dscluster lock`: the base layer's hash lock for one torch variant, Python and platform.

ml_stack downloads the base layer (torch, DeepSpeed's sdist and their requirements) only
against a hash lock (`ml_stack_base_lock_file`, or the one shipped in
roles/ml_stack/files/locks/ under the same name). This writes that file with exactly the
requirement set ml_stack downloads (the role's defaults: `ml_stack_torch_version`,
`ml_stack_deepspeed_version`, `ml_stack_deepspeed_requirements`, plus setuptools and wheel),
resolved by `uv pip compile --generate-hashes` for the nodes' platform, and DeepSpeed's sdist
line with the sha256 its index publishes. Versions follow the shipped cp311 cpu lock where a
package is in both and that version has wheels for the Python asked for; a pin uv names as
unusable for it is left to the resolver, and the header says which.
"""

from __future__ import annotations

import dataclasses
import html.parser
import pathlib
import re
import subprocess
import sys
import tempfile
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import yaml

from .errors import DsclusterError
from .util import atomic_write

VARIANTS = ("cpu", "cu126", "cu128", "cu130", "pypi")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
ARCHES = ("x86_64", "aarch64")
PYPI_SIMPLE = "https://pypi.org/simple"
# The lock whose versions the others follow (the CPU default's, Debian 12's Python).
REFERENCE_LOCK = "cpu-torch{torch}-ds{ds}-cp311-x86_64.txt"
# What uv says of a pin the asked Python cannot use: "because numpy==2.4.6 has no usable
# wheels", "because einops==0.8.2 requires Python >=3.11", or its hint "(e.g.,
# filelock==4.3.2 only supports >=3.11)".
UNUSABLE_RE = re.compile(
    r"(?:[Bb]ecause |e\.g\., )([A-Za-z0-9][A-Za-z0-9._-]*)==\S+ "
    r"(?:has no usable wheels|only supports|requires Python)"
)


@dataclasses.dataclass(frozen=True)
class LockRequest:
    variant: str
    python: str
    arch: str
    torch: str
    deepspeed: str
    requirements: tuple[str, ...]  # DeepSpeed's runtime requirements (the role's list)
    index_url: str = ""  # PyPI or its mirror ('' = PyPI)
    extra_index_urls: tuple[str, ...] = ()
    torch_index_url: str = "https://download.pytorch.org/whl"  # + /<variant>

    @property
    def pytag(self) -> str:
        return "cp" + self.python.replace(".", "")

    @property
    def name(self) -> str:
        """The file name ml_stack looks for (plugins/module_utils/ml_stack_plan.py: lock_name)."""
        return f"{self.variant}-torch{self.torch}-ds{self.deepspeed}-{self.pytag}-{self.arch}.txt"

    @property
    def torch_spec(self) -> str:
        """ml_stack's torch requirement: the local label of PyTorch's own index, none on PyPI."""
        return f"torch=={self.torch}" + ("" if self.variant == "pypi" else f"+{self.variant}")

    def base_in(self) -> list[str]:
        """ml_stack's plan's base_requirements, in its order."""
        return [self.torch_spec, "setuptools", "wheel", *self.requirements]

    def index_args(self) -> list[str]:
        args = ["--index-url", self.index_url] if self.index_url else []
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        if self.variant != "pypi":
            base = self.torch_index_url.rstrip("/")
            args += ["--extra-index-url", f"{base}/{self.variant}"]
            args += ["--index-strategy", "unsafe-best-match"]
        return args

    def compile_argv(self, base_in: pathlib.Path, pins: pathlib.Path | None, out: pathlib.Path):
        argv = [sys.executable, "-m", "uv", "pip", "compile", str(base_in)]
        argv += ["-c", str(pins)] if pins is not None else []
        argv += ["--generate-hashes", "--no-annotate", "--no-header", "--quiet"]
        argv += ["--python-platform", f"{self.arch}-manylinux_2_28"]
        argv += ["--python-version", self.python, "--only-binary", ":all:"]
        return [*argv, *self.index_args(), "--output-file", str(out)]


def role_defaults(collection: pathlib.Path) -> dict[str, Any]:
    data = yaml.safe_load((collection / "roles/ml_stack/defaults/main.yml").read_text())
    return data if isinstance(data, dict) else {}


def check_url(url: str, flag: str, example: str = PYPI_SIMPLE) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "file") or not (parts.netloc or parts.path):
        raise DsclusterError(
            f"{flag} {url!r} is not an http(s) or file URL of a package index; give e.g. "
            f"{flag} {example}"
        )
    return url.rstrip("/")


def request_from(
    collection: pathlib.Path,
    *,
    variant: str,
    python: str,
    arch: str = "x86_64",
    index_url: str = "",
    extra_index_urls: tuple[str, ...] = (),
    torch_index_url: str = "",
) -> LockRequest:
    """The request with the role's pins; every refusal before anything is contacted."""
    if variant == "hpu":
        raise DsclusterError(
            "--variant hpu has no lock to make: Habana's torch and DeepSpeed fork come from its "
            "vault with the checksums in ml_stack_habana_compat; use cpu, cu126, cu128, cu130 "
            "or pypi"
        )
    if variant not in VARIANTS:
        raise DsclusterError(
            f"--variant {variant!r} is not a torch build ml_stack locks; use one of "
            f"{', '.join(VARIANTS)}"
        )
    if python not in PYTHONS:
        raise DsclusterError(
            f"--python {python!r} is not one the nodes run; use one of {', '.join(PYTHONS)} "
            "(Ubuntu 22.04, Debian 12, Ubuntu 24.04, Debian 13)"
        )
    if arch not in ARCHES:
        raise DsclusterError(f"--arch {arch!r} is unknown; use one of {', '.join(ARCHES)}")
    defaults = role_defaults(collection)
    requirements = defaults.get("ml_stack_deepspeed_requirements") or []
    return LockRequest(
        variant=variant,
        python=python,
        arch=arch,
        torch=str(defaults["ml_stack_torch_version"]),
        deepspeed=str(defaults["ml_stack_deepspeed_version"]),
        requirements=tuple(str(r) for r in requirements),
        index_url=check_url(index_url, "--index-url") if index_url else "",
        extra_index_urls=tuple(check_url(u, "--extra-index-url") for u in extra_index_urls),
        torch_index_url=check_url(
            torch_index_url or str(defaults.get("ml_stack_torch_index_url") or ""),
            "--torch-index-url",
            "https://download.pytorch.org/whl",
        ),
    )


def reference_pins(locks: pathlib.Path, req: LockRequest) -> dict[str, str]:
    """name -> version of the shipped reference lock (local labels dropped), {} if none."""
    path = locks / REFERENCE_LOCK.format(torch=req.torch, ds=req.deepspeed)
    if not path.is_file():
        return {}
    pins = {}
    for line in path.read_text().splitlines():
        found = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s+\\]+)", line)
        if found and found[1].lower() not in ("torch", "deepspeed"):
            pins[found[1].lower()] = found[2]
    return pins


def resolve(req: LockRequest, pins: dict[str, str], work: pathlib.Path) -> tuple[str, list[str]]:
    """uv's hashed resolution, following `pins` where the Python can: (text, pins dropped)."""
    base_in = work / "base.in"
    base_in.write_text("\n".join(req.base_in()) + "\n")
    out = work / "base.txt"
    kept = dict(pins)
    dropped: list[str] = []
    while True:
        pins_file = work / "pins.txt" if kept else None
        if pins_file is not None:
            pins_file.write_text("".join(f"{n}=={v}\n" for n, v in sorted(kept.items())))
        proc = subprocess.run(
            req.compile_argv(base_in, pins_file, out),
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        if proc.returncode == 0:
            return out.read_text(), dropped
        unusable = [m for m in UNUSABLE_RE.findall(proc.stderr) if m.lower() in kept]
        if not unusable:
            raise DsclusterError(_uv_failure(req, proc.stderr))
        for name in dict.fromkeys(m.lower() for m in unusable):
            dropped.append(f"{name}=={kept.pop(name)}")


def _uv_failure(req: LockRequest, stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "")
    why = " ".join(lines[lines.index(said) : lines.index(said) + 6]) if said in lines else said
    return (
        f"uv could not lock {req.torch_spec} for {req.pytag} {req.arch} "
        f"({' '.join(req.index_args()) or 'PyPI'}): {why[:500]}; check the index URLs and "
        "that the build exists for that Python"
    )


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def sdist_sha256(index: str, version: str, timeout: float = 60) -> str:
    """DeepSpeed's sdist digest as the index's simple page (PEP 503) publishes it."""
    url = f"{index.rstrip('/')}/deepspeed/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            page = resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DsclusterError(
            f"cannot read {url} ({reason}); check --index-url, or the controller's network "
            "and proxy"
        ) from None
    links = _Links()
    links.feed(page)
    name = f"deepspeed-{version}.tar.gz"
    for href in links.hrefs:
        path, _, fragment = href.partition("#")
        if path.rsplit("/", 1)[-1] == name and fragment.startswith("sha256="):
            return fragment.removeprefix("sha256=")
    raise DsclusterError(
        f"{url} lists no {name} with a sha256; is DeepSpeed {version} on that index?"
    )


def header(req: LockRequest, dropped: list[str]) -> str:
    what = (
        "the torch that PyPI publishes (no local label; on Linux x86_64 a CUDA 13.0 build that "
        "also runs on CPU nodes, its CUDA libraries as PyPI wheels)"
        if req.variant == "pypi"
        else f"the {req.variant} build of torch from {req.torch_index_url}/{req.variant}"
    )
    unusable = f", except {', '.join(dropped)} (no wheels for this Python)" if dropped else ""
    text = (
        f"ml_stack's base layer: {what}, torch {req.torch} and DeepSpeed {req.deepspeed} with its "
        "runtime requirements (ml_stack_deepspeed_requirements, plus setuptools and wheel for "
        f"the build), for CPython {req.python} on {req.arch} glibc >= 2.28. Every file the "
        "controller downloads for this layer must have one of these sha256 "
        f"(files/hash_wheels.py). Made by `dscluster lock --variant {req.variant} --python "
        f"{req.python} --arch {req.arch}` (uv pip compile --generate-hashes; versions follow "
        f"the cp311 cpu lock where a package is in both{unusable}), then DeepSpeed's sdist "
        "line with the sha256 its index publishes."
    )
    return "".join(f"# {line}\n" for line in textwrap.wrap(text, 94, break_on_hyphens=False))


def make_lock(req: LockRequest, locks: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """Resolve, hash and write the lock to `out`; its path."""
    digest = sdist_sha256(req.index_url or PYPI_SIMPLE, req.deepspeed)
    with tempfile.TemporaryDirectory(prefix="dscluster-lock-") as tmp:
        text, dropped = resolve(req, reference_pins(locks, req), pathlib.Path(tmp))
    body = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    if not re.search(rf"^torch=={re.escape(req.torch)}\b", body, re.MULTILINE):
        raise DsclusterError(f"uv's lock for {req.name} pins no torch {req.torch}; report a bug")
    deepspeed = f"deepspeed=={req.deepspeed} \\\n    --hash=sha256:{digest}\n"
    atomic_write(out, header(req, dropped) + body + deepspeed)
    return out

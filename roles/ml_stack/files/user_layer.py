#!/usr/bin/env python3
"""Resolve and download the user layer of the wheelhouse (runs on the controller).

The base layer (torch, DeepSpeed built with its ops, their requirements) is keyed only by
what changes DeepSpeed's build. Users' own requirements (ml_stack_extra_requirements and
ml_stack_requirements_file) are a separate layer, resolved with uv for the nodes' platform
against the base layer's exact pins (constraints) and wheels (--find-links): nothing
re-resolves torch. A requirement that contradicts a base pin fails with one line naming
both. The layer's directory then holds only the wheels the base lacks, with a lock in the
base's format (requirements.lock with --hash lines, lock.json).

  user_layer.py --base BASE_DIR --out OUT_DIR --key KEY --python-version 3.11 \
      --python-platform x86_64-manylinux_2_28 --platform TAG... \
      [--requirement REQ]... [--requirements-file FILE] [--uv-arg A]... [--pip-arg A]...

Exit 0 with the lock written, 1 with one error line on stderr. Needs packaging (an
ansible-core dependency), uv and pip in this python.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

from filedigest import sha256
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename


class LayerError(Exception):
    """One line for the user: what is wrong and what to change."""


def base_pins(base: pathlib.Path) -> dict[str, str]:
    """Canonical name -> exact version of every wheel of the base layer's lock."""
    lock = json.loads((base / "lock.json").read_text())
    pins = {}
    for filename in lock["wheels"]:
        name, version, _build, _tags = parse_wheel_filename(filename)
        pins[str(name)] = str(version)
    return pins


def logical_lines(text: str) -> list[str]:
    """requirements.txt lines with comments dropped and backslash continuations joined."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            lines.append(current.strip())
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def parse_line(line: str, origin: str) -> tuple[Requirement, set[str]]:
    """A requirement and the sha256 hashes given for it (a lock's --hash options)."""
    hashes = set(re.findall(r"--hash[= ]sha256:([0-9a-fA-F]{64})", line))
    spec = re.sub(r"--hash[= ]\S+", "", line).strip()
    if spec.startswith("-"):
        raise LayerError(
            f"{origin}: '{spec}' is a pip option, not a requirement; the user layer takes "
            "requirements and pins only (put index options in ml_stack_uv_compile_args "
            "and ml_stack_pip_download_args)"
        )
    try:
        return Requirement(spec), {h.lower() for h in hashes}
    except InvalidRequirement as exc:
        raise LayerError(
            f"{origin}: '{spec}' is not a requirement ({exc}); write it as name==version"
        ) from None


def user_requirements(
    strings: list[str], file: str | None
) -> list[tuple[Requirement, set[str], str]]:
    """Every user requirement with its hashes and where it came from."""
    origin = "ml_stack_extra_requirements"
    reqs = [(*parse_line(s, origin), origin) for s in strings]
    if file:
        origin = f"ml_stack_requirements_file {file}"
        text = pathlib.Path(file).read_text()
        reqs += [(*parse_line(line, origin), origin) for line in logical_lines(text)]
    return reqs


def check_against_base(reqs: list[tuple[Requirement, set[str], str]], pins: dict[str, str]) -> None:
    """A user requirement on a base package must accept the base's pin: nothing re-resolves
    torch, DeepSpeed or their requirements."""
    for req, _hashes, origin in reqs:
        name = str(canonicalize_name(req.name))
        if name in pins and not req.specifier.contains(pins[name], prereleases=True):
            raise LayerError(
                f"the user requirement '{req}' ({origin}) conflicts with the base layer's pin "
                f"{name}=={pins[name]} (torch and DeepSpeed's layer is never re-resolved); "
                f"accept {pins[name]} in that requirement, or remove it"
            )
        if name in pins and req.url:
            raise LayerError(
                f"the user requirement '{req}' ({origin}) replaces the base layer's "
                f"{name}=={pins[name]} by a URL; remove it"
            )


def compile_argv(
    args: argparse.Namespace,
    req_in: pathlib.Path,
    constraints: pathlib.Path,
    out: pathlib.Path,
) -> list[str]:
    return [
        sys.executable, "-m", "uv", "pip", "compile", str(req_in),
        "--constraint", str(constraints), "--find-links", str(args.base),
        "--python-version", args.python_version, "--python-platform", args.python_platform,
        "--only-binary", ":all:", "--generate-hashes", "--no-header", "--no-annotate",
        "--quiet", "--output-file", str(out), *args.uv_arg,
    ]  # fmt: skip


def resolve(
    args: argparse.Namespace, reqs, pins: dict[str, str], work: pathlib.Path
) -> dict[str, tuple[str, list[str]]]:
    """uv's resolution of the user requirements against the base pins: canonical name ->
    (version, sha256 hashes) for every distribution of the closure."""
    req_in = work / "requirements.in"
    req_in.write_text("".join(f"{req}\n" for req, _h, _o in reqs))
    constraints = work / "constraints.txt"
    constraints.write_text(
        "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
    )
    compiled = work / "compiled.txt"
    proc = subprocess.run(
        compile_argv(args, req_in, constraints, compiled),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        reason = proc.stderr if proc.stderr.strip() else proc.stdout
        reason = " ".join(
            line.strip().removeprefix("cause:").strip()
            for line in reason.splitlines()
            if line.strip() and not line.strip().startswith("error: No solution found")
        )
        raise LayerError(
            "the user requirements do not resolve against the base layer's pins "
            f"(torch=={pins.get('torch', '?')}, deepspeed=={pins.get('deepspeed', '?')}; "
            f"nothing re-resolves torch): {reason.rstrip('.')}; change the requirement uv names"
        )
    return parse_compiled(compiled.read_text())


def parse_compiled(text: str) -> dict[str, tuple[str, list[str]]]:
    closure = {}
    for line in logical_lines(text):
        req, hashes = parse_line(line, "uv pip compile")
        pinned = [s.version for s in req.specifier if s.operator == "=="]
        if len(pinned) != 1:
            raise LayerError(f"uv pip compile left '{req}' unpinned; report this as a bug")
        closure[str(canonicalize_name(req.name))] = (pinned[0], sorted(hashes))
    return closure


def split_closure(closure, pins: dict[str, str]) -> dict[str, tuple[str, list[str]]]:
    """The distributions the base lacks; a base one at another version is refused."""
    new = {}
    for name, (version, hashes) in closure.items():
        if name not in pins:
            new[name] = (version, hashes)
        elif version != pins[name]:
            raise LayerError(
                f"uv resolved {name}=={version} where the base layer pins {name}=={pins[name]}; "
                "report this as a bug"
            )
    return new


def download(
    args: argparse.Namespace, new: dict[str, tuple[str, list[str]]], work: pathlib.Path
) -> None:
    """The new distributions' wheels for the nodes' platform, each checked against uv's hashes."""
    if not new:
        return
    reqs = work / "download.txt"
    reqs.write_text(
        "".join(
            f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in hashes) + "\n"
            for name, (version, hashes) in sorted(new.items())
        )
    )
    abi = "cp" + args.python_version.replace(".", "")
    argv = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
        "--no-deps", "--require-hashes", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", args.python_version, "--abi", abi,
        *[f"--platform={tag}" for tag in args.platform], *args.pip_arg,
        "--dest", str(args.out), "--requirement", str(reqs),
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        raise LayerError(
            "pip could not download the user layer's wheels for the nodes' platform: "
            + " ".join(lines[-3:])
        )


def layer_wheels(
    out: pathlib.Path, new: dict[str, tuple[str, list[str]]]
) -> dict[str, pathlib.Path]:
    """Canonical name -> the downloaded wheel of the resolved version."""
    found = {}
    for path in sorted(out.glob("*.whl")):
        name, version, _build, _tags = parse_wheel_filename(path.name)
        if str(name) in new and str(version) == new[str(name)][0]:
            found[str(name)] = path
    missing = sorted(set(new) - set(found))
    if missing:
        raise LayerError(
            f"no wheel for the nodes' platform was downloaded for {', '.join(missing)}"
        )
    return found


def check_user_hashes(reqs, wheels: dict[str, pathlib.Path], digests: dict[str, str]) -> None:
    """A lock the user brings keeps its guarantee: a downloaded wheel must match one of its
    --hash values for that distribution."""
    for req, hashes, origin in reqs:
        name = str(canonicalize_name(req.name))
        if hashes and name in wheels and digests[name] not in hashes:
            raise LayerError(
                f"{wheels[name].name} does not match any --hash that {origin} gives for "
                f"{req.name}; regenerate that lock for the nodes' platform (linux x86_64) or "
                "drop its hashes"
            )


def write_lock(args, reqs, new, wheels: dict[str, pathlib.Path], digests: dict[str, str]) -> None:
    lines = [
        f"# User layer {args.key} over the base layer {args.base.name}:",
        "# every wheel pinned by version and sha256. Install with: uv pip install --no-index",
        "# --find-links DIR --require-hashes --no-deps --requirement requirements.lock",
    ]
    lines += [f"{name}=={new[name][0]} --hash=sha256:{digests[name]}" for name in sorted(wheels)]
    lock = {
        "key": args.key,
        "base_key": args.base.name,
        "requirements": [str(req) for req, _h, _o in reqs],
        "packages": {name: new[name][0] for name in sorted(wheels)},
        "wheels": {
            wheels[name].name: {
                "sha256": digests[name],
                "size": wheels[name].stat().st_size,
            }
            for name in sorted(wheels)
        },
    }
    (args.out / "requirements.lock").write_text("\n".join(lines) + "\n")
    # lock.json last: the role's `creates:` marks a complete layer.
    tmp = args.out / ".lock.json"
    tmp.write_text(json.dumps(lock, indent=4, sort_keys=True) + "\n")
    os.replace(tmp, args.out / "lock.json")


def build(args: argparse.Namespace) -> dict:
    pins = base_pins(args.base)
    reqs = user_requirements(args.requirement, args.requirements_file)
    if not reqs:
        raise LayerError("no user requirements given: there is no user layer to build")
    check_against_base(reqs, pins)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="user-layer-") as tmp:
        work = pathlib.Path(tmp)
        new = split_closure(resolve(args, reqs, pins, work), pins)
        download(args, new, work)
    wheels = layer_wheels(args.out, new)
    for path in args.out.glob("*.whl"):
        if path not in wheels.values():
            path.unlink()
    digests = {name: sha256(path) for name, path in wheels.items()}
    check_user_hashes(reqs, wheels, digests)
    write_lock(args, reqs, new, wheels, digests)
    return {name: new[name][0] for name in sorted(wheels)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--python-version", required=True)
    parser.add_argument("--python-platform", required=True)
    parser.add_argument("--platform", action="append", default=[])
    parser.add_argument("--requirement", action="append", default=[])
    parser.add_argument("--requirements-file", default="")
    parser.add_argument("--uv-arg", action="append", default=[])
    parser.add_argument("--pip-arg", action="append", default=[])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        packages = build(args)
    except LayerError as exc:
        print(f"ml_stack user layer: {exc}", file=sys.stderr)
        return 1
    json.dump({"key": args.key, "packages": packages}, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

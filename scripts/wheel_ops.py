"""What a DeepSpeed wheel carries pre-built: each compiled op (deepspeed/ops/**/<op>_op*.so)
and the GPU architectures of its cubins (`cuobjdump --list-elf`), with the accelerator and the
ops deepspeed/git_version_info_installed.py records. make cuda-wheel runs it on the wheel it
built; --want-ops and --want-arch make it fail, with one line, when an op asked for is missing
or lacks a cubin of an architecture asked for.

    python scripts/wheel_ops.py deepspeed-0.19.8-...whl --cuobjdump <CUDA_HOME>/bin/cuobjdump \\
        --want-ops cpu_adam,fused_adam --want-arch "8.0;9.0" [--json report.json]

Standard library only: it runs in the build container's venv as well as on the controller."""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import zipfile

VERSION_INFO = "deepspeed/git_version_info_installed.py"
# DeepSpeed's ops whose builders compile C++ only: present in a CUDA wheel, with no device code.
HOST_ONLY = frozenset({"async_io", "cpu_adagrad", "cpu_adam", "cpu_lion", "deepspeed_shm_comm"})
NO_DEVICE_CODE = "does not contain device code"
_ELF = re.compile(r"^ELF file\s+\d+:\s+\S+?\.(sm_\d+[a-z]?)\.cubin\s*$", re.MULTILINE)
_ARCH = re.compile(r"^(\d+)\.(\d+)([a-z]?)(\+PTX)?$")


class WheelOpsError(Exception):
    """A wheel, a tool or an argument this check cannot use; the message says which."""


def op_name(member: str) -> str | None:
    """The op a wheel member is the compiled library of (deepspeed/ops/adam/fused_adam_op.cpython-
    311-x86_64-linux-gnu.so: fused_adam), None for any other member."""
    if not (member.startswith("deepspeed/ops/") and member.endswith(".so")):
        return None
    return member.rsplit("/", 1)[-1].split(".", 1)[0].removesuffix("_op")


def parse_list_elf(text: str) -> list[str]:
    """The sm_XX architectures `cuobjdump --list-elf` lists, sorted; [] for host code only
    ("... does not contain device code")."""
    return sorted(set(_ELF.findall(text)), key=_arch_key)


def _arch_key(arch: str) -> tuple[int, str]:
    digits = arch.removeprefix("sm_")
    return int(digits.rstrip("abcdefghijklmnopqrstuvwxyz")), digits


def arch_list(spec: str) -> list[str]:
    """TORCH_CUDA_ARCH_LIST ("8.0;9.0", "8.0 9.0+PTX", "9.0a") as cubin architectures
    (sm_80, sm_90, sm_90a); +PTX adds PTX, not another cubin."""
    archs = []
    for item in re.split(r"[;\s]+", spec.strip()):
        if not item:
            continue
        match = _ARCH.match(item)
        if match is None:
            raise WheelOpsError(f"not a CUDA architecture: {item!r} (in {spec!r}); e.g. 8.0;9.0")
        archs.append(f"sm_{match[1]}{match[2]}{match[3]}")
    return archs


def torch_arch(arch: str) -> str:
    """sm_90 as TORCH_CUDA_ARCH_LIST spells it: 9.0 (sm_90a: 9.0a)."""
    digits = arch.removeprefix("sm_")
    number = digits.rstrip("abcdefghijklmnopqrstuvwxyz")
    return f"{number[:-1]}.{number[-1]}{digits[len(number) :]}"


def parse_version_info(text: str) -> dict[str, object]:
    """deepspeed/git_version_info_installed.py's assignments (version, installed_ops,
    compatible_ops, accelerator_name, torch_info), read as literals, never executed."""
    info: dict[str, object] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    info[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
    return info


def problems(
    ops: dict[str, list[str]],
    info: dict[str, object],
    want_ops: list[str],
    want_archs: list[str],
    want_accelerator: str | None = None,
) -> list[str]:
    """What the wheel lacks of what was asked for, one phrase each; [] when nothing."""
    found = []
    accelerator = info.get("accelerator_name")
    if want_accelerator and accelerator != want_accelerator:
        found.append(f"accelerator_name is {accelerator!r}, not {want_accelerator!r}")
    installed = info.get("installed_ops")
    installed = installed if isinstance(installed, dict) else {}
    for op in want_ops:
        if op not in ops:
            found.append(f"{op} not built (no deepspeed/ops/**/{op}_op*.so)")
            continue
        if not installed.get(op):
            found.append(f"{op} not in installed_ops")
        if op in HOST_ONLY:
            continue
        lacking = [arch for arch in want_archs if arch not in ops[op]]
        if lacking:
            names = ", ".join(torch_arch(arch) for arch in lacking)
            found.append(f"{op} lacks {' '.join(lacking)} ({names})")
    return found


def format_op(name: str, archs: list[str]) -> str:
    return f"{name}: {' '.join(archs) if archs else 'host code only'}"


def list_elf(cuobjdump: str, library: pathlib.Path) -> str:
    """cuobjdump --list-elf's output; it exits 255 on a library with no device code."""
    try:
        proc = subprocess.run(
            [cuobjdump, "--list-elf", str(library)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except OSError as exc:
        raise WheelOpsError(f"cannot run {cuobjdump}: {exc}") from exc
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 and NO_DEVICE_CODE not in out:
        raise WheelOpsError(f"{cuobjdump} --list-elf {library.name} failed: {out.strip()}")
    return out


def read_wheel(wheel: pathlib.Path, cuobjdump: str) -> tuple[dict[str, list[str]], dict]:
    """The wheel's compiled ops -> their cubin architectures, and its version info."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelOpsError(f"cannot read {wheel} as a wheel: {exc}") from exc
    with archive, tempfile.TemporaryDirectory() as tmp:
        names = archive.namelist()
        if VERSION_INFO not in names:
            raise WheelOpsError(f"{wheel.name} has no {VERSION_INFO}: not a DeepSpeed wheel?")
        info = parse_version_info(archive.read(VERSION_INFO).decode())
        ops: dict[str, list[str]] = {}
        for member in sorted(names):
            name = op_name(member)
            if name is None:
                continue
            path = pathlib.Path(archive.extract(member, tmp))
            ops[name] = sorted(
                set(ops.get(name, [])) | set(parse_list_elf(list_elf(cuobjdump, path))),
                key=_arch_key,
            )
    return ops, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=pathlib.Path)
    parser.add_argument("--cuobjdump", default="cuobjdump", help="the cuobjdump to run")
    parser.add_argument("--want-ops", default="", help="ops that must be built: a,b,c")
    parser.add_argument("--want-arch", default="", help='cubins each CUDA op must carry: "8.0;9.0"')
    parser.add_argument("--want-accelerator", help="accelerator_name the wheel must record")
    parser.add_argument("--json", type=pathlib.Path, help="write the report here")
    args = parser.parse_args(argv)
    try:
        want_archs = arch_list(args.want_arch)
        want_ops = [op for op in args.want_ops.split(",") if op]
        ops, info = read_wheel(args.wheel, args.cuobjdump)
    except WheelOpsError as exc:
        print(f"wheel_ops: {exc}", file=sys.stderr)
        return 2
    for name, archs in ops.items():
        print(format_op(name, archs))
    missing = problems(ops, info, want_ops, want_archs, args.want_accelerator)
    if args.json:
        report = {
            "wheel": args.wheel.name,
            "size_bytes": args.wheel.stat().st_size,
            "accelerator_name": info.get("accelerator_name"),
            "torch_info": info.get("torch_info"),
            "installed_ops": sorted(
                k for k, v in dict(info.get("installed_ops") or {}).items() if v
            ),
            "compatible_ops": info.get("compatible_ops"),
            "ops": {name: {"archs": archs, "host_only": not archs} for name, archs in ops.items()},
            "want_ops": want_ops,
            "want_archs": want_archs,
            "missing": missing,
        }
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    if missing:
        print(f"wheel_ops: {args.wheel.name}: {'; '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

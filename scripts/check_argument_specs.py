#!/usr/bin/env python3
"""Check that every role's meta/argument_specs.yml matches its defaults/main.yml.

For each roles/<role>/ the option keys of the `main` entry point must be exactly the
keys of defaults/main.yml; other entry points (include_role tasks_from, e.g. _apt_repo's
`cache`) may list only keys of defaults/main.yml. Every option of every entry point must
carry a `type` and a `description`. A defaults-only role (_dscluster_defaults) is checked the
same way.
Exits 0 when all roles agree, 1 naming each role and the keys that differ.

Usage: scripts/check_argument_specs.py [ROLES_DIR]   (default: <repo>/roles)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

SPEC_FILES = ("meta/argument_specs.yml", "meta/argument_specs.yaml")
DEFAULT_FILES = ("defaults/main.yml", "defaults/main.yaml")


def _first_existing(role: Path, candidates: tuple[str, ...]) -> Path | None:
    for rel in candidates:
        path = role / rel
        if path.is_file():
            return path
    return None


def _load_mapping(path: Path) -> dict:
    with path.open(encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level is {type(data).__name__}, expected a mapping")
    return data


def check_role(role: Path) -> list[str]:
    """Return the problems found in one role (empty when it is consistent)."""
    spec_path = _first_existing(role, SPEC_FILES)
    defaults_path = _first_existing(role, DEFAULT_FILES)
    if spec_path is None and defaults_path is None:
        return []
    if spec_path is None:
        return ["has defaults/main.yml but no meta/argument_specs.yml"]

    try:
        spec = _load_mapping(spec_path)
        defaults = _load_mapping(defaults_path) if defaults_path else {}
    except (OSError, ValueError, yaml.YAMLError) as exc:
        return [f"cannot read: {exc}"]

    main = (spec.get("argument_specs") or {}).get("main")
    if not isinstance(main, dict):
        return [f"{spec_path.relative_to(role)} has no argument_specs.main entry point"]
    options = main.get("options") or {}
    if not isinstance(options, dict):
        return ["argument_specs.main.options is not a mapping"]

    problems = []
    only_spec = sorted(set(options) - set(defaults))
    only_defaults = sorted(set(defaults) - set(options))
    if only_defaults:
        problems.append(
            "in defaults/main.yml but not in argument_specs: " + ", ".join(only_defaults)
        )
    if only_spec:
        problems.append("in argument_specs but not in defaults/main.yml: " + ", ".join(only_spec))
    problems += _option_problems("main", options)
    for name, entry in sorted((spec.get("argument_specs") or {}).items()):
        if name == "main":
            continue
        entry_options = (entry.get("options") or {}) if isinstance(entry, dict) else None
        if not isinstance(entry_options, dict):
            problems.append(f"argument_specs.{name}.options is not a mapping")
            continue
        unknown = sorted(set(entry_options) - set(defaults))
        if unknown:
            problems.append(
                f"entry point {name} has options not in defaults/main.yml: " + ", ".join(unknown)
            )
        problems += _option_problems(name, entry_options)
    return problems


def _option_problems(entry: str, options: dict) -> list[str]:
    problems = []
    for key in sorted(options):
        opt = options[key] if isinstance(options[key], dict) else {}
        missing = [field for field in ("type", "description") if not opt.get(field)]
        if missing:
            where = "" if entry == "main" else f" of entry point {entry}"
            problems.append(f"option {key}{where} lacks {' and '.join(missing)}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "roles_dir",
        nargs="?",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "roles",
        help="directory holding the roles (default: the repository's roles/)",
    )
    args = parser.parse_args(argv)
    if not args.roles_dir.is_dir():
        print(f"check_argument_specs: {args.roles_dir} is not a directory", file=sys.stderr)
        return 1

    failed = False
    for role in sorted(p for p in args.roles_dir.iterdir() if p.is_dir()):
        for problem in check_role(role):
            failed = True
            print(f"role {role.name}: {problem}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

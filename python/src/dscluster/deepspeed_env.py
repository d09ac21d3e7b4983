"""`.deepspeed_env`: the `KEY=VALUE` lines DeepSpeed's launcher exports to every rank.

DeepSpeed splits each line once on `=`, strips key and value, and wraps a value in double
quotes when it holds a character outside `[\\w@%+=:,./-]` before pasting it into a pdsh
command line. Values the remote shell would change inside those quotes ($, `, \\, ", !) or
that hold a line break or control character are refused here. launch_env.py derives what
goes in; launch_files.py writes it beside the hostfile.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from .errors import DsclusterError
from .text import readlines, show

ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# DeepSpeed's MultiNodeRunner.add_export quotes values with any other character in "...",
# where the remote shell then expands $, `, \ and " — so those values would arrive changed.
ENV_SAFE_VALUE_RE = re.compile(r"^[\w@%+=:,./-]*$")
ENV_MANGLED_CHARS = set('$`"\\!\n\r')


def check_env_value(key: str, value: str) -> None:
    if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
        raise DsclusterError(
            f".deepspeed_env key {show(key)} is not a shell variable name; rename it "
            "(letters, digits and '_', not starting with a digit)"
        )
    if not isinstance(value, str):
        raise DsclusterError(f".deepspeed_env value of {key} is {show(value)}, not text; quote it")
    if value == "" or value != value.strip():
        raise DsclusterError(
            f".deepspeed_env value of {key} is empty or has surrounding blanks, "
            "which DeepSpeed strips; fix it"
        )
    bad = sorted(set(value) & ENV_MANGLED_CHARS)
    if bad:
        raise DsclusterError(
            f".deepspeed_env value of {key} contains {''.join(bad)!r}, which DeepSpeed's pdsh "
            "launcher would expand or mangle; remove those characters"
        )
    if not value.isprintable():
        raise DsclusterError(
            f".deepspeed_env value of {key} ({show(value)}) contains a control character, "
            "which DeepSpeed's pdsh launcher would pass through a shell; remove it"
        )


def render_env(env: Mapping[str, str]) -> str:
    """Exactly `KEY=VALUE` lines: no comments, blanks, quotes or `export`."""
    if not env:
        raise DsclusterError(".deepspeed_env would be empty; it needs at least PATH")
    lines = []
    for key, value in env.items():
        check_env_value(key, value)
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def parse_env_file(text: str, source: str) -> dict[str, str]:
    """A `.deepspeed_env` as DeepSpeed reads it: `KEY=VALUE` per line (lines split on \\n as
    readlines does), split once on `=`, key and value stripped; anything else is refused
    with the line number."""
    env: dict[str, str] = {}
    for number, line in enumerate(readlines(text), start=1):
        if "=" not in line:
            raise DsclusterError(
                f"{source} line {number} is not KEY=VALUE (DeepSpeed would fail on it); fix it "
                "or rewrite it with 'dscluster hostfile'"
            )
        key, value = line.split("=", 1)
        key, value = key.strip(), value.strip()
        try:
            check_env_value(key, value)
        except DsclusterError as exc:
            raise DsclusterError(f"{source} line {number}: {exc}") from None
        env[key] = value
    return env


def env_text(key: object, value: object, where: str) -> str:
    """One value of dscluster_extra_env as the text `.deepspeed_env` carries: strings as
    they are, whole and finite numbers in decimal, booleans as 1 / 0 (how NCCL, torch and
    most launchers read a flag); null, lists and mappings refused naming the key."""
    if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
        raise DsclusterError(
            f"{where}: key {show(key)} is not an environment variable name; use letters, "
            "digits and '_', not starting with a digit (e.g. OMP_NUM_THREADS)"
        )
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DsclusterError(f"{where}: {key} is {value}; give a finite number or a string")
        return repr(value)
    if isinstance(value, str):
        return value
    kind = "null" if value is None else type(value).__name__
    raise DsclusterError(
        f"{where}: {key} is {kind} ({show(value)}); give it a plain value, e.g. {key}: '4' "
        "(a string, number or true/false), or remove the key"
    )


def extra_env_texts(extra: object, where: str) -> dict[str, str]:
    """dscluster_extra_env (or an extra_env argument) as {KEY: text}; see env_text."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise DsclusterError(
            f"{where} is {type(extra).__name__} ({show(extra)}), not a mapping; write it as "
            "KEY: value pairs, e.g. {OMP_NUM_THREADS: 4}"
        )
    return {str(k): env_text(k, v, where) for k, v in extra.items()}

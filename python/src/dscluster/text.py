"""How values and messages are written into one-line messages, and how DeepSpeed splits lines.

Each helper is written once here; every module that words a message imports it. Imports
nothing from dscluster, so any module may use it.
"""

from __future__ import annotations

from typing import Any

import yaml


def show(value: object, limit: int = 80) -> str:
    """A value for a one-line message: repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'"


def show_yaml(value: Any) -> str:
    """A value as the user wrote it in YAML, roughly: strings quoted, YAML words for the rest
    (null, true/false, flow style), cut to 200 characters."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000).strip()
    text = text.removesuffix("...").strip()
    return text if len(text) <= 200 else text[:197] + "..."


def one_line(text: str) -> str:
    """A message as one line: inner newlines folded, no ANSI escapes, no trailing blanks."""
    text = "".join(ch for ch in _strip_ansi(text) if ch in {"\n", "\t"} or ch >= " ")
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def squeeze(text: object) -> str:
    """str(text) with every run of blanks (newlines and tabs too) made one space, none at the
    ends; unlike one_line, it keeps escapes and control characters as they are."""
    return " ".join(str(text).split())


def _strip_ansi(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\x1b":
            j = i + 1
            if j < len(text) and text[j] == "[":
                j += 1
                while j < len(text) and not ("@" <= text[j] <= "~"):
                    j += 1
            i = j + 1
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def readlines(text: str) -> list[str]:
    """Lines as DeepSpeed reads a file (readlines: split on \\n only, no final empty line)."""
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines

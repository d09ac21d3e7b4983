"""The inventory variable rules (roles/validate_inventory/files/rules.yml), applied here.

The same file drives the validate_inventory role's asserts, so a value the client refuses is
one the first play would refuse too, with the same words. `check_inventory` runs on every
inventory `inventory.load` reads, before any command does anything: every problem found is
reported in ONE DsclusterError naming the host(s), the variable, the bad value, the file that
sets it (when it can be found) and the fix.

A value holding a Jinja template is left to Ansible (the role checks what it renders to);
`inventory.plain_var` refuses templates where the client itself needs the value.
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import yaml

from .errors import DsclusterError
from .sources import names
from .text import show_yaml

if TYPE_CHECKING:
    from .inventory import Inventory

RULES_PATH = pathlib.Path("roles") / "validate_inventory" / "files" / "rules.yml"
PREFIX = "dscluster_"
# The role's own knob, which an inventory may set (group_vars/all) for site variables.
EXTRA_KNOWN = "validate_inventory_extra_known_vars"

_TYPE_OF = {"int": "int", "bool": "bool", "mapping": "mapping", "list": "list"}  # else a string


@functools.cache
def load_rules() -> dict[str, Any]:
    """rules.yml of the collection this client drives (paths.collection_root())."""
    from .paths import collection_root  # noqa: PLC0415

    path = collection_root() / RULES_PATH
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DsclusterError(
            f"cannot read the inventory rules {path}: {exc}; reinstall dscluster"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("variables"), dict):
        raise DsclusterError(f"the inventory rules {path} hold no 'variables'; reinstall dscluster")
    return data


def variables() -> dict[str, dict[str, Any]]:
    return load_rules()["variables"]


def is_template(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "true/false"),
    (int, "a whole number"),
    (float, "a decimal number"),
    (str, "a string"),
    (Mapping, "a mapping"),
    (list, "a list"),
)


def kind(value: Any) -> str:
    """What a YAML value is, in words."""
    if value is None:
        return "empty (null)"
    for types, words in _KINDS:
        if isinstance(value, types):
            return words
    return type(value).__name__


def _shown(value: Any, rule: Mapping[str, Any]) -> str:
    """show_yaml(value), or for a secret rule only its keys (a mapping) or its kind."""
    if not rule.get("secret"):
        return show_yaml(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(str(k) for k in value) + "} (values hidden)"
    return "hidden"


def _type_ok(rule: Mapping[str, Any], value: Any) -> bool:
    want = _TYPE_OF.get(str(rule.get("type")), "str")
    if want == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if want == "bool":
        return isinstance(value, bool)
    if want == "mapping":
        return isinstance(value, Mapping)
    if want == "list":
        return isinstance(value, list)
    return isinstance(value, str)


def _scalar_ok(value: Any, types: Iterable[str]) -> bool:
    allowed = set(types)
    if isinstance(value, bool):
        return "bool" in allowed
    if isinstance(value, int):
        return "int" in allowed
    if isinstance(value, float):
        return "float" in allowed and math.isfinite(value)
    if isinstance(value, str):
        return "str" in allowed and "\n" not in value and "\x00" not in value
    return False


def _mapping_problem(rule: Mapping[str, Any], value: Mapping[Any, Any]) -> str | None:
    """The first entry of a mapping that breaks the rule, in words: `key '1X' is not an
    environment variable name`, `OMP_NUM_THREADS is null`, `LR is nan`."""
    key_re = rule.get("key_pattern")
    types = rule.get("value_types")
    for key, item in value.items():
        if not isinstance(key, str) or (key_re and not re.fullmatch(key_re, key)):
            return f"key {show_yaml(key)} is not {rule.get('key_what', 'a valid key')}"
        if types is not None and not _scalar_ok(item, types):
            if item is None:
                return f"{key} is null"
            if isinstance(item, float) and not rule.get("secret"):
                return f"{key} is {item}"
            return f"{key} is {kind(item)}"
    return None


def _list_problem(rule: Mapping[str, Any], value: list[Any]) -> str | None:
    """The first item of a list that breaks the rule, in words: `item 'htop vim' is not a
    Debian package name`, `item 3 is a whole number`."""
    item_re = rule.get("item_pattern")
    for item in value:
        if not isinstance(item, str):
            return f"item {show_yaml(item)} is {kind(item)}"
        if item_re and not re.fullmatch(item_re, item):
            return f"item {show_yaml(item)} is not {rule.get('item_what', 'a valid item')}"
    return None


def _entry_problem(rule: Mapping[str, Any], value: Any) -> str | None:
    """The first entry of a mapping or item of a list that breaks the rule, in words."""
    if isinstance(value, Mapping):
        return _mapping_problem(rule, value)
    if isinstance(value, list):
        return _list_problem(rule, value)
    return None


def value_ok(rule: Mapping[str, Any], value: Any) -> bool:
    """True when the value follows the rule (the same conditions as the role's assert)."""
    if not _type_ok(rule, value):
        return False
    checks = (
        "min" not in rule or value >= rule["min"],
        "max" not in rule or value <= rule["max"],
        "pattern" not in rule or re.fullmatch(rule["pattern"], value) is not None,
        value not in (rule.get("forbidden") or []),
        "choices" not in rule or value in rule["choices"],
    )
    return all(checks) and _entry_problem(rule, value) is None


def problem(name: str, value: Any, rule: Mapping[str, Any], detail: str | None = None) -> str:
    """`<name> is <value> (<kind>); it must be ..., e.g. ...` (no host, no file). `detail`,
    when given, is what the parentheses say instead of the kind or the first bad entry."""
    if detail is None:
        detail = kind(value) if not _type_ok(rule, value) else _entry_problem(rule, value)
    what = f" ({detail})" if detail else ""
    shown = _shown(value, rule)
    text = f"{name} is {shown}{what}; it must be {rule['must']}, e.g. {rule['example']}"
    if rule.get("fix"):
        text += f" ({rule['fix']})"
    return text


def _file_missing(rule: Mapping[str, Any], value: Any) -> bool:
    """A `controller_file` rule's path (~ expanded) that is not a file on this machine; ""
    names none. Apart from value_ok, which says how a value is written, not what exists."""
    if not rule.get("controller_file") or not isinstance(value, str) or not value:
        return False
    return not os.path.isfile(os.path.expanduser(value))


def _value_problem(name: str, value: Any, rule: Mapping[str, Any]) -> str | None:
    """The line for a value that breaks its rule or names a missing file, else None."""
    if is_template(value):
        return None
    if not value_ok(rule, value):
        return problem(name, value, rule)
    if _file_missing(rule, value):
        return problem(name, value, rule, detail="no such file on the controller")
    return None


def check_value(name: str, value: Any) -> None:
    """Raise when one variable's value breaks its rule (templates and unknown names pass)."""
    rule = variables().get(name)
    text = None if rule is None else _value_problem(name, value, rule)
    if text is not None:
        raise DsclusterError(text)


def _var_files(inv: Inventory, host: str) -> list[pathlib.Path]:
    """The files that may set a host's variables, in Ansible's order of precedence."""
    base = inv.directory
    files: list[pathlib.Path] = []
    own = {host, f"{host}.yml", f"{host}.yaml", f"{host}.json"}
    for sub, names_ in (("host_vars", own), ("group_vars", None)):
        directory = base / sub
        if not directory.is_dir():
            continue
        for path in sorted(directory.rglob("*")):
            first = path.relative_to(directory).parts[0]
            if path.is_file() and (names_ is None or first in names_):
                files.append(path)
    files.append(inv.source)
    return files


def _defines(data: Any, name: str, value: Any, depth: int = 0) -> bool:
    """True when a parsed YAML document sets `name` to `value` somewhere."""
    if depth > 32 or not isinstance(data, dict):
        return False
    if name in data and data[name] == value and type(data[name]) is type(value):
        return True
    return any(_defines(v, name, value, depth + 1) for v in data.values())


def _where(inv: Inventory, host: str, name: str, value: Any) -> str | None:
    """The inventory file that sets `name` to `value` (for `host`), when one does."""
    for path in _var_files(inv, host):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if _defines(data, name, value):
            return _display(path)
    return None


def _display(path: pathlib.Path) -> str:
    """A path relative to the working directory when under it, else as given."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if rel.startswith("..") else rel


def _hosts_text(hosts: list[str], every: list[str]) -> str:
    if len(hosts) > 1 and hosts == every:
        return "on every host"
    return "on " + ", ".join(hosts)


def variable_problems(inv: Inventory) -> list[str]:
    """One line per (variable, bad value), naming the hosts and the file."""
    rules = variables()
    every = list(inv.groups.get("all", []))
    found: dict[tuple[str, str], tuple[list[str], Any]] = {}
    for host in every:
        hv = inv.hostvars.get(host, {})
        extra = hv.get(EXTRA_KNOWN) or []
        known = set(rules)
        if isinstance(extra, list):
            known |= {x for x in extra if isinstance(x, str)}
        # dscluster_* names (unknown ones are typos) and the role variables rules.yml names
        for name in sorted(
            k for k in hv if isinstance(k, str) and (k.startswith(PREFIX) or k in rules)
        ):
            value = hv[name]
            text: str | None = None
            if name not in known:
                text = _unknown(name, sorted(known))
            elif name in rules:
                text = _value_problem(name, value, rules[name])
            if text is None:
                continue
            found.setdefault((name, text), ([], value))[0].append(host)
    lines = []
    for (name, text), (hosts, value) in found.items():
        where = _where(inv, hosts[0], name, value) or "the inventory"
        first, rest = text.split(" ", 1)
        line = f"{first} {_hosts_text(hosts, every)} {rest}"
        lines.append(
            line.replace("{where}", where) if "{where}" in line else f"{line}; fix it in {where}"
        )
    return lines


def _unknown(name: str, known: list[str]) -> str:
    import difflib  # noqa: PLC0415

    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]}?" if close else "a typo?"
    return (
        f"{name} is not a dscluster variable ({hint}); rename it in {{where}}, or list a site "
        f"variable in {EXTRA_KNOWN}"
    )


def group_problems(inv: Inventory) -> list[str]:
    """Host names and the head group."""
    lines = []
    for host in inv.groups.get("all", []):
        try:
            names.check_host_name(host)
        except DsclusterError as exc:
            lines.append(f"{exc}; rename it in {_display(inv.source)}")
    heads = inv.groups.get("head", [])
    if len(heads) != 1:
        held = ", ".join(heads) if heads else "none"
        lines.append(
            f"the inventory has {len(heads)} hosts in group 'head' ({held}); put exactly one "
            f"host under 'head:' in {_display(inv.source)} and the others under 'workers:'"
        )
    both = [h for h in heads if h in inv.groups.get("workers", [])]
    if both:
        lines.append(
            f"{', '.join(both)} is in both 'head' and 'workers'; remove it from 'workers' in "
            f"{_display(inv.source)}"
        )
    return lines


def cluster_wide_problems(inv: Inventory) -> list[str]:
    lines = []
    every = list(inv.groups.get("all", []))
    for name, rule in variables().items():
        if not rule.get("cluster_wide"):
            continue
        values = {
            h: inv.hostvars.get(h, {})[name] for h in every if name in inv.hostvars.get(h, {})
        }
        if len({show_yaml(v) for v in values.values()}) > 1:
            listed = ", ".join(f"{h}={show_yaml(v)}" for h, v in values.items())
            lines.append(
                f"{name} differs between hosts ({listed}); it must be the same on every node: "
                "set it once in group_vars/all"
            )
    return lines


def check_inventory(inv: Inventory) -> None:
    """Raise ONE DsclusterError listing every problem of the inventory, or return."""
    lines = group_problems(inv) + variable_problems(inv) + cluster_wide_problems(inv)
    if not lines:
        return
    if len(lines) == 1:
        raise DsclusterError(lines[0])
    numbered = " ".join(f"({i}) {line}" for i, line in enumerate(lines, start=1))
    raise DsclusterError(
        f"the inventory {_display(inv.source)} has {len(lines)} problems: {numbered}"
    )

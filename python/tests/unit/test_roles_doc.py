"""docs/roles/, the roles reference scripts/roles_doc.py generates with ansible-doc: the
committed pages are what the roles' meta/argument_specs.yml give now, and they cover every
role and every option. ansible-doc (ansible-core, beside this python) is required: without
it the generator fails, and so do these tests."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import subprocess
import sys

import pytest
import yaml

from .. import rolefiles

SCRIPT = rolefiles.REPO / "scripts" / "roles_doc.py"
DOCS = rolefiles.REPO / "docs" / "roles"
SPEC_FILES = ("meta/argument_specs.yml", "meta/argument_specs.yaml")


def _specs() -> dict[str, dict]:
    """{role: argument_specs} read straight from the YAML, not through ansible-doc."""
    found = {}
    for role in sorted(p for p in rolefiles.ROLES.iterdir() if p.is_dir()):
        spec = next((role / f for f in SPEC_FILES if (role / f).is_file()), None)
        if spec is not None:
            found[role.name] = yaml.safe_load(spec.read_text())["argument_specs"]
    return found


def _names(options: dict | None, prefix: str = "") -> list[str]:
    names = []
    for key, spec in sorted((options or {}).items()):
        names.append(prefix + key)
        nested = (spec or {}).get("options") or (spec or {}).get("suboptions")
        names += _names(nested, f"{prefix}{key}.")
    return names


def _section(page: str, entry: str) -> str:
    head = f"## Entry point `{entry}`\n"
    assert head in page, f"no {head.strip()!r}"
    return page.split(head, 1)[1].split("\n## Entry point `", 1)[0]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("roles-doc")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"scripts/roles_doc.py failed: {proc.stderr.strip()}"
    return out


def test_the_committed_reference_is_up_to_date(generated: pathlib.Path):
    want = {p.name: p.read_bytes() for p in generated.glob("*.md")}
    have = {p.name: p.read_bytes() for p in DOCS.glob("*.md")} if DOCS.is_dir() else {}
    stale = sorted(n for n in want.keys() | have.keys() if want.get(n) != have.get(n))
    if stale:
        pytest.fail(
            f"docs/roles/ differs from the roles' argument specs ({', '.join(stale)}): "
            "run `make docs`",
            pytrace=False,
        )


def test_every_role_with_a_spec_has_a_page_with_every_option():
    specs = _specs()
    assert specs, "no role has meta/argument_specs.yml"
    index = (DOCS / "index.md").read_text()
    for role, entries in specs.items():
        page_path = DOCS / f"{role}.md"
        assert page_path.is_file(), f"docs/roles/{role}.md missing: run `make docs`"
        assert f"[{role}.md]({role}.md)" in index, role
        page = page_path.read_text()
        for entry, spec in entries.items():
            section = _section(page, entry)
            for name in _names((spec or {}).get("options")):
                row = f"| `{name}` |"
                aliased = f"| `{name}` (aliases:"
                assert row in section or aliased in section, (role, entry, name)


def test_the_pages_keep_their_prose_within_100_columns():
    for path in sorted(DOCS.glob("*.md")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.startswith("|"):
                assert len(line) <= 100, f"{path.name}:{number}"


@functools.cache
def _module():
    spec = importlib.util.spec_from_file_location("roles_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("text", "cell"),
    [
        ("C(a|b) and I(opt)", r"`a\|b` and *opt*"),
        (
            "B(x) U(https://e.org) L(site, https://e.org/s)",
            "**x** <https://e.org> [site](https://e.org/s)",
        ),
        ("O(name=v) V(a\\)b) E(HOME) P(ns.c.m#module)", "`name=v` `a)b` `HOME` `ns.c.m`"),
        ("<name> *x* [y] a|b", r"\<name\> \*x\* \[y\] a\|b"),
        ("C(has `tick`)", "`` has `tick` ``"),
    ],
)
def test_ansible_markup_becomes_table_safe_markdown(text: str, cell: str):
    roles_doc = _module()
    assert roles_doc._cell(roles_doc.markup(text)) == cell


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("0755", '"0755"'),
        ("", '""'),
        ("abc", "abc"),
        ("{{ x }}", "{{ x }}"),
        (True, "true"),
        ([], "[]"),
        ({"a": 1}, '{"a": 1}'),
        ("yes", '"yes"'),
    ],
)
def test_defaults_are_shown_as_yaml_reads_them(value, shown: str):
    assert _module()._render_value(value) == shown

"""Every module in plugins/modules documents itself as ansible-doc reads it: DOCUMENTATION,
EXAMPLES and RETURN parse as YAML, and every option of the argument spec is documented.
(A ": " inside a plain scalar once broke ansible-doc for cluster_ssh_files.)"""

from __future__ import annotations

import ast
import pathlib

import pytest
import yaml

from .. import rolefiles

MODULES = sorted((rolefiles.REPO / "plugins" / "modules").glob("*.py"))


def _strings(path: pathlib.Path) -> dict[str, str]:
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def test_the_modules_are_there():
    assert {p.stem for p in MODULES} >= {"cluster_ssh_files", "cluster_dirs"}


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_documentation_examples_and_return_are_yaml(path: pathlib.Path):
    texts = _strings(path)
    doc = yaml.safe_load(texts["DOCUMENTATION"])
    assert doc["module"] == path.stem and doc["short_description"]
    assert isinstance(yaml.safe_load(texts["EXAMPLES"]), list)
    assert isinstance(yaml.safe_load(texts["RETURN"]), dict)
    # every option the code declares (argument_spec={"name": ...}) is documented
    source = path.read_text()
    for name in doc.get("options") or {}:
        assert f'"{name}"' in source, (path.stem, name)

"""Every case of the bad-input table (cases_*.py): one line, non-zero exit, nothing changed,
nothing contacted. See harness.py for what each case asserts."""

from __future__ import annotations

import importlib
import pathlib
import pkgutil

import pytest

from .harness import Case, check_one_line, run_case


def _cases() -> list[Case]:
    cases: list[Case] = []
    here = pathlib.Path(__file__).parent
    for info in pkgutil.iter_modules([str(here)]):
        if info.name.startswith("cases_"):
            module = importlib.import_module(f"{__package__}.{info.name}")
            cases.extend(module.CASES)
    return cases


CASES = _cases()


def test_the_table_is_wide():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "case ids repeat"
    assert len(CASES) >= 150, len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path, monkeypatch, capsys):
    check_one_line(case, run_case(case, tmp_path, monkeypatch, capsys))

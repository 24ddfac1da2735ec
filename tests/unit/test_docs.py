"""The interactive examples (``>>>``) in README.md and docs/ run as written."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

import clawstack.common

ROOT = Path(__file__).resolve().parents[2]
PAGES = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))] if ">>> " in p.read_text()]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_in_page(page: Path) -> None:
    globs = {name: getattr(clawstack.common, name) for name in clawstack.common.__all__}
    result = doctest.testfile(str(page), module_relative=False, globs=globs, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} example(s) in {page.name} failed"

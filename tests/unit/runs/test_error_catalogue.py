"""Every error code the supervisor documents is raised by some code path, except codes reserved with a note
that says which work will raise them; a reserved code that is raised must lose its note."""

from __future__ import annotations

import re
from pathlib import Path

from clawstack.runs import errors
from clawstack.runs.errors import STATUS

RUNS = Path(errors.__file__).parent
DOCS = Path(__file__).resolve().parents[3] / "docs" / "runs.md"


def raised() -> set[str]:
    found: set[str] = set()
    for path in RUNS.rglob("*.py"):
        if path.name == "errors.py":
            continue
        found |= set(re.findall(r'(?:RunsError|StartupError)\(\s*"([a-z_]+)"', path.read_text()))
    return found


def reserved() -> set[str]:
    doc = errors.__doc__ or ""
    line = next(line for line in doc.splitlines() if "reserved, raised by no path yet:" in line)
    assert re.search(r"\(.*issue \d+.*\)", line), "a reserved code says which issue will raise it"
    return set(re.findall(r"([a-z_]+) \d{3}", line.split(":", 1)[1]))


def test_every_code_is_raised_or_reserved_with_a_note() -> None:
    unraised = set(STATUS) - raised()
    assert unraised == reserved(), f"never raised and not reserved: {unraised - reserved()}"


def test_no_reserved_code_is_raised() -> None:
    assert reserved() & raised() == set()


def test_every_code_the_docs_name_is_in_the_catalogue_and_raised() -> None:
    named = set(re.findall(r"`([a-z]+(?:_[a-z]+)+)`", DOCS.read_text()))
    codes = {name for name in named if name in STATUS or name.endswith(("_invalid", "_mismatch", "_exceeded"))}
    assert codes <= set(STATUS), codes - set(STATUS)
    assert codes - reserved() <= raised()


def test_every_code_in_the_catalogue_is_documented_in_the_module_tree() -> None:
    doc = errors.__doc__ or ""
    assert all(code in doc for code in STATUS), [code for code in STATUS if code not in doc]

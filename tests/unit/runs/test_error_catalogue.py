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
        found |= set(re.findall(r'(?:RunsError|StartupError|DeliverableError)\(\s*"([a-z_]+)"', path.read_text()))
    return found


def reserved() -> set[str]:
    doc = errors.__doc__ or ""
    line = next((line for line in doc.splitlines() if "reserved, raised by no path yet:" in line), None)
    if line is None:
        return set()
    assert re.search(r"\(.*issue \d+.*\)", line), "a reserved code says which issue will raise it"
    return set(re.findall(r"([a-z_]+) \d{3}", line.split(":", 1)[1]))


def test_every_code_is_raised_or_reserved_with_a_note() -> None:
    unraised = set(STATUS) - raised()
    assert unraised == reserved(), f"never raised and not reserved: {unraised - reserved()}"


def test_no_reserved_code_is_raised() -> None:
    assert reserved() & raised() == set()


def test_every_code_the_docs_name_is_in_the_catalogue_and_raised() -> None:
    text = " ".join(DOCS.read_text().split())
    with_status = re.findall(r"`(\d{3}) ([a-z_]+)`", text)  # e.g. `422 template_unsupported`
    assert with_status
    for status, code in with_status:
        assert STATUS.get(code) == int(status), (status, code)
    refusals = text.split("Launch refusals, in the order they are decided:", 1)[1].split("All are decided", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", refusals)) - {"current_template_id", "home"}  # fields, not codes
    assert {"digest_invalid", "template_changed", "template_unsupported"} <= listed
    documented = listed | {code for _, code in with_status}
    assert documented <= set(STATUS), documented - set(STATUS)
    assert documented - reserved() <= raised()


def test_every_code_in_the_catalogue_is_documented_in_the_module_tree() -> None:
    doc = errors.__doc__ or ""
    assert all(code in doc for code in STATUS), [code for code in STATUS if code not in doc]

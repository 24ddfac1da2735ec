"""The ledger's durability and queries, answer extraction, and admission parsing without a server."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.common.digest import spec_digest
from clawstack.runs.admission import parse_launch
from clawstack.runs.errors import RunsError
from clawstack.runs.ledger import Ledger, RunRecord
from clawstack.worker.contract import extract_answer


def record(run_id: str = "r1", state: str = "accepted") -> RunRecord:
    return RunRecord(
        installation="acme",
        run_id=run_id,
        generation=1,
        spec_digest="sha256:x",
        spec={"template": "w", "task": "t"},
        template="w",
        template_id="sha256:t",
        models=[{"slot": "primary", "ref": "local/m"}],
        tools=[],
        authority_expires_at="2030-01-01T00:00:00Z",
        accepted_at="2026-01-01T00:00:00Z",
        state=state,  # type: ignore[arg-type]
    )


def test_records_survive_a_reopen_and_unfinished_lists_the_rest(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs")
    ledger.open()
    for run_id, state in (("a", "accepted"), ("b", "running"), ("c", "stopped"), ("d", "failed"), ("e", "revoking")):
        ledger.insert(record(run_id, state))
    changed = ledger.get("acme", "a")
    assert changed is not None
    changed.cancelled = True
    ledger.update(changed)
    ledger.tombstone("acme", "z", 4, "2026-01-01T00:00:00Z")
    ledger.close()
    again = Ledger(tmp_path / "runs")
    again.open()
    assert sorted(r.run_id for r in again.unfinished()) == ["a", "b", "e"]
    assert again.get("acme", "a").cancelled is True  # type: ignore[union-attr]
    assert again.tombstoned("acme", "z").generation == 4  # type: ignore[union-attr]
    assert again.tombstone("acme", "z", 9, "later").generation == 4  # a tombstone is never rewritten
    assert again.count() == 5
    assert stat.S_IMODE(os.stat(tmp_path / "runs").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(again.path).st_mode) == 0o600
    again.close()


@pytest.mark.parametrize(
    ("stdout", "limit", "expected"),
    [
        (b"\n\xf0\x9f\xa6\x9e hello\n", 100, (b"hello", False)),
        (
            b"noise\n\xf0\x9f\xa6\x9e first \n\xf0\x9f\xa6\x9e second\n",
            100,
            (b"first \n\xf0\x9f\xa6\x9e second", False),
        ),
        (b"no marker here", 100, None),
        (b"\xf0\x9f\xa6\x9e at the start has no newline", 100, None),
        (b"\n\xf0\x9f\xa6\x9e 0123456789\n", 4, (b"0123", True)),
        ("\n🦞 ééé\n".encode(), 3, ("é".encode(), True)),  # never split a UTF-8 character
    ],
)
def test_extract_answer(stdout: bytes, limit: int, expected: tuple[bytes, bool] | None) -> None:
    assert extract_answer(stdout, limit) == expected


@given(st.text(), st.integers(min_value=1, max_value=50))
def test_extracted_answers_are_valid_utf8_prefixes(answer: str, limit: int) -> None:
    got = extract_answer(("\n🦞 " + answer + "\n").encode(), limit)
    assert got is not None
    text, truncated = got
    decoded = text.decode("utf-8")
    assert answer.startswith(decoded)
    assert len(text) <= limit
    assert truncated == (len(answer.encode()) > limit)


def body(**change: object) -> bytes:
    spec = {
        "template": "worker",
        "task": "Summarize ticket 42",
        "tools": ["ticket-api.get_ticket"],
        "max_runtime_seconds": 900,
    }
    data = {
        "installation": "acme",
        "run_id": "r-1",
        "generation": 1,
        "spec_digest": spec_digest(spec),
        "spec": spec,
        "authority_expires_at": "2030-01-01T00:00:00Z",
        **change,
    }
    return json.dumps(data).encode()


def test_parse_launch_accepts_the_spec_example() -> None:
    launch = parse_launch(body())
    assert launch.spec["task"] == "Summarize ticket 42"
    assert launch.generation == 1


@pytest.mark.parametrize(
    "raw",
    [
        body(installation="-acme"),
        body(installation="a" * 65),
        body(run_id=""),
        body(run_id="x" * 129),
        body(generation=-1),
        body(generation=9007199254740992),
        body(spec_digest="sha256:0"),
        body(credential=""),
        body(credential="has space"),
        body(authority_expires_at="tomorrow"),
        body(surprise=True),
        b'{"installation": "acme"}',
    ],
)
def test_parse_launch_refusals(raw: bytes) -> None:
    with pytest.raises(RunsError) as info:
        parse_launch(raw)
    assert info.value.code in ("request_invalid", "digest_invalid")
    assert "Summarize ticket 42" not in info.value.message

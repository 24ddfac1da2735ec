"""GET /v1/runs without a server: the query's rules (a table and a property: nothing malformed is accepted), the
cursor, the ledger's page order and filters, and the migration of a version-1 ledger."""

from __future__ import annotations

import base64
import json
import random
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.runs.errors import RunsError
from clawstack.runs.ledger import Ledger, Listed, Position, RunRecord
from clawstack.runs.listing import ListQuery, decode_cursor, encode_cursor, parse_query, split_page

# The spec's words, written out again here rather than imported: the test must fail if the code drifts from them.
INSTALLATION = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
STATES = ("accepted", "running", "revoking", "revoked", "stopped", "failed")
NAMES = ("installation", "state", "limit", "cursor")
A_CURSOR = encode_cursor(Position("2026-01-01T00:00:00Z", 17))


def make_record(run_id: str, *, installation: str = "acme", state: str = "stopped", accepted_at: str) -> RunRecord:
    return RunRecord(
        installation=installation,
        run_id=run_id,
        generation=1,
        spec_digest="sha256:x",
        spec={"template": "worker", "task": "secret task text"},
        template="worker",
        template_id="sha256:t",
        models=[],
        tools=[],
        authority_expires_at="2030-01-01T00:00:00Z",
        accepted_at=accepted_at,
        state=state,  # type: ignore[arg-type]
    )


def refused(pairs: list[tuple[str, str]]) -> RunsError:
    with pytest.raises(RunsError) as info:
        parse_query(pairs)
    assert (info.value.code, info.value.status) == ("request_invalid", 400)
    return info.value


def test_defaults_and_every_parameter() -> None:
    assert parse_query([]) == ListQuery(installation=None, state=None, limit=100, after=None)
    query = parse_query([("installation", "acme-2"), ("state", "failed"), ("limit", "500"), ("cursor", A_CURSOR)])
    assert query == ListQuery("acme-2", "failed", 500, Position("2026-01-01T00:00:00Z", 17))
    assert parse_query([("limit", "1")]).limit == 1
    assert parse_query([("limit", "007")]).limit == 7  # a decimal integer, whatever its leading zeros
    for state in STATES:
        assert parse_query([("state", state)]).state == state


BAD_QUERIES: list[tuple[str, list[tuple[str, str]]]] = [
    ("unknown parameter", [("wait", "stopped")]),
    ("parameter names are case-sensitive", [("Limit", "5")]),
    ("repeated limit", [("limit", "5"), ("limit", "5")]),
    ("repeated state", [("state", "running"), ("state", "failed")]),
    ("repeated cursor", [("cursor", A_CURSOR), ("cursor", A_CURSOR)]),
    ("repeated installation", [("installation", "acme"), ("installation", "beta")]),
    ("limit zero", [("limit", "0")]),
    ("limit above 500", [("limit", "501")]),
    ("negative limit", [("limit", "-1")]),
    ("signed limit", [("limit", "+5")]),
    ("fractional limit", [("limit", "1.5")]),
    ("limit with a space", [("limit", " 5")]),
    ("limit word", [("limit", "ten")]),
    ("limit in other digits", [("limit", "\u0665")]),
    ("empty limit", [("limit", "")]),
    ("huge limit", [("limit", "9" * 5000)]),
    ("unknown state", [("state", "cancelled")]),
    ("state in capitals", [("state", "Running")]),
    ("empty state", [("state", "")]),
    ("upper-case installation", [("installation", "Acme")]),
    ("installation starting with a hyphen", [("installation", "-acme")]),
    ("installation too long", [("installation", "a" * 65)]),
    ("installation with a newline", [("installation", "acme\n")]),
    ("empty installation", [("installation", "")]),
    ("empty cursor", [("cursor", "")]),
    ("cursor with padding", [("cursor", A_CURSOR + "=")]),
    ("truncated cursor", [("cursor", A_CURSOR[:-3])]),
    ("cursor outside the alphabet", [("cursor", A_CURSOR + "!")]),
    ("cursor too long", [("cursor", "A" * 600)]),
]


@pytest.mark.parametrize(("name", "pairs"), BAD_QUERIES, ids=[b[0] for b in BAD_QUERIES])
def test_bad_queries_are_request_invalid(name: str, pairs: list[tuple[str, str]]) -> None:
    refused(pairs)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "payload",
    [
        b'["2026-01-01T00:00:00Z"]',
        b'["2026-01-01T00:00:00Z",1,"x"]',
        b'{"accepted_at":"2026-01-01T00:00:00Z","seq":1}',
        b'["2026-01-01T00:00:00Z","acme","r-1"]',  # the shape of an older listing's cursor
        b'["2026-01-01T00:00:00Z","1"]',
        b'["2026-01-01T00:00:00Z",0]',
        b'["2026-01-01T00:00:00Z",-3]',
        b'["2026-01-01T00:00:00Z",1.0]',
        b'["2026-01-01T00:00:00Z",true]',
        b'["2026-01-01T00:00:00Z",9223372036854775808]',
        b'["2026-01-01 00:00:00Z",1]',
        b'["2026-02-30T00:00:00Z",1]',
        b'["2026-01-01T00:00:00+00:00",1]',
        b'["2026-01-01T00:00:00Z", 1]',  # not the spelling this listing issues
        b'["2026-01-01T00:00:00Z",01]',
        b"\xff\xfe",
        b"null",
    ],
)
def test_cursors_not_issued_by_the_listing_are_refused(payload: bytes) -> None:
    refused([("cursor", b64(payload))])


def test_a_cursor_is_opaque_and_round_trips() -> None:
    position = Position("2026-11-10T21:30:00Z", 2**63 - 1)
    cursor = encode_cursor(position)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", cursor)
    assert len(cursor) <= 512
    assert decode_cursor(cursor) == position


@st.composite
def queries(draw: st.DrawFn) -> list[tuple[str, str]]:
    """Queries near the valid ones: known and unknown names, repeats, good values, values one edit away, junk."""
    value = st.one_of(
        st.sampled_from(["acme", "a" * 64, "a" * 65, "Acme", "-a", "0", "1", "100", "500", "501", "0500", "-5"]),
        st.sampled_from([*STATES, "cancelled", "RUNNING", "", " ", A_CURSOR, A_CURSOR[:-1], A_CURSOR + "A"]),
        st.integers(min_value=-10, max_value=10_000).map(str),
        st.text(max_size=80),
        st.builds(lambda raw: b64(raw), st.binary(max_size=120)),
        st.builds(
            lambda parts: b64(json.dumps(parts, separators=(",", ":")).encode()),
            st.lists(st.text(max_size=20), max_size=4),
        ),
    )
    name = st.one_of(st.sampled_from(NAMES), st.sampled_from(["Limit", "wait", "", "state "]), st.text(max_size=10))
    return draw(st.lists(st.tuples(name, value), max_size=5))


def well_formed(pairs: list[tuple[str, str]], query: ListQuery) -> bool:
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names) or not set(names) <= set(NAMES):
        return False
    given_ = dict(pairs)
    if "installation" in given_ and not (
        INSTALLATION.fullmatch(given_["installation"]) and query.installation == given_["installation"]
    ):
        return False
    if "state" in given_ and not (given_["state"] in STATES and query.state == given_["state"]):
        return False
    if "limit" in given_:
        text = given_["limit"]
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 500 and query.limit == int(text)):
            return False
    elif query.limit != 100:
        return False
    if "cursor" in given_:
        position = query.after
        if position is None or encode_cursor(position) != given_["cursor"]:
            return False
        if not (type(position.seq) is int and 1 <= position.seq < 2**63):
            return False
        if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", position.accepted_at):
            return False
    return True


@settings(max_examples=400)
@given(queries())
def test_no_malformed_query_is_accepted(pairs: list[tuple[str, str]]) -> None:
    try:
        query = parse_query(pairs)
    except RunsError as exc:
        error = exc
    else:
        assert well_formed(pairs, query), (pairs, query)
        return
    assert (error.code, error.status) == ("request_invalid", 400)


def test_split_page_gives_a_cursor_only_when_more_follow() -> None:
    records = [make_record(f"r{i}", accepted_at="2026-01-01T00:00:00Z") for i in range(4)]
    listed = [Listed(Position("2026-01-01T00:00:00Z", 10 - i), record) for i, record in enumerate(records)]
    assert split_page(listed[:3], 3) == (records[:3], None)
    page, cursor = split_page(listed, 3)
    assert page == records[:3]
    assert cursor is not None
    assert decode_cursor(cursor) == Position("2026-01-01T00:00:00Z", 8)


def test_the_ledger_pages_newest_first_with_ties_and_filters(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs")
    ledger.open()
    rng = random.Random(7)
    records = [
        make_record(
            f"r{i}",
            installation=rng.choice(["acme", "beta", "c"]),
            state=rng.choice(STATES),
            accepted_at=f"2026-01-01T00:00:{rng.randrange(5):02d}Z",  # many ties within a second
        )
        for i in range(200)
    ]
    for record in records:
        ledger.insert(record)
    admitted = {record.run_id: n for n, record in enumerate(records)}

    def order(record: RunRecord) -> tuple[str, int]:
        return record.accepted_at, admitted[record.run_id]

    for installation in (None, "acme", "c"):
        for state in (None, "failed", "running"):
            expected = sorted(
                (r for r in records if installation in (None, r.installation) and state in (None, r.state)),
                key=order,
                reverse=True,
            )
            seen: list[RunRecord] = []
            after: Position | None = None
            while True:
                page = ledger.page(installation=installation, state=state, after=after, limit=7)
                seen.extend(entry.record for entry in page)
                if len(page) < 7:
                    break
                after = page[-1].position
            assert [order(r) for r in seen] == [order(r) for r in expected]
    ledger.close()


# The version-1 ledger, exactly as that code created it.
V1_SCHEMA = (
    """CREATE TABLE runs (
        installation TEXT NOT NULL, run_id TEXT NOT NULL, state TEXT NOT NULL, record TEXT NOT NULL,
        PRIMARY KEY (installation, run_id))""",
    "CREATE INDEX runs_state ON runs (state)",
    """CREATE TABLE tombstones (
        installation TEXT NOT NULL, run_id TEXT NOT NULL, generation INTEGER NOT NULL, cancelled_at TEXT NOT NULL,
        PRIMARY KEY (installation, run_id))""",
)


def write_v1_ledger(path: Path, records: list[RunRecord]) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    for statement in V1_SCHEMA:
        db.execute(statement)
    for r in records:
        db.execute("INSERT INTO runs VALUES (?,?,?,?)", (r.installation, r.run_id, r.state, r.to_json()))
    db.execute("INSERT INTO tombstones VALUES ('acme', 'gone', 2, '2025-12-01T00:00:00Z')")
    db.execute("PRAGMA user_version=1")
    db.close()
    path.chmod(0o600)


def test_a_version_1_ledger_is_migrated_in_place_and_lists_its_runs(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    old = [
        make_record("old-a", accepted_at="2025-06-01T10:00:00Z", state="failed"),
        make_record("old-b", accepted_at="2025-06-02T10:00:00Z"),
        make_record("old-c", installation="beta", accepted_at="2025-06-02T10:00:00Z", state="running"),
    ]
    write_v1_ledger(runs_dir / "ledger.sqlite3", old)
    ledger = Ledger(runs_dir)
    ledger.open()
    try:
        assert ledger.count() == 3
        assert ledger.get("acme", "old-a") == old[0]
        assert [r.run_id for r in ledger.unfinished()] == ["old-c"]
        assert ledger.tombstoned("acme", "gone") is not None
        listed = [entry.record.run_id for entry in ledger.page(limit=10)]
        assert listed == ["old-c", "old-b", "old-a"]  # a tie: the one admitted last first
        assert [entry.record.run_id for entry in ledger.page(state="failed", limit=10)] == ["old-a"]
        ledger.insert(make_record("new", accepted_at="2026-01-01T00:00:00Z"))
        assert [entry.record.run_id for entry in ledger.page(limit=1)] == ["new"]
    finally:
        ledger.close()
    db = sqlite3.connect(runs_dir / "ledger.sqlite3")
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        filled: dict[Any, Any] = dict(db.execute("SELECT run_id, accepted_at FROM runs").fetchall())
        assert filled == {
            "old-a": "2025-06-01T10:00:00Z",
            "old-b": "2025-06-02T10:00:00Z",
            "old-c": "2025-06-02T10:00:00Z",
            "new": "2026-01-01T00:00:00Z",
        }
        plan = db.execute("EXPLAIN QUERY PLAN SELECT record FROM runs ORDER BY accepted_at DESC, seq DESC").fetchall()
        assert "USING INDEX" in str(plan)
        assert "TEMP B-TREE" not in str(plan)
    finally:
        db.close()
    assert [
        row[0] for row in sqlite3.connect(runs_dir / "ledger.sqlite3").execute("SELECT seq FROM runs ORDER BY seq")
    ] == [1, 2, 3, 4]
    again = Ledger(runs_dir)  # a second open finds version 3 and migrates nothing
    again.open()
    assert again.count() == 4
    again.close()


def test_a_failed_migration_leaves_the_version_1_ledger_as_it_was(tmp_path: Path) -> None:
    from clawstack.runs.ledger import LedgerError

    runs_dir = tmp_path / "runs"
    write_v1_ledger(runs_dir / "ledger.sqlite3", [make_record("ok", accepted_at="2025-06-01T10:00:00Z")])
    db = sqlite3.connect(runs_dir / "ledger.sqlite3", isolation_level=None)
    db.execute("INSERT INTO runs VALUES ('acme', 'broken', 'stopped', '{\"no\": \"accepted_at\"}')")
    db.close()
    ledger = Ledger(runs_dir)
    with pytest.raises(LedgerError):
        ledger.open()
    db = sqlite3.connect(runs_dir / "ledger.sqlite3")
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
        columns = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
        assert columns == ["installation", "run_id", "state", "record"]
    finally:
        db.close()

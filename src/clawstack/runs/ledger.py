"""The run ledger: one durable record per run, and tombstones, in SQLite (WAL, ``synchronous=FULL``).

The supervisor is the only writer. Every write commits (and so reaches the disk) before the call returns, so an
API answer built from a record never reports state that a crash could lose. A record is stored as JSON beside the
columns the supervisor queries; :class:`RunRecord` is the whole truth about a run.

Schema versions: 1 had ``runs (installation, run_id, state, record)``; 2 adds ``accepted_at`` (filled from each
record when a version-1 file is opened); 3 adds ``seq``, the order of admission (1, 2, 3, … as runs are inserted;
filled from the rows' insertion order when an older file is opened), and the indexes that serve
:meth:`Ledger.page`.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

from clawstack.common.errors import ClawError
from clawstack.common.files import ensure_private_dir
from clawstack.common.sqlite import DatabaseError, open_database

State = Literal["accepted", "running", "revoking", "revoked", "stopped", "failed"]
TERMINAL: Final = frozenset({"stopped", "failed"})
ORDER: Final = {"accepted": 0, "running": 1, "revoking": 2, "revoked": 3, "stopped": 4, "failed": 4}


class LedgerError(ClawError):
    code = "ledger_unavailable"


@dataclass(slots=True)
class RunRecord:
    """Everything the supervisor knows about one run."""

    installation: str
    run_id: str
    generation: int
    spec_digest: str
    spec: dict[str, Any]
    template: str
    template_id: str
    models: list[dict[str, Any]]
    tools: list[str]
    authority_expires_at: str
    accepted_at: str
    state: State = "accepted"
    cancelled: bool = False
    max_runtime_seconds: int = 0
    run_agent_id: str | None = None
    revoked: bool = False
    revocation_proof: str | None = None
    exit_code: int | None = None
    failure: str | None = None
    result_bytes: int | None = None
    result_truncated: bool = False
    credential: Literal["held", "missing", "none"] = "none"
    callbacks: dict[str, str] = field(default_factory=lambda: {"start": "skipped", "end": "skipped"})
    deadline: str | None = None
    started_at: str | None = None
    exited_at: str | None = None
    ended_at: str | None = None
    pending: str | None = None
    capture_epoch: int | None = None
    capture_epoch_observed_at: str | None = None
    isolation: dict[str, Any] | str | None = None  # an IsolationReport; older ledgers hold a bare mechanism name
    spawned: bool = False  # a worker was asked to start (so start is owed before end)
    failure_detail: str | None = None  # why a permanent refusal ended the run (an error code, never a message)
    authority_ended: bool = False  # a callback was answered 401/403: nothing more is sent with the credential
    home: str | None = None  # a task-home run's home id: reserved while the run is not terminal
    result_outcome: str | None = None  # a task-home run's result: "answer" or "question"
    result_session: str | None = None  # the harness session that holds a task-home run's turn
    exit_observed: dict[str, int] | None = None  # what the worker's wrapper reported beyond its exit code
    subnet: str | None = None  # a compose task-home run's network block, held while the run is not terminal
    served_by: dict[str, int] | None = None  # a task-home run's model calls by credential class, as the proxy said
    served_by_complete: bool | None = None  # one proxy process counted the whole run, and its report was well formed
    last_plan_failure: str | None = None  # the most recent plan-route reason the proxy recorded for the run

    @property
    def key(self) -> tuple[str, str]:
        return self.installation, self.run_id

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        return cls(**json.loads(text))


class Position(NamedTuple):
    """A run's place in the listing order: newest ``accepted_at`` first, and among runs accepted in the same second
    the one admitted last first (``seq``, descending): the order is total and never changes."""

    accepted_at: str
    seq: int


class Listed(NamedTuple):
    """A run as a listing reads it: its place in the order and its record."""

    position: Position
    record: RunRecord


@dataclass(frozen=True, slots=True)
class Tombstone:
    installation: str
    run_id: str
    generation: int
    cancelled_at: str


#: The ledger's ``user_version``.
SCHEMA_VERSION = 3

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS runs (
        installation TEXT NOT NULL, run_id TEXT NOT NULL, state TEXT NOT NULL, record TEXT NOT NULL,
        accepted_at TEXT NOT NULL DEFAULT '', seq INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (installation, run_id))""",
    "CREATE UNIQUE INDEX IF NOT EXISTS runs_seq ON runs (seq)",
    # The listing's order: over all runs, within one installation, and within one state.
    "CREATE INDEX IF NOT EXISTS runs_listing ON runs (accepted_at, seq)",
    "CREATE INDEX IF NOT EXISTS runs_installation_listing ON runs (installation, accepted_at, seq)",
    "CREATE INDEX IF NOT EXISTS runs_state_listing ON runs (state, accepted_at, seq)",
    """CREATE TABLE IF NOT EXISTS tombstones (
        installation TEXT NOT NULL, run_id TEXT NOT NULL, generation INTEGER NOT NULL, cancelled_at TEXT NOT NULL,
        PRIMARY KEY (installation, run_id))""",
)


def _migrate(db: sqlite3.Connection, found: int) -> None:
    """Bring a ledger of version ``found`` to the shape :data:`_SCHEMA` expects (inside its transaction)."""
    if found < 2:
        db.execute("ALTER TABLE runs ADD COLUMN accepted_at TEXT NOT NULL DEFAULT ''")
        rows = db.execute("SELECT installation, run_id, record FROM runs").fetchall()
        for installation, run_id, text in rows:
            try:
                accepted_at = str(json.loads(text)["accepted_at"])
            except (ValueError, KeyError, TypeError) as exc:
                raise DatabaseError("a run record cannot be read to migrate the ledger") from exc
            db.execute(
                "UPDATE runs SET accepted_at=? WHERE installation=? AND run_id=?", (accepted_at, installation, run_id)
            )
        db.execute("DROP INDEX IF EXISTS runs_state")  # runs_state_listing also leads with state
    if found < 3:
        db.execute("ALTER TABLE runs ADD COLUMN seq INTEGER NOT NULL DEFAULT 0")
        db.execute("UPDATE runs SET seq = rowid")  # no row was ever deleted: rowid is the order of insertion
        for index in ("runs_accepted", "runs_installation_accepted", "runs_state_accepted"):
            db.execute(f"DROP INDEX IF EXISTS {index}")


class Ledger:
    """The durable store of runs. Not thread-safe: the supervisor's event loop is its one writer."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "ledger.sqlite3"
        self._db: sqlite3.Connection | None = None

    def open(self) -> None:
        ensure_private_dir(self.path.parent)
        try:
            self._db = open_database(self.path, _SCHEMA, SCHEMA_VERSION, migrate=_migrate)
        except (sqlite3.Error, DatabaseError) as exc:
            raise LedgerError("the run ledger cannot be opened") from exc

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise LedgerError("the run ledger is closed")
        return self._db

    def get(self, installation: str, run_id: str) -> RunRecord | None:
        row = self._query("SELECT record FROM runs WHERE installation=? AND run_id=?", (installation, run_id))
        return RunRecord.from_json(row[0][0]) if row else None

    def insert(self, record: RunRecord) -> None:
        self._write(
            "INSERT INTO runs (installation, run_id, state, record, accepted_at, seq) "
            "VALUES (?,?,?,?,?, (SELECT coalesce(max(seq), 0) + 1 FROM runs))",
            (record.installation, record.run_id, record.state, record.to_json(), record.accepted_at),
        )

    def update(self, record: RunRecord) -> None:
        self._write(
            "UPDATE runs SET state=?, record=? WHERE installation=? AND run_id=?",
            (record.state, record.to_json(), record.installation, record.run_id),
        )

    def home_holder(self, installation: str, home: str) -> RunRecord | None:
        """The run that reserves ``home`` of ``installation`` (one that is not terminal yet), if any."""
        rows = self._query(
            "SELECT record FROM runs WHERE installation=? AND state NOT IN ('stopped', 'failed') "
            "AND json_extract(record, '$.home') = ? LIMIT 1",
            (installation, home),
        )
        return RunRecord.from_json(rows[0][0]) if rows else None

    def unfinished(self) -> list[RunRecord]:
        rows = self._query("SELECT record FROM runs WHERE state NOT IN ('stopped', 'failed')", ())
        return [RunRecord.from_json(row[0]) for row in rows]

    def ended_with_credential_held(self) -> list[RunRecord]:
        """Terminal runs that hold a callback credential (one may still owe a callback: a crash came between)."""
        rows = self._query(
            "SELECT record FROM runs WHERE state IN ('stopped', 'failed') AND json_extract(record, '$.credential') = 'held'",
            (),
        )
        return [RunRecord.from_json(row[0]) for row in rows]

    def page(
        self,
        *,
        installation: str | None = None,
        state: State | None = None,
        after: Position | None = None,
        limit: int,
    ) -> list[Listed]:
        """At most ``limit`` runs in listing order (see :class:`Position`) that match ``installation`` and
        ``state``, starting just after ``after``. Filters and the bound are both applied in SQL, on an index."""
        where: list[str] = []
        params: list[Any] = []
        if installation is not None:
            where.append("installation=?")
            params.append(installation)
        if state is not None:
            where.append("state=?")
            params.append(state)
        if after is not None:
            where.append("(accepted_at, seq) < (?,?)")
            params.extend(after)
        # Only these fixed clauses are joined in; every value is a bound parameter. One statement per combination
        # (rather than "? IS NULL OR …") lets SQLite pick the matching index.
        clause = " WHERE " + " AND ".join(where) if where else ""
        sql = f"SELECT record, accepted_at, seq FROM runs{clause} ORDER BY accepted_at DESC, seq DESC LIMIT ?"  # noqa: S608
        rows = self._query(sql, (*params, limit))
        return [Listed(Position(str(row[1]), int(row[2])), RunRecord.from_json(row[0])) for row in rows]

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM runs", ())[0][0])

    def tombstone(self, installation: str, run_id: str, generation: int, cancelled_at: str) -> Tombstone:
        existing = self.tombstoned(installation, run_id)
        if existing is not None:
            return existing
        self._write("INSERT INTO tombstones VALUES (?,?,?,?)", (installation, run_id, generation, cancelled_at))
        return Tombstone(installation, run_id, generation, cancelled_at)

    def tombstoned(self, installation: str, run_id: str) -> Tombstone | None:
        rows = self._query(
            "SELECT generation, cancelled_at FROM tombstones WHERE installation=? AND run_id=?", (installation, run_id)
        )
        return Tombstone(installation, run_id, int(rows[0][0]), str(rows[0][1])) if rows else None

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        try:
            return self._conn().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise LedgerError("the run ledger cannot be read") from exc

    def _write(self, sql: str, params: tuple[Any, ...]) -> None:
        try:
            self._conn().execute(sql, params)
        except sqlite3.Error as exc:
            raise LedgerError("the run ledger cannot be written") from exc


def count_unfinished(runs_dir: Path) -> int:
    """How many runs in the ledger under ``runs_dir`` are not terminal (0 when there is no ledger)."""
    if not (runs_dir / "ledger.sqlite3").exists():
        return 0
    ledger = Ledger(runs_dir)
    ledger.open()
    try:
        return len(ledger.unfinished())
    finally:
        ledger.close()


__all__ = [
    "ORDER",
    "SCHEMA_VERSION",
    "TERMINAL",
    "Ledger",
    "LedgerError",
    "Listed",
    "Position",
    "RunRecord",
    "State",
    "Tombstone",
    "count_unfinished",
]

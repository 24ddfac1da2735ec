"""Native-child custody: the durable record of every native child, its parent incarnation and its completion.

A native child is a one-shot background run spawned for a requester session (by the model-facing
``sessions_spawn`` tool). Its record names the child's run and session, the parent session key and the parent's
**incarnation** (the parent's ``session_id`` when it spawned: a reset parent is a new incarnation and no longer
owns the child), the spawning run, the child's spawn depth, its label and options, its execution state and, once it
ended, its **completion**: ``done``, ``failed``, ``killed`` or ``timeout``, with the complete final answer up to
:data:`MAX_RESULT_BYTES` (``result_truncated`` when it was longer), the error and the token usage.

Execution states: ``queued`` (recorded, waiting for a subagent slot), ``running``, ``terminal`` (ended, with a
completion) and ``interrupted`` (the gateway stopped while it was queued or running; :meth:`ChildStore.recover`
records it at start-up with completion ``failed``, so a waiter gets an answer and nothing runs twice). A child
whose session was archived keeps its record and completion.

One :class:`ChildStore` owns one SQLite file (WAL, ``synchronous=FULL``, an exclusive writer lock); every write is
committed before the method returns. Methods block: call them from a thread. Errors are
:class:`~clawstack.gateway.sessions.SessionStoreError` (``session_store_unavailable``) and
:class:`~clawstack.gateway.sessions.SessionStoreLockedError` (``session_store_locked``).
"""

# ruff: noqa: S608  (queries interpolate only this module's column-list constant; values are bound parameters)

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from clawstack.common.sqlite import DatabaseError, DatabaseLockedError, WriterDatabase
from clawstack.gateway.sessions import SessionStoreError, SessionStoreLockedError

__all__ = [
    "COMPLETION_STATES",
    "INTERRUPTED_CHILD_ERROR",
    "MAX_RESULT_BYTES",
    "NATIVE_OWNER",
    "ChildRecord",
    "ChildStore",
    "Completion",
    "Execution",
    "PluginOwner",
    "cut_result",
]

Completion = Literal["done", "failed", "killed", "timeout"]
Execution = Literal["queued", "running", "terminal", "interrupted"]
COMPLETION_STATES: Final[frozenset[str]] = frozenset({"done", "failed", "killed", "timeout"})

#: The owner recorded on every native child's session: no chat, channel, hook or plugin run can land in one.
NATIVE_OWNER: Final = "native"
#: The complete final answer a completion keeps (UTF-8 bytes); a longer one is cut and marked truncated.
MAX_RESULT_BYTES: Final = 100_000
INTERRUPTED_CHILD_ERROR: Final = "interrupted: the gateway stopped while this child was in flight"

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS children (
        run_id TEXT PRIMARY KEY, child_key TEXT NOT NULL, agent_id TEXT NOT NULL,
        parent_key TEXT NOT NULL, parent_session_id TEXT NOT NULL, parent_run_id TEXT NOT NULL,
        depth INTEGER NOT NULL, label TEXT, task_name TEXT, context TEXT NOT NULL, blind INTEGER NOT NULL,
        cleanup TEXT NOT NULL, model TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
        execution TEXT NOT NULL, completion TEXT, result TEXT, result_truncated INTEGER NOT NULL DEFAULT 0,
        error TEXT, usage TEXT, ended_at_ms INTEGER, archived_at_ms INTEGER)""",
    "CREATE INDEX IF NOT EXISTS children_parent ON children (parent_key, created_at_ms)",
    "CREATE INDEX IF NOT EXISTS children_execution ON children (execution)",
    "CREATE UNIQUE INDEX IF NOT EXISTS children_child_key ON children (child_key)",
    # Version 2: the plugin that accepted a child through its native facade, captured by the host with the child.
    """CREATE TABLE IF NOT EXISTS plugin_children (
        run_id TEXT PRIMARY KEY REFERENCES children (run_id), plugin_id TEXT NOT NULL, request_id TEXT,
        request_digest TEXT NOT NULL, output_schema TEXT, profile TEXT, thinking TEXT)""",
    "CREATE INDEX IF NOT EXISTS plugin_children_request ON plugin_children (plugin_id, request_id)",
)
_COLUMNS: Final = (
    "run_id, child_key, agent_id, parent_key, parent_session_id, parent_run_id, depth, label, task_name, context, "
    "blind, cleanup, model, created_at_ms, execution, completion, result, result_truncated, error, usage, "
    "ended_at_ms, archived_at_ms"
)
_QUALIFIED: Final = ", ".join(f"c.{name.strip()}" for name in _COLUMNS.split(","))
SCHEMA_VERSION: Final = 2


@dataclass(frozen=True, slots=True)
class ChildRecord:
    """One native child (see the module docstring). Times are milliseconds since the Unix epoch."""

    run_id: str
    child_key: str
    agent_id: str
    parent_key: str
    parent_session_id: str
    parent_run_id: str
    depth: int
    label: str | None
    task_name: str | None
    context: Literal["isolated", "fork"]
    blind: bool
    cleanup: Literal["keep", "delete"]
    model: str
    created_at_ms: int
    execution: Execution = "queued"
    completion: Completion | None = None
    result: str | None = None
    result_truncated: bool = False
    error: str | None = None
    usage: dict[str, int] | None = None
    ended_at_ms: int | None = None
    archived_at_ms: int | None = None

    @property
    def active(self) -> bool:
        """Whether the child is still queued or running."""
        return self.execution in ("queued", "running")


def cut_result(text: str) -> tuple[str, bool]:
    """``text`` cut to :data:`MAX_RESULT_BYTES` UTF-8 bytes (never inside a character), and whether it was cut."""
    data = text.encode("utf-8")
    if len(data) <= MAX_RESULT_BYTES:
        return text, False
    return data[:MAX_RESULT_BYTES].decode("utf-8", errors="ignore"), True


def _row(record: ChildRecord) -> tuple[Any, ...]:
    return (
        record.run_id,
        record.child_key,
        record.agent_id,
        record.parent_key,
        record.parent_session_id,
        record.parent_run_id,
        record.depth,
        record.label,
        record.task_name,
        record.context,
        int(record.blind),
        record.cleanup,
        record.model,
        record.created_at_ms,
        record.execution,
        record.completion,
        record.result,
        int(record.result_truncated),
        record.error,
        None if record.usage is None else json.dumps(record.usage),
        record.ended_at_ms,
        record.archived_at_ms,
    )


def _record(row: Sequence[Any]) -> ChildRecord:
    return ChildRecord(
        run_id=row[0],
        child_key=row[1],
        agent_id=row[2],
        parent_key=row[3],
        parent_session_id=row[4],
        parent_run_id=row[5],
        depth=int(row[6]),
        label=row[7],
        task_name=row[8],
        context=row[9],
        blind=bool(row[10]),
        cleanup=row[11],
        model=row[12],
        created_at_ms=int(row[13]),
        execution=row[14],
        completion=row[15],
        result=row[16],
        result_truncated=bool(row[17]),
        error=row[18],
        usage=None if row[19] is None else json.loads(row[19]),
        ended_at_ms=row[20],
        archived_at_ms=row[21],
    )


@dataclass(frozen=True, slots=True)
class PluginOwner:
    """The plugin that accepted a child through its native facade: its id, the spawn's ``request_id`` (replay
    key within the parent turn), a digest of the spawn's arguments (a replay with other arguments is refused), the
    output schema its collector enforces, its ``subagentProfile`` record, and the thinking level the child runs with
    (a control of the child's own, reported as ``resolved`` in selection receipts)."""

    plugin_id: str
    request_id: str | None
    request_digest: str
    output_schema: Mapping[str, Any] | None = None
    profile: Mapping[str, str] | None = None
    thinking: str | None = None


class ChildStore:
    """The native-child records in one SQLite file, with this object as its only writer."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._database = WriterDatabase(self.path, _SCHEMA, SCHEMA_VERSION, what="child store")

    def open(self) -> None:
        """Lock, create or open the database; :class:`SessionStoreLockedError` if another store holds it."""
        try:
            self._database.open()
        except DatabaseLockedError as exc:
            raise SessionStoreLockedError("another child store holds this database") from exc
        except DatabaseError as exc:
            raise SessionStoreError(f"the child store cannot be used: {exc}") from exc

    def close(self) -> None:
        """Close the database and release the lock. Idempotent."""
        self._database.close()

    @contextlib.contextmanager
    def _connection(self, *, write: bool) -> Iterator[sqlite3.Connection]:
        try:
            with self._database.write() if write else self._database.read() as db:
                yield db
        except DatabaseError as exc:
            raise SessionStoreError(str(exc)) from exc

    def add(self, record: ChildRecord, *, plugin: PluginOwner | None = None) -> None:
        """Record a new child (``queued``), and with ``plugin`` the plugin that accepted it, in one transaction."""
        with self._connection(write=True) as db:
            db.execute(f"INSERT INTO children ({_COLUMNS}) VALUES ({','.join('?' * 22)})", _row(record))
            if plugin is not None:
                db.execute(
                    "INSERT INTO plugin_children (run_id, plugin_id, request_id, request_digest, output_schema, profile,"
                    " thinking) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.run_id,
                        plugin.plugin_id,
                        plugin.request_id,
                        plugin.request_digest,
                        None if plugin.output_schema is None else json.dumps(plugin.output_schema),
                        None if plugin.profile is None else json.dumps(plugin.profile),
                        plugin.thinking,
                    ),
                )

    def plugin_request(self, plugin_id: str, parent_run_id: str, request_id: str) -> tuple[ChildRecord, str] | None:
        """The child ``plugin_id`` accepted under ``request_id`` in the parent turn ``parent_run_id``, with the
        digest of its spawn's arguments; ``None`` if there is none."""
        with self._connection(write=False) as db:
            row = db.execute(
                f"SELECT {_QUALIFIED}, p.request_digest FROM children c JOIN plugin_children p USING (run_id) "
                "WHERE p.plugin_id=? AND p.request_id=? AND c.parent_run_id=?",
                (plugin_id, request_id, parent_run_id),
            ).fetchone()
        return None if row is None else (_record(row[:-1]), str(row[-1]))

    def plugin_owner(self, run_id: str) -> PluginOwner | None:
        """The plugin that accepted ``run_id`` through its native facade, or ``None`` (any other child)."""
        with self._connection(write=False) as db:
            row = db.execute(
                "SELECT plugin_id, request_id, request_digest, output_schema, profile, thinking FROM plugin_children "
                "WHERE run_id=?",
                (run_id,),
            ).fetchone()
        if row is None:
            return None
        schema = None if row[3] is None else json.loads(row[3])
        profile = None if row[4] is None else json.loads(row[4])
        return PluginOwner(str(row[0]), row[1], str(row[2]), schema, profile, row[5])

    def plugin_children(
        self, plugin_id: str, parent_key: str, parent_session_id: str, *, status: str | None = None, limit: int
    ) -> list[tuple[ChildRecord, str | None]]:
        """The children ``plugin_id`` accepted for that parent incarnation, newest first (run id descending breaks
        ties), at most ``limit``, each with its ``request_id``. ``status`` (applied before the bound) is a
        completion (``done`` …) or, for a child without one, an execution state (``queued`` …)."""
        where, values = "", []
        if status in COMPLETION_STATES:
            where, values = " AND c.completion=?", [status]
        elif status is not None:
            where, values = " AND c.completion IS NULL AND c.execution=?", [status]
        with self._connection(write=False) as db:
            rows = db.execute(
                f"SELECT {_QUALIFIED}, p.request_id FROM children c JOIN plugin_children p USING (run_id) "
                f"WHERE p.plugin_id=? AND c.parent_key=? AND c.parent_session_id=?{where} "
                "ORDER BY c.created_at_ms DESC, c.run_id DESC LIMIT ?",
                (plugin_id, parent_key, parent_session_id, *values, limit),
            ).fetchall()
        return [(_record(row[:-1]), row[-1]) for row in rows]

    def mark_running(self, run_id: str) -> None:
        """The child's run left the queue."""
        with self._connection(write=True) as db:
            db.execute("UPDATE children SET execution='running' WHERE run_id=? AND execution='queued'", (run_id,))

    def complete(
        self,
        run_id: str,
        completion: Completion,
        *,
        result: str,
        error: str | None,
        usage: dict[str, int] | None,
        ended_at_ms: int,
    ) -> ChildRecord | None:
        """Record the child's completion (once: a child already ended keeps its first); the record after."""
        text, truncated = cut_result(result)
        with self._connection(write=True) as db:
            db.execute(
                "UPDATE children SET execution='terminal', completion=?, result=?, result_truncated=?, error=?, "
                "usage=?, ended_at_ms=? WHERE run_id=? AND completion IS NULL",
                (
                    completion,
                    text,
                    int(truncated),
                    error,
                    None if usage is None else json.dumps(usage),
                    ended_at_ms,
                    run_id,
                ),
            )
            row = db.execute(f"SELECT {_COLUMNS} FROM children WHERE run_id=?", (run_id,)).fetchone()
        return None if row is None else _record(row)

    def get(self, run_id: str) -> ChildRecord | None:
        """The record of ``run_id``, or ``None``."""
        with self._connection(write=False) as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM children WHERE run_id=?", (run_id,)).fetchone()
        return None if row is None else _record(row)

    def by_child_key(self, child_key: str) -> ChildRecord | None:
        """The child whose session is ``child_key``, or ``None`` (a session that is no native child)."""
        with self._connection(write=False) as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM children WHERE child_key=?", (child_key,)).fetchone()
        return None if row is None else _record(row)

    def for_parent(self, parent_key: str, *, limit: int = 200) -> list[ChildRecord]:
        """The children spawned for ``parent_key`` (every incarnation), newest first, at most ``limit``."""
        with self._connection(write=False) as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM children WHERE parent_key=? ORDER BY created_at_ms DESC, run_id DESC LIMIT ?",
                (parent_key, limit),
            ).fetchall()
        return [_record(row) for row in rows]

    def active_count(self, parent_key: str) -> int:
        """How many of ``parent_key``'s children are queued or running."""
        with self._connection(write=False) as db:
            row = db.execute(
                "SELECT COUNT(*) FROM children WHERE parent_key=? AND execution IN ('queued', 'running')",
                (parent_key,),
            ).fetchone()
        return int(row[0])

    def recover(self, now_ms: int) -> list[str]:
        """At start-up: every child left queued or running becomes ``interrupted`` with completion ``failed``."""
        with self._connection(write=True) as db:
            rows = db.execute("SELECT run_id FROM children WHERE execution IN ('queued', 'running')").fetchall()
            db.execute(
                "UPDATE children SET execution='interrupted', completion='failed', error=?, result=COALESCE(result, ''), "
                "ended_at_ms=? WHERE execution IN ('queued', 'running')",
                (INTERRUPTED_CHILD_ERROR, now_ms),
            )
        return [str(row[0]) for row in rows]

    def due_for_archive(self, *, ended_before_ms: int) -> list[ChildRecord]:
        """Ended children not archived yet whose end is before ``ended_before_ms`` (or that asked for cleanup
        ``delete``, as soon as they ended)."""
        with self._connection(write=False) as db:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM children WHERE archived_at_ms IS NULL AND ended_at_ms IS NOT NULL "
                "AND (ended_at_ms < ? OR cleanup='delete') ORDER BY ended_at_ms",
                (ended_before_ms,),
            ).fetchall()
        return [_record(row) for row in rows]

    def mark_archived(self, run_id: str, now_ms: int) -> None:
        """The child's session was archived."""
        with self._connection(write=True) as db:
            db.execute("UPDATE children SET archived_at_ms=? WHERE run_id=?", (now_ms, run_id))

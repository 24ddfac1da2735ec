"""The durable job store: one record per task ClawConnect started, and each job's log, in SQLite.

One :class:`JobStore` owns one database file (WAL, ``synchronous=FULL``) and is its only writer: opening takes an
exclusive lock on ``<file>.lock``, so a second ``claw connect`` on the same directory is refused
(``job_store_locked``) instead of sharing. Every write is one ``BEGIN IMMEDIATE`` transaction, committed (and so on
disk) before the method returns, so an answer built on it survives a crash. Methods block; call them from a thread
when the event loop must not wait.

**Owners.** Every gateway session a job runs in has one owner, recorded in the ``sessions`` table when the
session's first job is created (:meth:`JobStore.create`, in the same transaction), and every job records its
caller: :attr:`Job.caller` and :attr:`SessionOwner.owner` are :attr:`clawstack.connect.callers.Caller.key`
values. A job for a session another caller owns is refused (:class:`SessionOwnedError`), so two concurrent
creates cannot both claim one session.

A database that SQLite cannot read (``file is not a database``, a failed ``quick_check``) is **moved aside** to
``<file>.corrupt-<UTC time>`` (with its ``-wal`` and ``-shm``), reported in :attr:`JobStore.moved_aside`, and a new
store is started; nothing is silently emptied. When it cannot be moved aside, the store refuses every read and
write with ``job_store_corrupt`` (:attr:`JobStore.problem` says why) rather than lose data.
"""

# ruff: noqa: S608  (queries interpolate only this module's column-list constants; values are bound parameters)

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from clawstack.common.files import ensure_private_dir
from clawstack.common.sqlite import (
    DatabaseError,
    DatabaseLockedError,
    immediate_transaction,
    move_aside,
    open_database,
    take_writer_lock,
)
from clawstack.connect.callers import OPERATOR
from clawstack.connect.errors import JobStoreError, SessionBusyError, SessionOwnedError

JobStatus = Literal["running", "completed", "completed_no_summary", "error", "cancelled"]
TERMINAL_STATUSES: Final[frozenset[str]] = frozenset({"completed", "completed_no_summary", "error", "cancelled"})
STORE_FILE: Final = "jobs.sqlite3"
SCHEMA_VERSION: Final = 3
"""2: the caller column (who started the job), filled from each record. 3: callers as owner keys (a name ``n``
becomes ``user:n``, the shared pass stays ``public``, no caller becomes ``operator``: a version-2 store without a
caller was a stdio or open server's), and the ``sessions`` table of owners, each session owned by the caller of its
oldest job."""


@dataclass(frozen=True, slots=True)
class Job:
    """Everything ClawConnect knows about one task. Times are milliseconds since the Unix epoch.

    ``run_id`` is the gateway run (the ``chat.send`` idempotency key); ``prompt`` holds the caller's ``task``,
    ``context`` and ``senderName`` and ``message`` the text sent, which only ``detail: "prompt"`` shows.
    ``caller`` is the owner key of the caller that started it.
    """

    job_id: str
    task_id: str
    run_id: str
    agent: str
    openclaw_agent_id: str
    session_key: str
    created_at_ms: int
    updated_at_ms: int
    status: JobStatus = "running"
    submitted: bool = False
    ended_at_ms: int | None = None
    summary: str | None = None
    error: str | None = None
    error_info: dict[str, Any] | None = None
    terminal_reason: str | None = None
    result_source: str | None = None
    prompt: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    caller: str = OPERATOR.key
    log_count: int = 0
    recoveries: int = 0

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class SessionOwner:
    """Who owns a gateway session ClawConnect ran a job in, and which of ClawConnect's agents it belongs to."""

    session_key: str
    owner: str
    agent: str
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One line of a job's log: ``index`` counts per job from 0; ``seq`` orders every log in the store."""

    seq: int
    job_id: str
    index: int
    at_ms: int
    kind: str
    message: str


_SESSIONS_TABLE: Final = """CREATE TABLE IF NOT EXISTS sessions (
    session_key TEXT PRIMARY KEY, owner TEXT NOT NULL, agent TEXT NOT NULL, created_at_ms INTEGER NOT NULL)"""
_COLUMNS: Final = (
    "job_id",
    "task_id",
    "run_id",
    "agent",
    "session_key",
    "status",
    "created_at_ms",
    "updated_at_ms",
    "caller",
)
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS jobs (
        job_id TEXT PRIMARY KEY, task_id TEXT NOT NULL UNIQUE, run_id TEXT NOT NULL UNIQUE, agent TEXT NOT NULL,
        session_key TEXT NOT NULL, status TEXT NOT NULL, created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL, record TEXT NOT NULL, caller TEXT)""",
    "CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, created_at_ms)",
    "CREATE INDEX IF NOT EXISTS jobs_session ON jobs (session_key, created_at_ms)",
    "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at_ms)",
    "CREATE INDEX IF NOT EXISTS jobs_caller ON jobs (caller, created_at_ms)",
    "CREATE INDEX IF NOT EXISTS jobs_session_caller ON jobs (session_key, caller, created_at_ms)",
    "CREATE INDEX IF NOT EXISTS jobs_caller_session ON jobs (caller, session_key, created_at_ms)",
    """CREATE TABLE IF NOT EXISTS logs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, session_key TEXT NOT NULL,
        idx INTEGER NOT NULL, at_ms INTEGER NOT NULL, kind TEXT NOT NULL, message TEXT NOT NULL,
        UNIQUE (job_id, idx))""",
    "CREATE INDEX IF NOT EXISTS logs_session ON logs (session_key, seq)",
    _SESSIONS_TABLE,
    "CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (owner, created_at_ms)",
)
_SELECT_JOB: Final = "SELECT record FROM jobs"
_LOG_COLUMNS: Final = "seq, job_id, idx, at_ms, kind, message"


def _migrate(db: sqlite3.Connection, found: int) -> None:
    """Version 1 kept the caller only inside each record; version 2 kept names and no owners (see
    :data:`SCHEMA_VERSION`)."""
    if found < 2:
        db.execute("ALTER TABLE jobs ADD COLUMN caller TEXT")
        db.execute("UPDATE jobs SET caller = json_extract(record, '$.caller')")
    if found < 3:
        db.execute(
            "UPDATE jobs SET caller = CASE WHEN caller IS NULL THEN ? WHEN caller = 'public' THEN 'public' "
            "ELSE 'user:' || caller END",
            (OPERATOR.key,),
        )
        db.execute("UPDATE jobs SET record = json_set(record, '$.caller', caller)")
        db.execute(_SESSIONS_TABLE)
        db.execute(
            "INSERT OR IGNORE INTO sessions (session_key, owner, agent, created_at_ms) "
            "SELECT session_key, caller, agent, created_at_ms FROM jobs ORDER BY created_at_ms, job_id"
        )


Scope = str | None
"""Whose jobs a query sees: a caller's owner key, or ``None`` for every job (the store's own tools: recovery,
benchmarks)."""


def _scoped(scope: Scope, where: str = "") -> tuple[str, tuple[Any, ...]]:
    if scope is None:
        return (f"WHERE {where}" if where else ""), ()
    return (f"WHERE caller=? AND {where}" if where else "WHERE caller=?"), (scope,)


def _encode(job: Job) -> tuple[Any, ...]:
    record = json.dumps(dataclasses.asdict(job), ensure_ascii=False, separators=(",", ":"))
    return (*(getattr(job, name) for name in _COLUMNS), record)


def _decode(record: str) -> Job:
    return Job(**json.loads(record))


def _log(row: tuple[Any, ...]) -> LogEntry:
    return LogEntry(*row)


class JobStore:
    """Jobs and their logs in one SQLite file, with this object as the only writer; see the module docstring.

    ``rename`` moves a corrupt file aside (tests pass one that fails).
    """

    def __init__(self, path: str | os.PathLike[str], *, rename: Callable[[Path, Path], None] = os.rename) -> None:
        self.path = Path(path)
        self._rename = rename
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._mutex = threading.RLock()
        self.moved_aside: Path | None = None
        """Where a corrupt store was moved at :meth:`open`, if one was."""
        self.problem: str | None = None
        """Why the store refuses to read and write (a corrupt file that could not be moved aside)."""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Lock, then open or create the database; move a corrupt one aside (see the module docstring)."""
        with self._mutex:
            if self._db is not None:
                raise JobStoreError("the job store is already open")
            ensure_private_dir(self.path.parent)
            try:
                self._lock_fd = take_writer_lock(self.path)
            except DatabaseLockedError as exc:
                raise JobStoreError(
                    f"another claw connect holds the job store in {self.path.parent}; use another --data-dir",
                    code="job_store_locked",
                ) from exc
            except DatabaseError as exc:
                raise JobStoreError(f"the job store cannot be locked: {exc}") from exc
            try:
                self._db = self._connect()
            except sqlite3.DatabaseError:
                self._recover_from_corruption()

    def close(self) -> None:
        """Close the database and release the lock. Idempotent."""
        with self._mutex:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _connect(self) -> sqlite3.Connection:
        """Open and migrate; a :class:`sqlite3.DatabaseError` means the file is not a readable database."""
        try:
            return open_database(self.path, _SCHEMA, SCHEMA_VERSION, check_integrity=True, migrate=_migrate)
        except DatabaseError as exc:
            raise JobStoreError(f"the job store cannot be used: {exc}") from exc

    def _recover_from_corruption(self) -> None:
        try:
            self.moved_aside = move_aside(self.path, rename=self._rename)
        except OSError as exc:
            self.problem = (
                f"the job store {self.path} is corrupt and could not be moved aside ({exc.strerror or exc}); "
                "refusing to read or write it"
            )
            return
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as exc:
            raise JobStoreError("a new job store cannot be created") from exc

    # -- transactions ------------------------------------------------------------------------------------------

    def _check(self) -> sqlite3.Connection:
        if self.problem is not None:
            raise JobStoreError(self.problem, code="job_store_corrupt")
        if self._db is None:
            raise JobStoreError("the job store is not open")
        return self._db

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            db = self._check()
            try:
                yield db
            except sqlite3.Error as exc:
                raise JobStoreError("the job store cannot be read") from exc

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            db = self._check()
            try:
                with immediate_transaction(db):
                    yield db
            except sqlite3.Error as exc:
                raise JobStoreError("the job store cannot be written") from exc

    # -- jobs --------------------------------------------------------------------------------------------------

    def create(self, job: Job) -> Job:
        """Record a new running job and, for a session without an owner, make the job's caller its owner.

        Refused when another caller owns the session (:class:`SessionOwnedError`) or the session already has a
        running job (:class:`SessionBusyError`); nothing is written then."""
        with self._write() as db:
            owner = db.execute("SELECT owner FROM sessions WHERE session_key=?", (job.session_key,)).fetchone()
            if owner is not None and owner[0] != job.caller:
                raise SessionOwnedError("sessionKey: no session of this caller has this key")
            if owner is None:
                db.execute(
                    "INSERT INTO sessions (session_key, owner, agent, created_at_ms) VALUES (?,?,?,?)",
                    (job.session_key, job.caller, job.agent, job.created_at_ms),
                )
            row = db.execute(
                "SELECT job_id FROM jobs WHERE session_key=? AND status='running' LIMIT 1", (job.session_key,)
            ).fetchone()
            if row is not None:
                raise SessionBusyError(
                    "the session already has a running task; wait for it (check_task) or use another session",
                    activeJobId=row[0],
                    sessionKey=job.session_key,
                )
            db.execute(f"INSERT INTO jobs ({', '.join(_COLUMNS)}, record) VALUES (?,?,?,?,?,?,?,?,?,?)", _encode(job))
        return job

    def update(self, job: Job) -> Job:
        """Replace a job's record (the ids never change)."""
        with self._write() as db:
            values = _encode(job)
            cursor = db.execute(
                "UPDATE jobs SET status=?, updated_at_ms=?, record=? WHERE job_id=?",
                (job.status, job.updated_at_ms, values[-1], job.job_id),
            )
            if cursor.rowcount != 1:
                raise JobStoreError(f"no job {job.job_id} to update")
        return job

    def append_log(self, job: Job, kind: str, message: str, at_ms: int) -> Job:
        """Add a line to the job's log and store ``job`` with it, in one transaction.

        Returns the job as stored: its ``log_count`` one higher and ``updated_at_ms`` set to ``at_ms``.
        """
        updated = dataclasses.replace(job, log_count=job.log_count + 1, updated_at_ms=at_ms)
        with self._write() as db:
            db.execute(
                "INSERT INTO logs (job_id, session_key, idx, at_ms, kind, message) VALUES (?,?,?,?,?,?)",
                (job.job_id, job.session_key, job.log_count, at_ms, kind, message),
            )
            db.execute(
                "UPDATE jobs SET status=?, updated_at_ms=?, record=? WHERE job_id=?",
                (updated.status, at_ms, _encode(updated)[-1], job.job_id),
            )
        return updated

    def get(self, job_id: str) -> Job | None:
        with self._read() as db:
            row = db.execute(f"{_SELECT_JOB} WHERE job_id=?", (job_id,)).fetchone()
        return None if row is None else _decode(row[0])

    def get_by_task(self, task_id: str) -> Job | None:
        with self._read() as db:
            row = db.execute(f"{_SELECT_JOB} WHERE task_id=?", (task_id,)).fetchone()
        return None if row is None else _decode(row[0])

    def running(self) -> list[Job]:
        """Every job still ``running``, oldest first."""
        with self._read() as db:
            rows = db.execute(f"{_SELECT_JOB} WHERE status='running' ORDER BY created_at_ms").fetchall()
        return [_decode(row[0]) for row in rows]

    def recent(self, *, active_only: bool, limit: int, scope: Scope = None) -> tuple[list[Job], int]:
        """The newest ``limit`` jobs in ``scope`` (only running ones with ``active_only``), and how many there are
        in all."""
        where, args = _scoped(scope, "status='running'" if active_only else "")
        with self._read() as db:
            total = int(db.execute(f"SELECT count(*) FROM jobs {where}", args).fetchone()[0])
            rows = db.execute(f"{_SELECT_JOB} {where} ORDER BY created_at_ms DESC LIMIT ?", (*args, limit)).fetchall()
        return [_decode(row[0]) for row in rows], total

    def page(self, *, limit: int, after: tuple[int, str] | None = None, scope: Scope = None) -> list[Job]:
        """Up to ``limit`` jobs in ``scope``, newest first (``created_at_ms``, then ``job_id``, both descending),
        starting just past ``after``: the ``(created_at_ms, job_id)`` of the previous page's last job. A job's place
        in that order never changes, so a job created meanwhile cannot shift or repeat a later page."""
        where, args = _scoped(
            scope, "" if after is None else "(created_at_ms < ? OR (created_at_ms = ? AND job_id < ?))"
        )
        position = () if after is None else (after[0], after[0], after[1])
        with self._read() as db:
            rows = db.execute(
                f"{_SELECT_JOB} {where} ORDER BY created_at_ms DESC, job_id DESC LIMIT ?", (*args, *position, limit)
            ).fetchall()
        return [_decode(row[0]) for row in rows]

    def for_session(self, session_key: str, scope: Scope = None) -> list[Job]:
        """The session's jobs in ``scope``, oldest first."""
        where, args = _scoped(scope, "session_key=?")
        with self._read() as db:
            rows = db.execute(f"{_SELECT_JOB} {where} ORDER BY created_at_ms", (*args, session_key)).fetchall()
        return [_decode(row[0]) for row in rows]

    def sessions(self, *, limit: int, scope: Scope = None) -> list[tuple[str, int, Job]]:
        """``(session key, job count, newest job)`` for the most recently used sessions in ``scope``."""
        where, args = _scoped(scope)
        caller = "" if scope is None else "AND j.caller = s.caller"
        with self._read() as db:
            rows = db.execute(
                f"""SELECT j.record, s.n FROM (
                       SELECT session_key, caller, count(*) AS n, max(created_at_ms) AS last FROM jobs {where}
                       GROUP BY session_key ORDER BY last DESC LIMIT ?) AS s
                   JOIN jobs AS j ON j.session_key = s.session_key AND j.created_at_ms = s.last {caller}
                   ORDER BY s.last DESC""",
                (*args, limit),
            ).fetchall()
        seen: set[str] = set()
        result: list[tuple[str, int, Job]] = []
        for record, count in rows:
            job = _decode(record)
            if job.session_key not in seen:
                seen.add(job.session_key)
                result.append((job.session_key, int(count), job))
        return result

    def session_owner(self, session_key: str) -> SessionOwner | None:
        """The owner record of ``session_key``, or ``None`` when no job ever ran in it."""
        with self._read() as db:
            row = db.execute(
                "SELECT session_key, owner, agent, created_at_ms FROM sessions WHERE session_key=?", (session_key,)
            ).fetchone()
        return None if row is None else SessionOwner(*row)

    def count(self) -> int:
        with self._read() as db:
            return int(db.execute("SELECT count(*) FROM jobs").fetchone()[0])

    # -- logs --------------------------------------------------------------------------------------------------

    def logs(self, job_id: str, *, since_index: int = 0) -> list[LogEntry]:
        """The job's log lines from ``since_index`` on."""
        with self._read() as db:
            rows = db.execute(
                f"SELECT {_LOG_COLUMNS} FROM logs WHERE job_id=? AND idx>=? ORDER BY idx", (job_id, since_index)
            ).fetchall()
        return [_log(row) for row in rows]

    def session_logs(self, session_key: str, *, after: int | None, limit: int, scope: Scope = None) -> list[LogEntry]:
        """Log lines of a session's jobs in ``scope``: the first ``limit`` after ``seq`` ``after``, or the last
        ``limit``."""
        owned = "" if scope is None else " AND job_id IN (SELECT job_id FROM jobs WHERE session_key=? AND caller=?)"
        owner_args: tuple[Any, ...] = () if scope is None else (session_key, scope)
        with self._read() as db:
            if after is None:
                rows = db.execute(
                    f"SELECT {_LOG_COLUMNS} FROM logs WHERE session_key=?{owned} ORDER BY seq DESC LIMIT ?",
                    (session_key, *owner_args, limit),
                ).fetchall()
                rows.reverse()
            else:
                rows = db.execute(
                    f"SELECT {_LOG_COLUMNS} FROM logs WHERE session_key=?{owned} AND seq>? ORDER BY seq LIMIT ?",
                    (session_key, *owner_args, after, limit),
                ).fetchall()
        return [_log(row) for row in rows]


__all__ = ["STORE_FILE", "TERMINAL_STATUSES", "Job", "JobStatus", "JobStore", "LogEntry", "Scope", "SessionOwner"]

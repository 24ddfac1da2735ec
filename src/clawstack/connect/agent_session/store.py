"""The durable attachment store: ``agent_sessions.sqlite3`` beside the job store (same directory).

SQLite with WAL and ``synchronous=FULL``; this object is its only writer (an exclusive lock on ``<file>.lock``);
every write is one ``BEGIN IMMEDIATE`` transaction committed before the method returns. Two tables: every record
ever written (never deleted), and one ``current`` pointer per conversation (session key).

Loading is forgiving: a row whose record cannot be read is skipped (and kept on disk), and a current pointer that
names a missing, unreadable, non-current or foreign record is treated as no pointer; every valid record of a
conversation's lineage still reads back. A file SQLite cannot read is moved aside to
``<file>.corrupt-<UTC time>`` and a new store is started. Methods block; call them from a thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from clawstack.common.files import ensure_private_dir
from clawstack.common.sqlite import (
    DatabaseError,
    DatabaseLockedError,
    immediate_transaction,
    move_aside,
    open_database,
    take_writer_lock,
)
from clawstack.connect.agent_session.attachments import Attachment, from_record
from clawstack.connect.errors import AttachmentStoreError

STORE_FILE: Final = "agent_sessions.sqlite3"
SCHEMA_VERSION: Final = 1
_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS attachments (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, attachment_id TEXT NOT NULL UNIQUE, session_key TEXT NOT NULL,
        status TEXT NOT NULL, token INTEGER NOT NULL, record TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS attachments_session ON attachments (session_key, seq)",
    "CREATE TABLE IF NOT EXISTS current (session_key TEXT PRIMARY KEY, attachment_id TEXT NOT NULL)",
)
Update = Callable[[Attachment], Attachment]
_log = logging.getLogger(__name__)


def _decode(record: object) -> Attachment | None:
    if not isinstance(record, str):
        return None
    try:
        return from_record(json.loads(record))
    except (ValueError, TypeError, RecursionError):
        return None


def _encode(attachment: Attachment) -> str:
    return json.dumps(attachment.to_record(), ensure_ascii=False, separators=(",", ":"))


class AttachmentStore:
    """Attachment records and current pointers in one SQLite file; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._mutex = threading.RLock()
        self.moved_aside: Path | None = None

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def open(self) -> None:
        with self._mutex:
            if self._db is not None:
                return
            ensure_private_dir(self.path.parent)
            try:
                self._lock_fd = take_writer_lock(self.path)
            except DatabaseLockedError as exc:
                raise AttachmentStoreError(
                    "another process holds the attachment store", code="attachment_store_locked"
                ) from exc
            except DatabaseError as exc:
                raise AttachmentStoreError(f"the attachment store cannot be locked: {exc}") from exc
            try:
                try:
                    self._db = self._connect()
                except sqlite3.DatabaseError:
                    self.moved_aside = move_aside(self.path)
                    _log.error("the attachment store was unreadable; it was moved aside to %s", self.moved_aside)
                    self._db = self._connect()
            except (sqlite3.Error, OSError, DatabaseError) as exc:
                self.close()
                raise AttachmentStoreError("the attachment store cannot be opened") from exc

    def close(self) -> None:
        with self._mutex:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _connect(self) -> sqlite3.Connection:
        return open_database(self.path, _SCHEMA, SCHEMA_VERSION, check_integrity=True)

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            if self._db is None:
                raise AttachmentStoreError("the attachment store is not open")
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise AttachmentStoreError("the attachment store cannot be read") from exc

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            if self._db is None:
                raise AttachmentStoreError("the attachment store is not open")
            db = self._db
            try:
                with immediate_transaction(db):
                    yield db
            except sqlite3.Error as exc:
                raise AttachmentStoreError("the attachment store cannot be written") from exc

    # -- reads -------------------------------------------------------------------------------------------------

    @staticmethod
    def _current_in(db: sqlite3.Connection, session_key: str) -> Attachment | None:
        row = db.execute(
            "SELECT a.record FROM current AS c JOIN attachments AS a ON a.attachment_id = c.attachment_id "
            "WHERE c.session_key=?",
            (session_key,),
        ).fetchone()
        attachment = None if row is None else _decode(row[0])
        if attachment is None or attachment.status != "current" or attachment.session_key != session_key:
            return None  # no pointer, or a dangling one
        return attachment

    def current(self, session_key: str) -> Attachment | None:
        """The conversation's current attachment (a keyed lookup), or ``None``."""
        with self._read() as db:
            return self._current_in(db, session_key)

    def current_elsewhere(self, runtime: str, session_id: str, session_key: str) -> list[Attachment]:
        """The current attachments of other conversations than ``session_key`` naming session ``session_id`` of
        ``runtime``."""
        with self._read() as db:
            rows = db.execute(
                "SELECT a.record FROM current AS c JOIN attachments AS a ON a.attachment_id = c.attachment_id "
                "WHERE c.session_key != ? AND json_valid(a.record) "
                "AND CASE WHEN json_valid(a.record) THEN json_extract(a.record, '$.runtime') END = ? "
                "AND CASE WHEN json_valid(a.record) THEN json_extract(a.record, '$.sessionId') END = ?",
                (session_key, runtime, session_id),
            ).fetchall()
        decoded = [_decode(row[0]) for row in rows]
        return [a for a in decoded if a is not None and a.status == "current"]

    def get(self, attachment_id: str) -> Attachment | None:
        with self._read() as db:
            row = db.execute("SELECT record FROM attachments WHERE attachment_id=?", (attachment_id,)).fetchone()
        return None if row is None else _decode(row[0])

    def lineage(self, session_key: str) -> list[Attachment]:
        """Every readable record of the conversation, oldest first (unreadable rows skipped)."""
        with self._read() as db:
            rows = db.execute("SELECT record FROM attachments WHERE session_key=? ORDER BY seq", (session_key,))
            decoded = [_decode(row[0]) for row in rows.fetchall()]
        return [a for a in decoded if a is not None and a.session_key == session_key]

    def max_token(self) -> int:
        """The highest observation token stored (0 for none): tokens resume above it after a restart."""
        with self._read() as db:
            value = db.execute("SELECT max(token) FROM attachments WHERE typeof(token)='integer'").fetchone()[0]
        return int(value or 0)

    # -- writes ------------------------------------------------------------------------------------------------

    def _put(self, db: sqlite3.Connection, attachment: Attachment) -> None:
        db.execute(
            "UPDATE attachments SET status=?, token=?, record=? WHERE attachment_id=?",
            (attachment.status, attachment.observation_token, _encode(attachment), attachment.attachment_id),
        )

    def attach(self, new: Attachment, *, supersede_reason: str | None = None) -> Attachment | None:
        """Make ``new`` the conversation's current attachment; the old current one (returned) is superseded with
        ``supersede_reason``."""
        with self._write() as db:
            old = self._current_in(db, new.session_key)
            if old is not None:
                old = dataclasses.replace(
                    old,
                    status="superseded",
                    superseded_by=new.attachment_id,
                    reason=supersede_reason,
                    updated_at_ms=new.created_at_ms,
                )
                self._put(db, old)
                new = dataclasses.replace(new, replaces_attachment_id=old.attachment_id)
            db.execute(
                "INSERT INTO attachments (attachment_id, session_key, status, token, record) VALUES (?,?,?,?,?)",
                (new.attachment_id, new.session_key, new.status, new.observation_token, _encode(new)),
            )
            db.execute(
                "INSERT INTO current (session_key, attachment_id) VALUES (?, ?) "
                "ON CONFLICT (session_key) DO UPDATE SET attachment_id=excluded.attachment_id",
                (new.session_key, new.attachment_id),
            )
        return old

    def update_current(self, session_key: str, attachment_id: str, update: Update) -> Attachment | None:
        """Apply ``update`` to the current attachment if it is still ``attachment_id``; the stored result."""
        with self._write() as db:
            current = self._current_in(db, session_key)
            if current is None or current.attachment_id != attachment_id:
                return None
            updated = update(current)
            self._put(db, updated)
        return updated

    def write_if_fresh(
        self,
        session_key: str,
        attachment_id: str,
        turn_id: str | None,
        token: int,
        update: Update,
        *,
        require_newer: bool = True,
    ) -> Attachment | None:
        """Write a call's result only if the attachment is still current, still bound to ``turn_id`` and (unless
        ``require_newer`` is false) ``token`` is newer than the stored one; ``None`` when the result is discarded.
        The stored token never goes down."""
        with self._write() as db:
            current = self._current_in(db, session_key)
            if (
                current is None
                or current.attachment_id != attachment_id
                or current.delegated_turn_id != turn_id
                or (require_newer and token <= current.observation_token)
            ):
                return None
            updated = dataclasses.replace(update(current), observation_token=max(token, current.observation_token))
            self._put(db, updated)
        return updated

    def detach(self, session_key: str, attachment_id: str, update: Update) -> Attachment | None:
        """Mark the current attachment detached (through ``update``) and clear the pointer; never deletes it."""
        with self._write() as db:
            current = self._current_in(db, session_key)
            if current is None or current.attachment_id != attachment_id:
                return None
            detached = dataclasses.replace(update(current), status="detached")
            self._put(db, detached)
            db.execute("DELETE FROM current WHERE session_key=?", (session_key,))
        return detached


__all__ = ["STORE_FILE", "AttachmentStore"]

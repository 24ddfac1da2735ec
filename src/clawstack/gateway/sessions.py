"""The gateway's durable session store: sessions, append-only transcripts and run records, in SQLite.

One :class:`SessionStore` owns one database file (WAL, ``synchronous=FULL``). It is the only writer: opening takes
an exclusive lock on ``<file>.lock``, so a second store on the same file (in this process or another) is refused
with :class:`SessionStoreLockedError` instead of silently sharing. Every write runs in one ``BEGIN IMMEDIATE``
transaction and is committed, and so on disk, before the method returns. Methods block; call them from a thread
(``asyncio.to_thread``) when the event loop must not wait; a lock serialises callers from several threads.

What it holds:

* **sessions**: ``key``, ``agent_id``, ``session_id`` (a UUID4), ``created_at_ms``, ``updated_at_ms``, the ``owner``
  plugin id (or ``None``), a ``label``, ``metadata`` (a JSON object) and a ``deleted`` flag. At most one live session
  has a given key; :meth:`SessionStore.delete` marks a session deleted, which hides it and its transcript from every
  read, and a later :meth:`SessionStore.get_or_create` for the same key starts a new session with a new id.
  :meth:`SessionStore.reset` starts a new incarnation of a session (a new ``session_id``, an empty transcript) in
  one step. Nothing is ever removed from the file.
* **transcripts**: per session, messages numbered ``seq`` = 1, 2, 3, … in append order, each with a ``role``
  (``user``, ``assistant``, ``tool``, ``system``), ``content`` (a string or a list of blocks such as
  ``{"type": "text", "text": …}``), ``timestamp_ms``, and optionally ``run_id``, ``idempotency_key``, ``provider``,
  ``model``, ``usage`` and ``stop_reason``: the shapes ``chat.history`` returns (:meth:`Message.to_wire`). Triggers
  in the database refuse any update or delete of a message.
* **runs**: ``run_id``, ``session_key``, ``state`` (``accepted`` → ``running`` → one of ``ok``, ``error``,
  ``timeout``, ``aborted``, ``interrupted``), ``started_at_ms``, ``ended_at_ms``, ``error`` and an optional
  ``idempotency_key``, unique per session key, so a retried request finds its run instead of starting another.
  :meth:`SessionStore.mark_interrupted`, called at start-up, turns every run a previous process left ``accepted`` or
  ``running`` into ``interrupted``.

Errors::

    GatewayError                         (clawstack.gateway.errors)
     ├── SessionKeyError                 (clawstack.gateway.keys: "session_key_invalid", "agent_id_invalid")
     └── SessionError                    "session_error"
          ├── SessionStoreError          "session_store_unavailable": cannot open, read or write; or closed
          │    └── SessionStoreLockedError  "session_store_locked": another store holds the file
          ├── SessionNotFoundError       "session_not_found"
          ├── SessionDeletedError        "session_deleted": the key's session was deleted
          ├── SessionAgentMismatchError  "session_agent_mismatch"
          ├── InvalidRequestError        "invalid_request": a bad message, window, id or state argument
          ├── RunNotFoundError           "run_not_found"
          ├── RunConflictError           "run_conflict": the run id belongs to another session
          └── RunStateError              "run_state_invalid": a transition the run's state does not allow
"""

# ruff: noqa: S608  (queries interpolate only this module's column-list constants; values are bound parameters)

from __future__ import annotations

import builtins
import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, get_args

from clawstack.common.clock import Clock, SystemClock
from clawstack.common.ids import new_uuid
from clawstack.common.sqlite import DatabaseError, DatabaseLockedError, WriterDatabase
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import normalize_agent_id, parse_session_key

Role = Literal["user", "assistant", "tool", "system"]
RunState = Literal["accepted", "running", "ok", "error", "timeout", "aborted", "interrupted"]
Content = str | list[dict[str, Any]]
"""Message content: a string, or a list of JSON-object blocks each with a string ``type``."""

ROLES: Final[frozenset[str]] = frozenset(get_args(Role))
ACTIVE_RUN_STATES: Final[frozenset[str]] = frozenset({"accepted", "running"})
TERMINAL_RUN_STATES: Final[frozenset[str]] = frozenset({"ok", "error", "timeout", "aborted", "interrupted"})
DEFAULT_HISTORY_LIMIT: Final = 200
MAX_HISTORY_LIMIT: Final = 1000
MAX_LIST_LIMIT: Final = 1000
MAX_ID_LENGTH: Final = 256
TRUNCATION_MARKER: Final = "…[truncated]"
"""Appended to a text cut by ``max_chars`` in :meth:`SessionStore.history`."""
INTERRUPTED_ERROR: Final = "the gateway stopped while this run was in flight"
SCHEMA_VERSION: Final = 1


class SessionError(GatewayError):
    """Base of the session store's errors."""

    code = "session_error"


class SessionStoreError(SessionError):
    """The database cannot be opened, read or written, or the store is not open."""

    code = "session_store_unavailable"


class SessionStoreLockedError(SessionStoreError):
    """Another :class:`SessionStore` (in this process or another) holds the database."""

    code = "session_store_locked"


class SessionNotFoundError(SessionError):
    """No live session has the key."""

    code = "session_not_found"


class SessionDeletedError(SessionError):
    """The key's session was deleted; its transcript is kept but closed to appends and runs."""

    code = "session_deleted"


class SessionAgentMismatchError(SessionError):
    """The agent id given does not match the key's agent or the existing session's agent."""

    code = "session_agent_mismatch"


class InvalidRequestError(SessionError):
    """An argument is malformed: a message, a window, an id or a state."""

    code = "invalid_request"


class RunNotFoundError(SessionError):
    """No run has the id."""

    code = "run_not_found"


class RunConflictError(SessionError):
    """The run id is already recorded for another session."""

    code = "run_conflict"


class RunStateError(SessionError):
    """The run's current state does not allow the requested transition."""

    code = "run_state_invalid"


@dataclass(frozen=True, slots=True)
class Session:
    """One session record. ``metadata`` is a JSON object; times are milliseconds since the Unix epoch."""

    key: str
    agent_id: str
    session_id: str
    created_at_ms: int
    updated_at_ms: int
    owner: str | None
    label: str | None
    metadata: dict[str, Any]
    deleted: bool


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append; the store assigns ``seq`` and, when ``timestamp_ms`` is ``None``, the timestamp."""

    role: Role
    content: Content
    timestamp_ms: int | None = None
    run_id: str | None = None
    idempotency_key: str | None = None
    provider: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A transcript message as stored. ``truncated`` is set on copies cut by ``history(max_chars=…)``."""

    session_id: str
    seq: int
    role: Role
    content: Content
    timestamp_ms: int
    run_id: str | None = None
    idempotency_key: str | None = None
    provider: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None
    stop_reason: str | None = None
    truncated: bool = field(default=False, compare=False)

    def to_wire(self) -> dict[str, Any]:
        """The ``chat.history`` shape: ``role``, ``content``, ``timestamp``, ``seq`` and the optional fields."""
        wire: dict[str, Any] = {"role": self.role, "content": self.content, "timestamp": self.timestamp_ms}
        wire["seq"] = self.seq
        optional = {
            "runId": self.run_id,
            "idempotencyKey": self.idempotency_key,
            "provider": self.provider,
            "model": self.model,
            "usage": self.usage,
            "stopReason": self.stop_reason,
        }
        wire.update({name: value for name, value in optional.items() if value is not None})
        if self.truncated:
            wire["truncated"] = True
        return wire


class HistoryPage(NamedTuple):
    """A window of a transcript, oldest first, with the transcript's length and whether older messages remain."""

    messages: list[Message]
    total: int
    has_more: bool


@dataclass(frozen=True, slots=True)
class Run:
    """One run record. ``error`` is set for runs that ended ``error``, ``timeout``, ``aborted`` or ``interrupted``."""

    run_id: str
    session_key: str
    session_id: str
    state: RunState
    started_at_ms: int
    ended_at_ms: int | None
    error: str | None
    idempotency_key: str | None

    @property
    def active(self) -> bool:
        """Whether the run is still ``accepted`` or ``running``."""
        return self.state in ACTIVE_RUN_STATES


_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS sessions (
        session_id TEXT PRIMARY KEY, key TEXT NOT NULL, agent_id TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL,
        owner TEXT, label TEXT, metadata TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0)""",
    "CREATE UNIQUE INDEX IF NOT EXISTS sessions_live_key ON sessions (key) WHERE deleted = 0",
    "CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (deleted, updated_at_ms)",
    """CREATE TABLE IF NOT EXISTS messages (
        session_id TEXT NOT NULL REFERENCES sessions (session_id), seq INTEGER NOT NULL,
        role TEXT NOT NULL, content TEXT NOT NULL, timestamp_ms INTEGER NOT NULL,
        run_id TEXT, idempotency_key TEXT, provider TEXT, model TEXT, usage TEXT, stop_reason TEXT,
        PRIMARY KEY (session_id, seq)) WITHOUT ROWID""",
    """CREATE UNIQUE INDEX IF NOT EXISTS messages_idempotency
        ON messages (session_id, idempotency_key) WHERE idempotency_key IS NOT NULL""",
    """CREATE TRIGGER IF NOT EXISTS messages_no_update BEFORE UPDATE ON messages
        BEGIN SELECT RAISE(ABORT, 'transcripts are append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS messages_no_delete BEFORE DELETE ON messages
        BEGIN SELECT RAISE(ABORT, 'transcripts are append-only'); END""",
    """CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, session_key TEXT NOT NULL, session_id TEXT NOT NULL, idempotency_key TEXT,
        state TEXT NOT NULL, started_at_ms INTEGER NOT NULL, ended_at_ms INTEGER, error TEXT)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS runs_idempotency
        ON runs (session_key, idempotency_key) WHERE idempotency_key IS NOT NULL""",
    "CREATE INDEX IF NOT EXISTS runs_session_state ON runs (session_id, state)",
    "CREATE INDEX IF NOT EXISTS runs_state ON runs (state)",
)
_SESSION_COLUMNS: Final = "key, agent_id, session_id, created_at_ms, updated_at_ms, owner, label, metadata, deleted"
_MESSAGE_COLUMNS: Final = (
    "session_id, seq, role, content, timestamp_ms, run_id, idempotency_key, provider, model, usage, stop_reason"
)
_RUN_COLUMNS: Final = "run_id, session_key, session_id, state, started_at_ms, ended_at_ms, error, idempotency_key"


def content_text(content: Content) -> str:
    """The text of a message's content: the string itself, or its ``text`` blocks joined."""
    if isinstance(content, str):
        return content
    return "".join(str(block.get("text", "")) for block in content if block.get("type") == "text")


def _dump_json(value: object, what: str) -> str:
    """Compact JSON for storage; refuse what cannot round-trip (NaN, non-JSON types, lone surrogates)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        text.encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise InvalidRequestError(f"{what} is not storable JSON: {type(exc).__name__}") from exc
    return text


def _check_text(value: object, what: str, *, optional: bool = True, max_length: int | None = None) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{what} must be a non-empty string")
    if max_length is not None and len(value) > max_length:
        raise InvalidRequestError(f"{what} has at most {max_length} characters, not {len(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"{what} contains a lone surrogate at character {exc.start}") from exc
    return value


def _check_content(content: object) -> str:
    if isinstance(content, list):
        for index, block in enumerate(content):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise InvalidRequestError(f"content block {index} must be an object with a string 'type'")
    elif not isinstance(content, str):
        raise InvalidRequestError("message content must be a string or a list of blocks")
    return _dump_json(content, "message content")


def _check_int(value: object, what: str, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidRequestError(f"{what} must be an integer of at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidRequestError(f"{what} must be at most {maximum}")
    return value


def _truncate_text(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + TRUNCATION_MARKER, True


def _truncate(message: Message, max_chars: int) -> Message:
    """A copy whose texts (string content, ``text`` of text blocks) are cut to ``max_chars`` plus the marker."""
    if isinstance(message.content, str):
        text, cut = _truncate_text(message.content, max_chars)
        return replace(message, content=text, truncated=True) if cut else message
    blocks: list[dict[str, Any]] = []
    any_cut = False
    for block in message.content:
        text_value = block.get("text")
        if block.get("type") == "text" and isinstance(text_value, str):
            text, cut = _truncate_text(text_value, max_chars)
            if cut:
                block = {**block, "text": text}
                any_cut = True
        blocks.append(block)
    return replace(message, content=blocks, truncated=True) if any_cut else message


def _session_from_row(row: tuple[Any, ...]) -> Session:
    return Session(
        key=row[0],
        agent_id=row[1],
        session_id=row[2],
        created_at_ms=row[3],
        updated_at_ms=row[4],
        owner=row[5],
        label=row[6],
        metadata=json.loads(row[7]),
        deleted=bool(row[8]),
    )


def _message_from_row(row: tuple[Any, ...]) -> Message:
    return Message(
        session_id=row[0],
        seq=row[1],
        role=row[2],
        content=json.loads(row[3]),
        timestamp_ms=row[4],
        run_id=row[5],
        idempotency_key=row[6],
        provider=row[7],
        model=row[8],
        usage=None if row[9] is None else json.loads(row[9]),
        stop_reason=row[10],
    )


def _run_from_row(row: tuple[Any, ...]) -> Run:
    return Run(*row)


class SessionStore:
    """Sessions, transcripts and run records in one SQLite file, with this object as its only writer.

    Open it with :meth:`open` (or ``with SessionStore(path) as store:``) and close it with :meth:`close`. The file is
    created mode 0600 in a directory made mode 0700.
    """

    def __init__(self, path: Path, *, clock: Clock | None = None) -> None:
        self.path = Path(path)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._database = WriterDatabase(self.path, _SCHEMA, SCHEMA_VERSION, what="session store", foreign_keys=True)

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Lock, create or open, and migrate the database. Raises :class:`SessionStoreLockedError` if held."""
        if self._database.is_open:
            raise SessionStoreError("the session store is already open")
        try:
            self._database.open()
        except DatabaseLockedError as exc:
            raise SessionStoreLockedError("another session store holds this database") from exc
        except DatabaseError as exc:
            raise SessionStoreError(f"the session database cannot be used: {exc}") from exc

    def close(self) -> None:
        """Close the database and release the lock. Idempotent."""
        self._database.close()

    def __enter__(self) -> SessionStore:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- transactions ------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        try:
            with self._database.read() as db:
                yield db
        except DatabaseError as exc:
            raise SessionStoreError(str(exc)) from exc

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction, committed (durably) on success and rolled back on any error."""
        try:
            with self._database.write() as db:
                yield db
        except DatabaseError as exc:
            raise SessionStoreError(str(exc)) from exc

    def _now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)

    @staticmethod
    def _live(db: sqlite3.Connection, key: str) -> Session | None:
        row = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE key=? AND deleted=0", (key,)).fetchone()
        return None if row is None else _session_from_row(row)

    @staticmethod
    def _require_live(db: sqlite3.Connection, key: str) -> Session:
        session = SessionStore._live(db, key)
        if session is not None:
            return session
        if db.execute("SELECT 1 FROM sessions WHERE key=? AND deleted=1 LIMIT 1", (key,)).fetchone():
            raise SessionDeletedError("the session was deleted")
        raise SessionNotFoundError("no session has this key")

    # -- sessions ----------------------------------------------------------------------------------------------

    def get_or_create(
        self,
        key: str,
        *,
        agent_id: str,
        owner: str | None = None,
        label: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        """The live session for ``key``, created for ``agent_id`` if there is none.

        The key is normalised (:func:`~clawstack.gateway.keys.normalize_session_key`). An agent key's agent must be
        ``agent_id``; an existing session must belong to ``agent_id``. ``owner``, ``label`` and ``metadata`` apply
        only when the session is created.
        """
        parsed = parse_session_key(key)
        text = str(parsed)
        agent = normalize_agent_id(agent_id)
        if parsed.agent_id is not None and parsed.agent_id != agent:
            raise SessionAgentMismatchError("the session key names a different agent")
        _check_text(owner, "owner", max_length=MAX_ID_LENGTH)
        _check_text(label, "label", max_length=MAX_ID_LENGTH)
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidRequestError("metadata must be a JSON object")
        metadata_json = _dump_json(metadata if metadata is not None else {}, "metadata")
        with self._write() as db:
            existing = self._live(db, text)
            if existing is not None:
                if existing.agent_id != agent:
                    raise SessionAgentMismatchError("the session belongs to a different agent")
                return existing
            now = self._now_ms()
            session = Session(text, agent, new_uuid(), now, now, owner, label, json.loads(metadata_json), False)
            db.execute(
                f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,0)",
                (text, agent, session.session_id, now, now, owner, label, metadata_json),
            )
            return session

    def get(self, key: str) -> Session | None:
        """The live session for ``key``, or ``None`` (never a deleted one)."""
        text = str(parse_session_key(key))
        with self._read() as db:
            return self._live(db, text)

    def list(self, *, agent_id: str | None = None, limit: int = 100, offset: int = 0) -> builtins.list[Session]:
        """Live sessions, most recently updated first (key order breaks ties), optionally of one agent.

        ``offset`` skips that many from the start of this order; ``limit`` (1 to 1000) bounds the answer.
        """
        _check_int(limit, "limit", minimum=1, maximum=MAX_LIST_LIMIT)
        _check_int(offset, "offset", minimum=0)
        where, params = "deleted=0", []
        if agent_id is not None:
            where += " AND agent_id=?"
            params.append(normalize_agent_id(agent_id))
        with self._read() as db:
            rows = db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE {where} ORDER BY updated_at_ms DESC, key ASC "
                "LIMIT ? OFFSET ?",
                (*params, limit, offset),
            ).fetchall()
        return [_session_from_row(row) for row in rows]

    def delete(self, key: str) -> bool:
        """Mark the live session for ``key`` deleted; ``False`` if there was none.

        Its transcript and runs stay in the file but are hidden; the key is free for a new session.
        """
        text = str(parse_session_key(key))
        with self._write() as db:
            cursor = db.execute(
                "UPDATE sessions SET deleted=1, updated_at_ms=? WHERE key=? AND deleted=0", (self._now_ms(), text)
            )
            return cursor.rowcount > 0

    def reset(self, key: str) -> Session:
        """Start a new incarnation of the live session for ``key``: same key, agent, owner, label and metadata, a
        new ``session_id`` and an empty transcript (the old one stays in the file, hidden). One transaction.

        :class:`SessionNotFoundError` if there is no live session for ``key``.
        """
        text = str(parse_session_key(key))
        with self._write() as db:
            old = self._live(db, text)
            if old is None:
                raise SessionNotFoundError("no live session has this key")
            now = self._now_ms()
            db.execute("UPDATE sessions SET deleted=1, updated_at_ms=? WHERE session_id=?", (now, old.session_id))
            session = replace(old, session_id=new_uuid(), created_at_ms=now, updated_at_ms=now)
            db.execute(
                f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,0)",
                (text, old.agent_id, session.session_id, now, now, old.owner, old.label, _dump_json(old.metadata, "m")),
            )
            return session

    # -- transcripts -------------------------------------------------------------------------------------------

    def append(self, key: str, message: NewMessage) -> Message:
        """Append ``message`` to the live session's transcript and return it as stored, with its ``seq``.

        A message whose ``idempotency_key`` is already in this transcript is not appended again: the stored one is
        returned unchanged. Appending to a deleted session raises :class:`SessionDeletedError`.
        """
        text = str(parse_session_key(key))
        if message.role not in ROLES:
            raise InvalidRequestError("role must be one of user, assistant, tool, system")
        content_json = _check_content(message.content)
        if message.timestamp_ms is not None:
            _check_int(message.timestamp_ms, "timestamp_ms", minimum=0)
        strings = {
            "run_id": message.run_id,
            "idempotency_key": message.idempotency_key,
            "provider": message.provider,
            "model": message.model,
            "stop_reason": message.stop_reason,
        }
        for name, value in strings.items():
            _check_text(value, name, max_length=MAX_ID_LENGTH)
        if message.usage is not None and not isinstance(message.usage, dict):
            raise InvalidRequestError("usage must be a JSON object")
        usage_json = None if message.usage is None else _dump_json(message.usage, "usage")
        with self._write() as db:
            session = self._require_live(db, text)
            if message.idempotency_key is not None:
                row = db.execute(
                    f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id=? AND idempotency_key=?",
                    (session.session_id, message.idempotency_key),
                ).fetchone()
                if row is not None:
                    return _message_from_row(row)
            seq = int(
                db.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id=?", (session.session_id,)
                ).fetchone()[0]
            )
            now = self._now_ms()
            timestamp = message.timestamp_ms if message.timestamp_ms is not None else now
            row = (
                session.session_id,
                seq,
                message.role,
                content_json,
                timestamp,
                message.run_id,
                message.idempotency_key,
                message.provider,
                message.model,
                usage_json,
                message.stop_reason,
            )
            db.execute(f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
            db.execute("UPDATE sessions SET updated_at_ms=? WHERE session_id=?", (now, session.session_id))
        return _message_from_row(row)

    def history(
        self, key: str, *, limit: int = DEFAULT_HISTORY_LIMIT, offset: int = 0, max_chars: int | None = None
    ) -> HistoryPage:
        """A window of the live session's transcript, counted back from the newest message.

        With ``total`` messages (``seq`` 1 … ``total``), the window skips the newest ``offset`` messages and holds
        the ``limit`` messages before them: ``seq`` from ``max(1, total - offset - limit + 1)`` to
        ``total - offset``, oldest first. ``has_more`` says older messages precede the window; to page back, call
        again with ``offset + limit``. ``limit`` is 1 to 1000; an offset at or past ``total`` gives no messages.
        With ``max_chars``, every text longer than that (a string content, or the ``text`` of a ``text`` block) is
        cut to its first ``max_chars`` characters followed by :data:`TRUNCATION_MARKER`, and the message is marked
        ``truncated``; the stored transcript is unchanged. A key with no live session reads as empty.
        """
        text = str(parse_session_key(key))
        _check_int(limit, "limit", minimum=1, maximum=MAX_HISTORY_LIMIT)
        _check_int(offset, "offset", minimum=0)
        if max_chars is not None:
            _check_int(max_chars, "max_chars", minimum=1)
        with self._read() as db:
            session = self._live(db, text)
            if session is None:
                return HistoryPage([], 0, False)
            total = int(
                db.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id=?", (session.session_id,)
                ).fetchone()[0]
            )
            high = total - offset
            low = max(1, high - limit + 1)
            rows = db.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id=? AND seq BETWEEN ? AND ? ORDER BY seq",
                (session.session_id, low, high),
            ).fetchall()
        messages = [_message_from_row(row) for row in rows]
        if max_chars is not None:
            messages = [_truncate(message, max_chars) for message in messages]
        return HistoryPage(messages, total, high > 0 and low > 1)

    # -- runs --------------------------------------------------------------------------------------------------

    def start_run(self, run_id: str, key: str, *, idempotency_key: str | None = None) -> tuple[Run, bool]:
        """Record run ``run_id`` as ``accepted`` on the live session for ``key``: ``(run, created)``.

        If this session key already has a run with ``idempotency_key``, or ``run_id`` is already recorded for this
        key, that run is returned with ``created`` false and nothing is written: a retried request never starts a
        second run. A ``run_id`` recorded for another key raises :class:`RunConflictError`.
        """
        _check_text(run_id, "run_id", optional=False, max_length=MAX_ID_LENGTH)
        _check_text(idempotency_key, "idempotency_key", max_length=MAX_ID_LENGTH)
        text = str(parse_session_key(key))
        with self._write() as db:
            if idempotency_key is not None:
                existing = self._find_idempotent(db, text, idempotency_key)
                if existing is not None:
                    return existing, False
            existing = self._run(db, run_id)
            if existing is not None:
                if existing.session_key != text:
                    raise RunConflictError("the run id is already recorded for another session")
                return existing, False
            session = self._require_live(db, text)
            run = Run(run_id, text, session.session_id, "accepted", self._now_ms(), None, None, idempotency_key)
            db.execute(
                f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                (
                    run.run_id,
                    run.session_key,
                    run.session_id,
                    run.state,
                    run.started_at_ms,
                    None,
                    None,
                    idempotency_key,
                ),
            )
            return run, True

    def mark_running(self, run_id: str) -> Run:
        """Move an ``accepted`` run to ``running`` (a ``running`` run is returned as is)."""
        _check_text(run_id, "run_id", optional=False, max_length=MAX_ID_LENGTH)
        with self._write() as db:
            run = self._require_run(db, run_id)
            if run.state == "running":
                return run
            if run.state != "accepted":
                raise RunStateError(f"a run in state {run.state!r} cannot start running")
            db.execute("UPDATE runs SET state='running' WHERE run_id=?", (run_id,))
            return replace(run, state="running")

    def finish_run(self, run_id: str, state: RunState, error: str | None = None) -> Run:
        """Record the run's terminal ``state`` (``ok``, ``error``, ``timeout``, ``aborted`` or ``interrupted``).

        Finishing a run again with the state it already has returns it unchanged; any other change to a finished
        run raises :class:`RunStateError`.
        """
        if state not in TERMINAL_RUN_STATES:
            raise InvalidRequestError("a run finishes as ok, error, timeout, aborted or interrupted")
        _check_text(run_id, "run_id", optional=False, max_length=MAX_ID_LENGTH)
        _check_text(error, "error")
        with self._write() as db:
            run = self._require_run(db, run_id)
            if run.state == state:
                return run
            if not run.active:
                raise RunStateError(f"the run already finished as {run.state!r}")
            ended = self._now_ms()
            db.execute("UPDATE runs SET state=?, ended_at_ms=?, error=? WHERE run_id=?", (state, ended, error, run_id))
            return replace(run, state=state, ended_at_ms=ended, error=error)

    def get_run(self, run_id: str) -> Run | None:
        """The run record for ``run_id``, or ``None``."""
        _check_text(run_id, "run_id", optional=False, max_length=MAX_ID_LENGTH)
        with self._read() as db:
            return self._run(db, run_id)

    def run_session(self, run_id: str) -> Session | None:
        """The session ``run_id`` belongs to, deleted or not, or ``None`` for an unknown run."""
        _check_text(run_id, "run_id", optional=False, max_length=MAX_ID_LENGTH)
        with self._read() as db:
            row = db.execute(
                f"SELECT {', '.join('s.' + c.strip() for c in _SESSION_COLUMNS.split(','))} FROM runs r "
                "JOIN sessions s ON s.session_id = r.session_id WHERE r.run_id=?",
                (run_id,),
            ).fetchone()
        return None if row is None else _session_from_row(row)

    def find_message(self, key: str, idempotency_key: str) -> Message | None:
        """The live session's message recorded with ``idempotency_key``, or ``None``."""
        text = str(parse_session_key(key))
        _check_text(idempotency_key, "idempotency_key", optional=False, max_length=MAX_ID_LENGTH * 2)
        with self._read() as db:
            session = self._live(db, text)
            if session is None:
                return None
            row = db.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id=? AND idempotency_key=?",
                (session.session_id, idempotency_key),
            ).fetchone()
        return None if row is None else _message_from_row(row)

    def run_messages(self, run_id: str) -> builtins.list[Message]:
        """The transcript messages ``run_id`` appended, in order."""
        _check_text(run_id, "run_id", optional=False, max_length=MAX_ID_LENGTH)
        with self._read() as db:
            run = self._run(db, run_id)
            if run is None:
                return []
            rows = db.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id=? AND run_id=? ORDER BY seq",
                (run.session_id, run_id),
            ).fetchall()
        return [_message_from_row(row) for row in rows]

    def active_runs(self, key: str) -> builtins.list[Run]:
        """The live session's runs still ``accepted`` or ``running``, oldest first (none for no live session)."""
        text = str(parse_session_key(key))
        with self._read() as db:
            session = self._live(db, text)
            if session is None:
                return []
            rows = db.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE session_id=? AND state IN ('accepted', 'running') "
                "ORDER BY started_at_ms, run_id",
                (session.session_id,),
            ).fetchall()
        return [_run_from_row(row) for row in rows]

    def find_by_idempotency_key(self, key: str, idempotency_key: str) -> Run | None:
        """The run started on session key ``key`` with ``idempotency_key``, whatever its state, or ``None``."""
        text = str(parse_session_key(key))
        _check_text(idempotency_key, "idempotency_key", optional=False, max_length=MAX_ID_LENGTH)
        with self._read() as db:
            return self._find_idempotent(db, text, idempotency_key)

    def release_claimed_sessions(self) -> builtins.list[str]:
        """At start-up: free every key a plugin holds that is not a subagent key; return those keys.

        A plugin may own only the ``agent:<id>:subagent:<name>`` sessions it created. A live session of another
        kind recorded with a plugin owner (``plugin:<id>``) was claimed before that rule held; it is marked deleted
        (its transcript stays in the file, hidden), so the key is free for the person it belongs to.
        """
        with self._write() as db:
            rows = db.execute(
                "SELECT session_id, key FROM sessions WHERE deleted=0 AND owner LIKE 'plugin:%' ORDER BY key"
            ).fetchall()
            claimed = [(str(sid), str(key)) for sid, key in rows if parse_session_key(str(key)).kind != "subagent"]
            now = self._now_ms()
            for session_id, _ in claimed:
                db.execute("UPDATE sessions SET deleted=1, updated_at_ms=? WHERE session_id=?", (now, session_id))
        return [key for _, key in claimed]

    def mark_interrupted(self) -> builtins.list[str]:
        """At start-up: record every run left ``accepted`` or ``running`` as ``interrupted``; return their ids."""
        with self._write() as db:
            rows = db.execute(
                "SELECT run_id FROM runs WHERE state IN ('accepted', 'running') ORDER BY started_at_ms, run_id"
            ).fetchall()
            db.execute(
                "UPDATE runs SET state='interrupted', ended_at_ms=?, error=? WHERE state IN ('accepted', 'running')",
                (self._now_ms(), INTERRUPTED_ERROR),
            )
        return [str(row[0]) for row in rows]

    @staticmethod
    def _run(db: sqlite3.Connection, run_id: str) -> Run | None:
        row = db.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return None if row is None else _run_from_row(row)

    @staticmethod
    def _require_run(db: sqlite3.Connection, run_id: str) -> Run:
        run = SessionStore._run(db, run_id)
        if run is None:
            raise RunNotFoundError("no run has this id")
        return run

    @staticmethod
    def _find_idempotent(db: sqlite3.Connection, key: str, idempotency_key: str) -> Run | None:
        row = db.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE session_key=? AND idempotency_key=?", (key, idempotency_key)
        ).fetchone()
        return None if row is None else _run_from_row(row)


__all__ = [
    "ACTIVE_RUN_STATES",
    "DEFAULT_HISTORY_LIMIT",
    "INTERRUPTED_ERROR",
    "MAX_HISTORY_LIMIT",
    "MAX_LIST_LIMIT",
    "ROLES",
    "TERMINAL_RUN_STATES",
    "TRUNCATION_MARKER",
    "Content",
    "HistoryPage",
    "InvalidRequestError",
    "Message",
    "NewMessage",
    "Role",
    "Run",
    "RunConflictError",
    "RunNotFoundError",
    "RunState",
    "RunStateError",
    "Session",
    "SessionAgentMismatchError",
    "SessionDeletedError",
    "SessionError",
    "SessionNotFoundError",
    "SessionStore",
    "SessionStoreError",
    "SessionStoreLockedError",
    "content_text",
]

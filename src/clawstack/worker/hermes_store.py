"""What Hermes's session store in the home says about one turn: which session holds it, and the reply it stored.

The store is Hermes's ``state.db`` (SQLite, WAL): ``sessions(id, parent_session_id, end_reason, started_at, …)``
and ``messages(id, session_id, role, content, active, …)``. The wrapper reads it read-only, before the turn
(:func:`snapshot`) and after it, and never trusts Hermes's output for the session:

* on a resume the turn's session is the saved session, or its compression continuation: a session that ended with
  ``end_reason = 'compression'`` continues in its newest child (``parent_session_id`` names it), followed to the
  end of the chain;
* on a first run it is the one new session without a parent (followed the same way).

Anything else (no such record, two new roots, a chain that ends in a compressed session without continuation, a
store that cannot be read) is :class:`SessionUnprovenError`. The wrapper never guesses from the newest message.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import quote

MAX_CHAIN: Final = 10_000
"""A compression chain longer than this is not one Hermes wrote."""


class SessionUnprovenError(Exception):
    """The store does not show which session holds the turn."""


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """The store before a turn: the sessions it held and the last message id (0 for an empty or new store)."""

    sessions: frozenset[str]
    last_message_id: int


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=5.0)


def snapshot(path: Path) -> StoreSnapshot:
    """The store at ``path`` now; a store that does not exist yet is empty. ``sqlite3.Error`` if it is unreadable."""
    if not path.exists():
        return StoreSnapshot(frozenset(), 0)
    with _connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not {"sessions", "messages"} <= tables:
            return StoreSnapshot(frozenset(), 0)
        sessions = frozenset(str(row[0]) for row in db.execute("SELECT id FROM sessions"))
        last = db.execute("SELECT COALESCE(MAX(id), 0) FROM messages").fetchone()[0]
    return StoreSnapshot(sessions, int(last))


def turn_session(path: Path, before: StoreSnapshot, saved: str | None) -> str:
    """The session that holds the turn just run (see the module docstring)."""
    try:
        with _connect(path) as db:
            if saved is not None:
                return _follow(db, saved)
            rows = db.execute("SELECT id, parent_session_id FROM sessions").fetchall()
            roots = [str(row[0]) for row in rows if str(row[0]) not in before.sessions and row[1] is None]
            if len(roots) != 1:
                raise SessionUnprovenError(f"{len(roots)} new sessions without a parent")
            return _follow(db, roots[0])
    except sqlite3.Error as exc:
        raise SessionUnprovenError(f"the session store could not be read ({type(exc).__name__})") from exc


def _follow(db: sqlite3.Connection, session: str) -> str:
    for _ in range(MAX_CHAIN):
        row = db.execute("SELECT end_reason FROM sessions WHERE id = ?", (session,)).fetchone()
        if row is None:
            raise SessionUnprovenError("a session of the chain has no record")
        if row[0] != "compression":
            return session
        child = db.execute(
            "SELECT id FROM sessions WHERE parent_session_id = ? ORDER BY started_at DESC, id DESC LIMIT 1",
            (session,),
        ).fetchone()
        if child is None:
            raise SessionUnprovenError("a compressed session has no continuation")
        session = str(child[0])
    raise SessionUnprovenError("the compression chain does not end")


def stored_reply(path: Path, before: StoreSnapshot, session: str | None = None) -> str | None:
    """The last non-empty assistant message stored after ``before`` (in ``session``, or in any session), or
    ``None`` when the turn stored none. ``sqlite3.Error`` if the store is unreadable."""
    if not path.exists():
        return None
    query = (
        "SELECT content FROM messages WHERE id > ? AND role = 'assistant' AND COALESCE(active, 1) = 1 "
        "AND content IS NOT NULL AND content != ''"
    )
    params: tuple[object, ...] = (before.last_message_id,)
    if session is not None:
        query += " AND session_id = ?"
        params += (session,)
    with _connect(path) as db:
        row = db.execute(query + " ORDER BY id DESC LIMIT 1", params).fetchone()
    return None if row is None else str(row[0])


__all__ = ["SessionUnprovenError", "StoreSnapshot", "snapshot", "stored_reply", "turn_session"]

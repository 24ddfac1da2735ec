"""Resumable Streamable HTTP streams (SEP-1699): the MCP SDK's :class:`~mcp.server.streamable_http.EventStore`,
kept in memory, one bounded log per MCP session.

The SDK's transport stores every message it puts on an SSE stream (and, for a 2025-11-25 client, one *priming*
event with empty data at the start of each ``POST`` stream) and sends the event id with it; a client whose stream
was cut sends ``GET`` with ``Last-Event-ID`` and gets what followed that event on the same stream. The SDK hands
one store to every session and names streams by JSON-RPC request id, which repeats across sessions, so this store
keeps one :class:`SessionEvents` log per MCP session and works on the log of the session the current request (or
the session's own message loop) belongs to: :meth:`SessionEventStore.use`, set by
:class:`~clawstack.connect.mcp_sessions.McpSessions` for each request it admits. A session's message loop is started
by the request that opens the session and inherits that request's context, so what it stores lands in the same
log.

* An event id is ``<session tag>-<n>``: the tag is random per session, so an id from another session is unknown
  here, and ids reveal nothing about other sessions' traffic.
* A replay looks only in the current session's log: another session's id, an evicted id or a malformed one
  replays nothing, alike.
* Bounds: at most ``max_events_per_session`` events per session and ``max_events`` in all; past either, the oldest
  event (of that session, or of all) is dropped. A session's log is dropped when the session ends. Nothing is
  written to disk: a restart of ``claw connect`` ends every MCP session anyway.
"""

from __future__ import annotations

import contextvars
import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

DEFAULT_MAX_EVENTS_PER_SESSION: Final = 256
DEFAULT_MAX_EVENTS: Final = 4096
_log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class _Event:
    log: SessionEvents
    seq: int
    stream_id: StreamId
    message: JSONRPCMessage | None


@dataclass(eq=False)
class SessionEvents:
    """One MCP session's events, oldest first (see the module docstring)."""

    tag: str = field(default_factory=lambda: secrets.token_hex(8))
    events: OrderedDict[int, _Event] = field(default_factory=OrderedDict)
    next_seq: int = 1
    closed: bool = False

    def event_id(self, seq: int) -> EventId:
        return f"{self.tag}-{seq}"

    def seq_of(self, event_id: EventId) -> int | None:
        """The sequence number of one of this log's event ids, else ``None``."""
        tag, sep, seq = event_id.rpartition("-")
        if not sep or tag != self.tag or not seq.isdigit() or len(seq) > 18:
            return None
        return int(seq)


class SessionEventStore(EventStore):
    """The bounded, per-session, in-memory :class:`EventStore` passed to the SDK (module docstring)."""

    def __init__(
        self, *, max_events_per_session: int = DEFAULT_MAX_EVENTS_PER_SESSION, max_events: int = DEFAULT_MAX_EVENTS
    ) -> None:
        if max_events_per_session < 1 or max_events < 1:
            raise ValueError("event store bounds must be positive")
        self.max_events_per_session = max_events_per_session
        self.max_events = max_events
        self._all: OrderedDict[_Event, None] = OrderedDict()
        self._current: contextvars.ContextVar[SessionEvents | None] = contextvars.ContextVar(
            "clawconnect_session_events", default=None
        )
        self._unbound = 0

    @property
    def size(self) -> int:
        """How many events are kept, over all sessions. (Not ``__len__``: the SDK tests the store for truth.)"""
        return len(self._all)

    def open_session(self) -> SessionEvents:
        """A new, empty log for one MCP session."""
        return SessionEvents()

    def close_session(self, log: SessionEvents) -> None:
        """Drop ``log``'s events; it stores nothing more. Idempotent."""
        log.closed = True
        for event in log.events.values():
            self._all.pop(event, None)
        log.events.clear()

    def use(self, log: SessionEvents) -> contextvars.Token[SessionEvents | None]:
        """Make ``log`` the current session's log for this task (and the tasks it starts from now on)."""
        return self._current.set(log)

    def release(self, token: contextvars.Token[SessionEvents | None]) -> None:
        self._current.reset(token)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        log = self._current.get()
        if log is None or log.closed:
            # Outside any session (or after it ended): nothing to resume into, so nothing is kept; the id is unique
            # and unknown to every log.
            self._unbound += 1
            _log.debug("an SSE event outside an open MCP session is not kept")
            return f"unbound-{self._unbound}"
        seq = log.next_seq
        log.next_seq += 1
        event = _Event(log, seq, stream_id, message)
        log.events[seq] = event
        self._all[event] = None
        if len(log.events) > self.max_events_per_session:
            _, oldest = log.events.popitem(last=False)
            self._all.pop(oldest, None)
        while len(self._all) > self.max_events:
            oldest, _ = self._all.popitem(last=False)
            oldest.log.events.pop(oldest.seq, None)
        return log.event_id(seq)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        log = self._current.get()
        seq = log.seq_of(last_event_id) if log is not None and not log.closed else None
        if log is None or seq is None or seq not in log.events:
            _log.debug("Last-Event-ID names no event of this MCP session: nothing to replay")
            return None
        stream_id = log.events[seq].stream_id
        later = [e for e in log.events.values() if e.seq > seq and e.stream_id == stream_id and e.message is not None]
        for event in later:
            assert event.message is not None
            await send_callback(EventMessage(event.message, log.event_id(event.seq)))
        return stream_id


__all__ = ["DEFAULT_MAX_EVENTS", "DEFAULT_MAX_EVENTS_PER_SESSION", "SessionEventStore", "SessionEvents"]

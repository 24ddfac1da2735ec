"""A sans-I/O decoder for server-sent events (the ``text/event-stream`` wire format).

Feed it bytes as they arrive, in pieces of any size; it returns the complete events so far. It follows the
WHATWG event-stream rules that OpenAI-compatible streams use: lines end with ``\\n`` or ``\\r\\n``; a blank line
ends an event; ``data`` lines of one event are joined with ``\\n``; lines starting with ``:`` are comments; a
field without a colon has an empty value. ``id`` and ``retry`` are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from clawstack.llm.errors import LLMProtocolError

DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event: its ``event`` name (``"message"`` unless the stream named it) and its data."""

    event: str
    data: str


class SSEDecoder:
    """Incremental event-stream decoder with a bound on the size of one event."""

    def __init__(self, *, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max_event_bytes = max_event_bytes
        self._buffer = bytearray()
        self._event = ""
        self._data: list[str] = []
        self._event_bytes = 0

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Add received bytes; return every event they complete."""
        self._buffer += chunk
        events: list[ServerSentEvent] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if line.endswith(b"\r"):
                line = line[:-1]
            event = self._line(line)
            if event is not None:
                events.append(event)
        if len(self._buffer) + self._event_bytes > self._max_event_bytes:
            raise LLMProtocolError(
                f"malformed response from the model endpoint: an SSE event exceeds {self._max_event_bytes} bytes"
            )
        return events

    @property
    def pending(self) -> bool:
        """Whether bytes or an unfinished event are buffered (the stream stopped mid-event)."""
        return bool(self._buffer) or bool(self._data) or bool(self._event)

    def _line(self, raw: bytes) -> ServerSentEvent | None:
        if not raw:
            return self._dispatch()
        self._event_bytes += len(raw)
        if self._event_bytes > self._max_event_bytes:
            raise LLMProtocolError(
                f"malformed response from the model endpoint: an SSE event exceeds {self._max_event_bytes} bytes"
            )
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise LLMProtocolError("malformed response from the model endpoint: SSE line is not UTF-8") from exc
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event = self._data, self._event
        self._data, self._event, self._event_bytes = [], "", 0
        if not data:
            return None
        return ServerSentEvent(event=event or "message", data="\n".join(data))

"""The gateway's front door: how much an unauthenticated connection may make the gateway read.

aiohttp bounds one WebSocket message by ``max_msg_size`` for the whole life of a connection, and that bound is
``policy.maxPayload`` (25 MiB), which only an authenticated client should be able to spend. A
:class:`PreHandshakeBudget` sits between the connection's transport and aiohttp's protocol from the upgrade until
the handshake succeeds: it passes on at most ``limit`` bytes, then stops reading (the peer's writes back up in its
own buffers) and sets :attr:`PreHandshakeBudget.exceeded`, so the server can refuse the handshake without having
buffered the rest. :meth:`PreHandshakeBudget.release` hands the transport back to aiohttp once the connection has
authenticated; from then on only ``maxPayload`` applies.

The budget counts bytes on the wire (frame headers included) from the moment it is installed, and the WebSocket
server must not negotiate compression, so that wire bytes bound message bytes.
"""

from __future__ import annotations

import asyncio
from typing import Final

__all__ = ["MAX_FRAME_OVERHEAD", "PreHandshakeBudget"]

#: The largest header of one client frame: 2 bytes, an 8-byte extended length, a 4-byte mask.
MAX_FRAME_OVERHEAD: Final = 14


class PreHandshakeBudget(asyncio.Protocol):
    """Passes at most ``limit`` received bytes on to the transport's protocol (see the module docstring).

    :meth:`install` puts it in front of the transport's current protocol; every callback is forwarded to that
    protocol, so the connection behaves exactly as without it until the budget is spent.
    """

    def __init__(self, transport: asyncio.Transport, limit: int) -> None:
        if limit < 1:
            raise ValueError("a pre-handshake budget must be positive")
        self._transport = transport
        self._inner = transport.get_protocol()
        self._left = limit
        self._released = False
        self.exceeded = asyncio.Event()
        """Set once the peer sent more than the budget; later bytes are not read."""

    @classmethod
    def install(cls, transport: asyncio.Transport, limit: int) -> PreHandshakeBudget:
        """Put a new budget in front of ``transport``'s protocol."""
        budget = cls(transport, limit)
        transport.set_protocol(budget)
        return budget

    def release(self) -> bool:
        """Hand the transport back to its protocol; ``False`` (and nothing changes) if the budget was exceeded,
        since bytes were then withheld from the protocol and the stream cannot be resumed."""
        if self.exceeded.is_set():
            return False
        if not self._released:
            self._released = True
            if self._transport.get_protocol() is self:
                self._transport.set_protocol(self._inner)
        return True

    # -- asyncio.Protocol --------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.exceeded.is_set():
            return
        if len(data) > self._left:
            self._left = 0
            self.exceeded.set()
            self._transport.pause_reading()
            return
        self._left -= len(data)
        self._inner.data_received(data)  # type: ignore[attr-defined]

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()  # type: ignore[attr-defined,no-any-return]

    def connection_lost(self, exc: Exception | None) -> None:
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

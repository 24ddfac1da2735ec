"""An injectable clock: monotonic time for deadlines, wall time for timestamps, and sleeping.

Services take a :class:`Clock` instead of calling :mod:`time` directly, so tests drive time with
:class:`ManualClock` rather than sleeping. Relative durations are seconds (``float``, named ``*_s``);
absolute wall times are timezone-aware UTC :class:`~datetime.datetime` values.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """What a service needs from time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def now(self) -> datetime:
        """The current wall time, timezone-aware UTC."""
        ...

    async def sleep(self, delay_s: float) -> None:
        """Wait ``delay_s`` seconds of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, delay_s: float) -> None:
        await asyncio.sleep(max(0.0, delay_s))


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance` (or :meth:`set_wall`).

    Sleepers wake, in deadline order, when an advance reaches their deadline. Monotonic and wall time advance
    together; :meth:`set_wall` moves only the wall clock, as NTP might.
    """

    def __init__(self, *, start: datetime | None = None, monotonic_start: float = 1000.0) -> None:
        wall = start if start is not None else datetime(2026, 1, 1, tzinfo=UTC)
        if wall.tzinfo is None:
            raise ValueError("ManualClock start must be timezone-aware")
        self._wall = wall.astimezone(UTC)
        self._mono = monotonic_start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        return self._wall

    async def sleep(self, delay_s: float) -> None:
        if delay_s <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + delay_s, next(self._order), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending (cancelled ones excluded)."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    def advance(self, delta_s: float) -> None:
        """Move both clocks forward by ``delta_s`` seconds and wake every sleeper now due."""
        if delta_s < 0:
            raise ValueError("a clock never goes backwards")
        self._mono += delta_s
        self._wall += timedelta(seconds=delta_s)
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def set_wall(self, wall: datetime) -> None:
        """Jump the wall clock (either way) without moving monotonic time."""
        if wall.tzinfo is None:
            raise ValueError("wall time must be timezone-aware")
        self._wall = wall.astimezone(UTC)


def format_timestamp(value: datetime) -> str:
    """RFC 3339 UTC with second precision and a ``Z``: ``2026-11-10T21:30:00Z``."""
    if value.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return value.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    """Parse an RFC 3339 timestamp that carries an offset (``Z`` or ``±hh:mm``); refuse naive ones."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError("not an RFC 3339 timestamp") from exc
    if value.tzinfo is None or "T" not in text.upper():
        raise ValueError("timestamp needs a date, a time and an offset such as Z")
    return value.astimezone(UTC)


__all__ = ["Clock", "ManualClock", "SystemClock", "format_timestamp", "parse_timestamp"]

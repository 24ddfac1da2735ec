"""The injectable clock and identifiers."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from clawstack.common.clock import ManualClock, SystemClock, format_timestamp, parse_timestamp
from clawstack.common.ids import new_id, new_secret, new_uuid, secrets_equal


async def test_manual_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = ManualClock()
    woke: list[str] = []

    async def sleeper(name: str, delay: float) -> None:
        await clock.sleep(delay)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("late", 10)), asyncio.create_task(sleeper("early", 5))]
    while clock.sleepers < 2:  # noqa: ASYNC110 (yield until both tasks have reached their sleep)
        await asyncio.sleep(0)
    clock.advance(4.9)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(0.1)
    await asyncio.sleep(0)
    assert woke == ["early"]
    clock.advance(100)
    await asyncio.gather(*tasks)
    assert woke == ["early", "late"]


async def test_manual_clock_moves_monotonic_and_wall_together() -> None:
    start = datetime(2026, 11, 10, 21, 30, tzinfo=UTC)
    clock = ManualClock(start=start, monotonic_start=50.0)
    clock.advance(90)
    assert clock.monotonic() == 140.0
    assert clock.now() == start + timedelta(seconds=90)
    clock.set_wall(start - timedelta(hours=1))  # wall time may jump back; monotonic never does
    assert clock.monotonic() == 140.0
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="timezone"):
        ManualClock(start=datetime(2026, 1, 1))


async def test_cancelled_sleep_is_not_counted() -> None:
    clock = ManualClock()
    task = asyncio.create_task(clock.sleep(5))
    await asyncio.sleep(0)
    assert clock.sleepers == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.sleepers == 0
    clock.advance(10)  # waking a cancelled sleeper is harmless


async def test_system_clock() -> None:
    clock = SystemClock()
    before = clock.monotonic()
    await clock.sleep(0)
    assert clock.monotonic() >= before
    assert clock.now().tzinfo is UTC


def test_timestamps() -> None:
    value = datetime(2026, 11, 10, 21, 30, 0, 123456, tzinfo=UTC)
    assert format_timestamp(value) == "2026-11-10T21:30:00Z"
    assert parse_timestamp("2026-11-10T21:30:00Z") == value.replace(microsecond=0)
    assert parse_timestamp("2026-11-10T22:30:00+01:00") == value.replace(microsecond=0)
    for bad in ("2026-11-10T21:30:00", "2026-11-10", "yesterday", ""):
        with pytest.raises(ValueError, match="timestamp"):
            parse_timestamp(bad)
    with pytest.raises(ValueError, match="timezone"):
        format_timestamp(datetime(2026, 1, 1))


def test_ids_and_secrets() -> None:
    ids = {new_id("run_") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("run_") and len(i) == 30 and i[4:].isalnum() for i in ids)
    assert len(new_uuid()) == 36
    assert len(new_secret()) >= 43
    with pytest.raises(ValueError, match="entropy"):
        new_secret(8)
    assert secrets_equal("abc", "abc")
    assert not secrets_equal("abc", "abd")
    assert not secrets_equal(b"abc", b"abcd")

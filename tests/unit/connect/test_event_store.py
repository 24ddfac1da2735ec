"""The resumable event store: one bounded log per MCP session, ids that name their session, replays that never
leave it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.server.streamable_http import EventMessage
from mcp_types import JSONRPCNotification

from clawstack.connect.event_store import SessionEvents, SessionEventStore

T = TypeVar("T")


def note(n: int) -> JSONRPCNotification:
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": n})


async def within(store: SessionEventStore, log: SessionEvents, step: Callable[[], Awaitable[T]]) -> T:
    """Run ``step`` with ``log`` as the current session's log, as a request of that session would."""
    token = store.use(log)
    try:
        return await step()
    finally:
        store.release(token)


async def put(store: SessionEventStore, log: SessionEvents, stream: str, message: JSONRPCNotification | None) -> str:
    return await within(store, log, lambda: store.store_event(stream, message))


async def replay(store: SessionEventStore, log: SessionEvents, last: str) -> tuple[str | None, list[EventMessage]]:
    sent: list[EventMessage] = []

    async def collect(event: EventMessage) -> None:
        sent.append(event)

    stream = await within(store, log, lambda: store.replay_events_after(last, collect))
    return stream, sent


async def test_a_replay_sends_what_followed_on_the_same_stream_and_skips_priming() -> None:
    store = SessionEventStore()
    log = store.open_session()
    priming = await put(store, log, "7", None)
    first = await put(store, log, "7", note(1))
    await put(store, log, "_GET_stream", note(2))
    third = await put(store, log, "7", note(3))
    assert len({priming, first, third}) == 3
    stream, sent = await replay(store, log, priming)
    assert stream == "7"
    assert [(event.message, event.event_id) for event in sent] == [(note(1), first), (note(3), third)]
    assert await replay(store, log, third) == ("7", [])


@pytest.mark.parametrize("last", ["", "nope", "-1", "abc-", "x-1", "0-0", "1" * 40])
async def test_unknown_and_malformed_ids_replay_nothing(last: str) -> None:
    store = SessionEventStore()
    log = store.open_session()
    await put(store, log, "1", note(1))
    assert await replay(store, log, last) == (None, [])


async def test_another_sessions_id_replays_nothing_in_this_one() -> None:
    store = SessionEventStore()
    mine, theirs = store.open_session(), store.open_session()
    theirs_first = await put(store, theirs, "1", None)
    await put(store, theirs, "1", note(1))
    await put(store, mine, "1", None)
    await put(store, mine, "1", note(2))
    assert await replay(store, mine, theirs_first) == (None, [])
    assert (await replay(store, theirs, theirs_first))[1][0].message == note(1)  # positive control


async def test_each_session_keeps_its_newest_events_and_all_sessions_a_bounded_total() -> None:
    store = SessionEventStore(max_events_per_session=3, max_events=5)
    one, two = store.open_session(), store.open_session()
    ids = [await put(store, one, "s", note(i)) for i in range(4)]
    assert store.size == 3
    assert await replay(store, one, ids[0]) == (None, [])  # evicted: replays nothing
    assert [e.message for e in (await replay(store, one, ids[1]))[1]] == [note(2), note(3)]
    more = [await put(store, two, "s", note(10 + i)) for i in range(3)]
    assert store.size == 5  # the oldest of all went: the first session's
    assert await replay(store, one, ids[1]) == (None, [])
    assert [e.message for e in (await replay(store, one, ids[2]))[1]] == [note(3)]
    assert [e.message for e in (await replay(store, two, more[0]))[1]] == [note(11), note(12)]


async def test_a_closed_session_keeps_nothing() -> None:
    store = SessionEventStore()
    log = store.open_session()
    first = await put(store, log, "1", note(1))
    store.close_session(log)
    assert store.size == 0
    await put(store, log, "1", note(2))
    assert store.size == 0
    assert await replay(store, log, first) == (None, [])
    store.close_session(log)  # idempotent


async def test_outside_any_session_nothing_is_kept() -> None:
    store = SessionEventStore()
    one = await store.store_event("1", note(1))
    two = await store.store_event("1", note(2))
    assert one != two
    assert store.size == 0
    sent: list[EventMessage] = []

    async def collect(event: EventMessage) -> None:
        sent.append(event)

    assert await store.replay_events_after(one, collect) is None
    assert sent == []


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        SessionEventStore(max_events_per_session=0)
    with pytest.raises(ValueError, match="must be positive"):
        SessionEventStore(max_events=0)


@given(st.text(max_size=60))
def test_no_id_replays_another_sessions_events(last: str) -> None:
    async def scenario() -> None:
        store = SessionEventStore()
        mine, theirs = store.open_session(), store.open_session()
        await put(store, theirs, "1", note(1))
        _, sent = await replay(store, mine, last)
        assert sent == []

    asyncio.run(scenario())

"""The session store: sessions, append-only transcripts and run records in SQLite."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawstack.common.clock import ManualClock
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import AgentIdError, SessionKeyError
from clawstack.gateway.sessions import (
    INTERRUPTED_ERROR,
    TRUNCATION_MARKER,
    InvalidRequestError,
    Message,
    NewMessage,
    RunConflictError,
    RunNotFoundError,
    RunStateError,
    SessionAgentMismatchError,
    SessionDeletedError,
    SessionError,
    SessionNotFoundError,
    SessionStore,
    SessionStoreError,
    SessionStoreLockedError,
)

KEY = "agent:main:main"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db_path(short_dir: Path) -> Path:
    return short_dir / "state" / "sessions.sqlite3"


@pytest.fixture
def store(db_path: Path, clock: ManualClock) -> Iterator[SessionStore]:
    store = SessionStore(db_path, clock=clock)
    store.open()
    try:
        yield store
    finally:
        store.close()


def user(text: str, **fields: Any) -> NewMessage:
    return NewMessage(role="user", content=text, **fields)


def texts(messages: list[Message]) -> list[Any]:
    return [m.content for m in messages]


# -- files and lifecycle ----------------------------------------------------------------------------------------


def test_files_are_private(db_path: Path, store: SessionStore) -> None:
    store.get_or_create(KEY, agent_id="main")
    store.append(KEY, user("hello"))
    assert stat.S_IMODE(os.stat(db_path.parent).st_mode) == 0o700
    for name in ("sessions.sqlite3", "sessions.sqlite3-wal", "sessions.sqlite3-shm", "sessions.sqlite3.lock"):
        assert stat.S_IMODE(os.stat(db_path.parent / name).st_mode) == 0o600, name


def test_files_are_private_under_a_permissive_umask(db_path: Path) -> None:
    old = os.umask(0)
    try:
        with SessionStore(db_path) as store:
            store.get_or_create(KEY, agent_id="main")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(db_path).st_mode) == 0o600


def test_database_uses_wal(store: SessionStore, db_path: Path) -> None:
    db = sqlite3.connect(db_path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


def test_one_writer(db_path: Path, store: SessionStore) -> None:
    second = SessionStore(db_path)
    with pytest.raises(SessionStoreLockedError) as info:
        second.open()
    assert info.value.code == "session_store_locked"
    store.close()
    second.open()  # the lock is released on close
    second.close()


def test_closed_store_refuses(db_path: Path) -> None:
    store = SessionStore(db_path)
    with pytest.raises(SessionStoreError, match="not open"):
        store.get(KEY)
    store.open()
    with pytest.raises(SessionStoreError, match="already open"):
        store.open()
    store.close()
    store.close()  # idempotent
    with pytest.raises(SessionStoreError, match="not open"):
        store.append(KEY, user("x"))


def test_persistence_across_close_and_reopen(db_path: Path, clock: ManualClock) -> None:
    with SessionStore(db_path, clock=clock) as store:
        created = store.get_or_create(KEY, agent_id="main", owner="plug", label="Ping", metadata={"a": [1, "b"]})
        store.append(KEY, user("ping", idempotency_key="r1:user"))
        store.append(
            KEY,
            NewMessage(
                role="assistant",
                content=[{"type": "text", "text": "pong"}],
                run_id="r1",
                provider="fake",
                model="fake-model",
                usage={"input": 10, "output": 4, "totalTokens": 14},
                stop_reason="stop",
            ),
        )
        store.start_run("r1", KEY, idempotency_key="r1")
        store.finish_run("r1", "ok")
    with SessionStore(db_path, clock=clock) as store:
        assert store.get(KEY) == created
        page = store.history(KEY)
        assert [m.seq for m in page.messages] == [1, 2]
        assert page.messages[1].to_wire() == {
            "role": "assistant",
            "content": [{"type": "text", "text": "pong"}],
            "timestamp": page.messages[1].timestamp_ms,
            "seq": 2,
            "runId": "r1",
            "provider": "fake",
            "model": "fake-model",
            "usage": {"input": 10, "output": 4, "totalTokens": 14},
            "stopReason": "stop",
        }
        assert page.messages[0].to_wire()["idempotencyKey"] == "r1:user"
        run = store.get_run("r1")
        assert run is not None
        assert run.state == "ok"


# -- sessions ---------------------------------------------------------------------------------------------------


def test_get_or_create(store: SessionStore, clock: ManualClock) -> None:
    assert store.get(KEY) is None
    session = store.get_or_create("agent:Main:main", agent_id="MAIN", owner="plug")
    assert session.key == KEY
    assert session.agent_id == "main"
    assert session.owner == "plug"
    assert session.created_at_ms == session.updated_at_ms == int(clock.now().timestamp() * 1000)
    assert not session.deleted
    # Existing: returned unchanged, creation-only fields ignored.
    assert store.get_or_create(KEY, agent_id="main", owner="other", label="x") == session


def test_get_or_create_refuses_another_agent(store: SessionStore) -> None:
    with pytest.raises(SessionAgentMismatchError):
        store.get_or_create(KEY, agent_id="other")
    store.get_or_create("hook:mail:1", agent_id="mail")
    with pytest.raises(SessionAgentMismatchError):
        store.get_or_create("hook:mail:1", agent_id="other")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"key": "nope", "agent_id": "main"}, SessionKeyError),
        ({"key": "hook:x", "agent_id": "Bad Id"}, AgentIdError),
        ({"key": KEY, "agent_id": "main", "metadata": {"x": float("nan")}}, InvalidRequestError),
        ({"key": KEY, "agent_id": "main", "metadata": ["not", "an", "object"]}, InvalidRequestError),
        ({"key": KEY, "agent_id": "main", "owner": ""}, InvalidRequestError),
        ({"key": KEY, "agent_id": "main", "label": "\ud800"}, InvalidRequestError),
    ],
)
def test_get_or_create_bad_input_changes_nothing(store: SessionStore, kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        store.get_or_create(**kwargs)
    assert store.list() == []


def test_list(store: SessionStore, clock: ManualClock) -> None:
    store.get_or_create("agent:a:main", agent_id="a")
    clock.advance(1)
    store.get_or_create("agent:b:main", agent_id="b")
    clock.advance(1)
    store.get_or_create("hook:x", agent_id="a")
    assert [s.key for s in store.list()] == ["hook:x", "agent:b:main", "agent:a:main"]
    clock.advance(1)
    store.append("agent:a:main", user("bump"))  # an append makes a session the most recent
    assert [s.key for s in store.list()] == ["agent:a:main", "hook:x", "agent:b:main"]
    assert [s.key for s in store.list(agent_id="A")] == ["agent:a:main", "hook:x"]
    assert [s.key for s in store.list(limit=1, offset=1)] == ["hook:x"]
    store.delete("hook:x")
    assert [s.key for s in store.list()] == ["agent:a:main", "agent:b:main"]
    with pytest.raises(InvalidRequestError):
        store.list(limit=0)
    with pytest.raises(InvalidRequestError):
        store.list(offset=-1)


def test_delete_hides_and_retains(store: SessionStore, db_path: Path) -> None:
    first = store.get_or_create(KEY, agent_id="main")
    store.append(KEY, user("secret-ish"))
    store.start_run("r1", KEY)
    assert store.delete(KEY) is True
    assert store.delete(KEY) is False
    assert store.get(KEY) is None
    assert store.history(KEY) == ([], 0, False)
    assert store.active_runs(KEY) == []
    with pytest.raises(SessionDeletedError) as info:
        store.append(KEY, user("more"))
    assert info.value.code == "session_deleted"
    with pytest.raises(SessionDeletedError):
        store.start_run("r2", KEY)
    # The key is free again: a new session, new id, empty transcript.
    second = store.get_or_create(KEY, agent_id="main")
    assert second.session_id != first.session_id
    assert store.history(KEY).total == 0
    # The old transcript is still in the file.
    db = sqlite3.connect(db_path)
    try:
        count = db.execute("SELECT count(*) FROM messages WHERE session_id=?", (first.session_id,)).fetchone()[0]
    finally:
        db.close()
    assert count == 1


def test_errors_are_gateway_errors() -> None:
    for error in (SessionError, SessionStoreLockedError, RunStateError, SessionKeyError, AgentIdError):
        assert issubclass(error, GatewayError)


# -- transcripts ------------------------------------------------------------------------------------------------


def test_append_assigns_seq_and_timestamp(store: SessionStore, clock: ManualClock) -> None:
    session = store.get_or_create(KEY, agent_id="main")
    first = store.append(KEY, user("a"))
    clock.advance(2)
    second = store.append(KEY, user("b", timestamp_ms=5))
    assert (first.seq, second.seq) == (1, 2)
    assert first.session_id == session.session_id
    assert first.timestamp_ms == int(clock.now().timestamp() * 1000) - 2000
    assert second.timestamp_ms == 5
    updated = store.get(KEY)
    assert updated is not None
    assert updated.updated_at_ms == int(clock.now().timestamp() * 1000)


def test_append_to_unknown_session(store: SessionStore) -> None:
    with pytest.raises(SessionNotFoundError) as info:
        store.append(KEY, user("a"))
    assert info.value.code == "session_not_found"


def test_append_idempotency_key_is_not_appended_twice(store: SessionStore) -> None:
    store.get_or_create(KEY, agent_id="main")
    first = store.append(KEY, user("a", idempotency_key="r1:user"))
    again = store.append(KEY, user("different", idempotency_key="r1:user"))
    assert again == first
    assert store.history(KEY).total == 1


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (NewMessage(role="robot", content="x"), "role"),  # type: ignore[arg-type]
        (NewMessage(role="user", content=7), "string or a list"),  # type: ignore[arg-type]
        (NewMessage(role="user", content=[{"text": "no type"}]), "block 0"),
        (NewMessage(role="user", content=["text"]), "block 0"),  # type: ignore[list-item]
        (NewMessage(role="user", content="\ud800"), "not storable JSON"),
        (NewMessage(role="user", content=[{"type": "x", "v": float("inf")}]), "not storable JSON"),
        (NewMessage(role="user", content="x", timestamp_ms=-1), "timestamp_ms"),
        (NewMessage(role="user", content="x", timestamp_ms=True), "timestamp_ms"),
        (NewMessage(role="user", content="x", run_id=""), "run_id"),
        (NewMessage(role="user", content="x", model="m\udc00"), "lone surrogate"),
        (NewMessage(role="user", content="x", usage=[1]), "usage"),  # type: ignore[arg-type]
        (NewMessage(role="user", content="x", idempotency_key="k" * 257), "at most 256"),
    ],
)
def test_append_bad_message_changes_nothing(store: SessionStore, message: NewMessage, fragment: str) -> None:
    store.get_or_create(KEY, agent_id="main")
    with pytest.raises(InvalidRequestError) as info:
        store.append(KEY, message)
    assert fragment in info.value.message
    assert info.value.code == "invalid_request"
    assert store.history(KEY).total == 0


def test_transcripts_are_append_only_in_the_database(store: SessionStore, db_path: Path) -> None:
    store.get_or_create(KEY, agent_id="main")
    store.append(KEY, user("a"))
    store.close()
    db = sqlite3.connect(db_path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("UPDATE messages SET content='\"b\"'")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            db.execute("DELETE FROM messages")
    finally:
        db.close()


@pytest.fixture
def ten(store: SessionStore) -> SessionStore:
    store.get_or_create(KEY, agent_id="main")
    for index in range(1, 11):
        store.append(KEY, user(f"m{index}"))
    return store


@pytest.mark.parametrize(
    ("limit", "offset", "seqs", "has_more"),
    [
        (3, 0, [8, 9, 10], True),
        (3, 3, [5, 6, 7], True),
        (3, 9, [1], False),
        (3, 7, [1, 2, 3], False),
        (10, 0, list(range(1, 11)), False),
        (200, 0, list(range(1, 11)), False),
        (1, 0, [10], True),
        (5, 10, [], False),
        (5, 50, [], False),
    ],
)
def test_history_windows(ten: SessionStore, limit: int, offset: int, seqs: list[int], has_more: bool) -> None:
    page = ten.history(KEY, limit=limit, offset=offset)
    assert [m.seq for m in page.messages] == seqs
    assert texts(page.messages) == [f"m{seq}" for seq in seqs]
    assert page.total == 10
    assert page.has_more is has_more


def test_history_paging_back_visits_every_message_once(ten: SessionStore) -> None:
    seen: list[int] = []
    offset = 0
    while True:
        page = ten.history(KEY, limit=4, offset=offset)
        seen = [m.seq for m in page.messages] + seen
        if not page.has_more:
            break
        offset += 4
    assert seen == list(range(1, 11))


@pytest.mark.parametrize(
    "kwargs", [{"limit": 0}, {"limit": 1001}, {"offset": -1}, {"max_chars": 0}, {"limit": True}, {"limit": 1.5}]
)
def test_history_bad_window(ten: SessionStore, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        ten.history(KEY, **kwargs)


def test_history_of_unknown_key_is_empty(store: SessionStore) -> None:
    assert store.history("agent:nobody:main") == ([], 0, False)


def test_history_max_chars(store: SessionStore) -> None:
    store.get_or_create(KEY, agent_id="main")
    store.append(KEY, user("short"))
    store.append(KEY, user("0123456789"))
    blocks = [{"type": "text", "text": "abcdefghij"}, {"type": "tool_call", "arguments": "x" * 50}]
    store.append(KEY, NewMessage(role="assistant", content=blocks))
    page = store.history(KEY, max_chars=5)
    short, long_text, assistant = page.messages
    assert short.content == "short"
    assert not short.truncated
    assert long_text.content == "01234" + TRUNCATION_MARKER
    assert long_text.truncated
    assert long_text.to_wire()["truncated"] is True
    assert assistant.content == [
        {"type": "text", "text": "abcde" + TRUNCATION_MARKER},
        {"type": "tool_call", "arguments": "x" * 50},
    ]
    # The stored transcript is unchanged.
    assert texts(store.history(KEY).messages)[1] == "0123456789"
    assert blocks[0]["text"] == "abcdefghij"


# -- runs -------------------------------------------------------------------------------------------------------


def test_run_lifecycle(store: SessionStore, clock: ManualClock) -> None:
    store.get_or_create(KEY, agent_id="main")
    run, created = store.start_run("r1", KEY)
    assert created
    assert run.state == "accepted"
    assert run.active
    assert store.active_runs(KEY) == [run]
    running = store.mark_running("r1")
    assert running.state == "running"
    assert store.mark_running("r1") == running
    clock.advance(3)
    done = store.finish_run("r1", "error", "the model failed")
    assert done.state == "error"
    assert done.error == "the model failed"
    assert done.ended_at_ms == done.started_at_ms + 3000
    assert store.active_runs(KEY) == []
    assert store.get_run("r1") == done
    assert store.finish_run("r1", "error") == done  # the same terminal state again: unchanged
    with pytest.raises(RunStateError):
        store.finish_run("r1", "ok")
    with pytest.raises(RunStateError):
        store.mark_running("r1")


@pytest.mark.parametrize("state", ["ok", "error", "timeout", "aborted", "interrupted"])
def test_every_terminal_state(store: SessionStore, state: Any) -> None:
    store.get_or_create(KEY, agent_id="main")
    store.start_run("r", KEY)
    assert store.finish_run("r", state).state == state


def test_run_errors(store: SessionStore) -> None:
    store.get_or_create(KEY, agent_id="main")
    store.get_or_create("agent:main:main:thread:1", agent_id="main")
    with pytest.raises(SessionNotFoundError):
        store.start_run("r", "agent:other:main")
    store.start_run("r", KEY)
    with pytest.raises(RunConflictError):
        store.start_run("r", "agent:main:main:thread:1")
    with pytest.raises(RunNotFoundError):
        store.finish_run("missing", "ok")
    with pytest.raises(RunNotFoundError):
        store.mark_running("missing")
    with pytest.raises(InvalidRequestError):
        store.finish_run("r", "running")
    with pytest.raises(InvalidRequestError):
        store.start_run("", KEY)
    with pytest.raises(InvalidRequestError):
        store.get_run("\ud800")
    assert store.get_run("missing") is None
    assert [r.run_id for r in store.active_runs(KEY)] == ["r"]


def test_idempotent_start(store: SessionStore) -> None:
    store.get_or_create(KEY, agent_id="main")
    run, created = store.start_run("r1", KEY, idempotency_key="k1")
    again, created_again = store.start_run("r2", KEY, idempotency_key="k1")
    assert created
    assert not created_again
    assert again == run
    same_id, created_same = store.start_run("r1", KEY)
    assert (same_id, created_same) == (run, False)
    assert store.find_by_idempotency_key(KEY, "k1") == run
    assert store.find_by_idempotency_key(KEY, "k2") is None
    assert store.get_run("r2") is None
    store.finish_run("r1", "ok")
    finished = store.find_by_idempotency_key(KEY, "k1")
    assert finished is not None
    assert finished.state == "ok"  # a finished run is still found: a retry never starts a second run


def test_concurrent_idempotent_starts_share_one_run(store: SessionStore) -> None:
    store.get_or_create(KEY, agent_id="main")
    barrier = threading.Barrier(16)
    results: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def start(index: int) -> None:
        barrier.wait()
        run, created = store.start_run(f"run-{index}", KEY, idempotency_key="same")
        with lock:
            results.append((run.run_id, created))

    threads = [threading.Thread(target=start, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 16
    assert len({run_id for run_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(store.active_runs(KEY)) == 1


_CRASHING_GATEWAY = """
import os, signal, sys
from pathlib import Path
from clawstack.gateway.sessions import SessionStore
store = SessionStore(Path(sys.argv[1]))
store.open()
store.get_or_create("agent:main:main", agent_id="main")
store.start_run("queued", "agent:main:main")
store.start_run("running", "agent:main:main")
store.mark_running("running")
store.start_run("done", "agent:main:main")
store.finish_run("done", "ok")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_runs_left_in_flight_by_a_killed_process_are_interrupted(db_path: Path, clock: ManualClock) -> None:
    proc = subprocess.run([sys.executable, "-c", _CRASHING_GATEWAY, str(db_path)], check=False, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    with SessionStore(db_path, clock=clock) as store:  # the killed process's lock died with it
        assert [r.run_id for r in store.active_runs(KEY)] == ["queued", "running"]
        assert store.mark_interrupted() == ["queued", "running"]
        for run_id in ("queued", "running"):
            run = store.get_run(run_id)
            assert run is not None
            assert run.state == "interrupted"
            assert run.error == INTERRUPTED_ERROR
            assert run.ended_at_ms == int(clock.now().timestamp() * 1000)
        done = store.get_run("done")
        assert done is not None
        assert done.state == "ok"
        assert store.active_runs(KEY) == []
        assert store.mark_interrupted() == []
    with SessionStore(db_path, clock=clock) as store:
        interrupted = store.get_run("queued")
        assert interrupted is not None
        assert interrupted.state == "interrupted"


# -- property ---------------------------------------------------------------------------------------------------

json_text = st.text(st.characters(codec="utf-8"), max_size=40)
blocks = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "tool_call", "image"]), "text": json_text},
        optional={"n": st.integers(-(2**53) + 1, 2**53 - 1), "ok": st.booleans(), "x": st.none()},
    ),
    max_size=3,
)
new_messages = st.builds(
    NewMessage,
    role=st.sampled_from(["user", "assistant", "tool", "system"]),
    content=st.one_of(json_text, blocks),
    timestamp_ms=st.one_of(st.none(), st.integers(0, 2**53 - 1)),
    run_id=st.one_of(st.none(), st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True)),
    provider=st.one_of(st.none(), st.just("fake")),
    usage=st.one_of(st.none(), st.dictionaries(st.sampled_from(["input", "output"]), st.integers(0, 1000))),
    stop_reason=st.one_of(st.none(), st.sampled_from(["stop", "length", "tool_calls"])),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(new_messages, max_size=12))
def test_any_appends_read_back_identically(drafts: list[NewMessage]) -> None:
    with tempfile.TemporaryDirectory(prefix="cs-", dir="/tmp") as tmp:
        path = Path(tmp) / "db" / "sessions.sqlite3"
        with SessionStore(path) as store:
            store.get_or_create(KEY, agent_id="main")
            appended = [store.append(KEY, draft) for draft in drafts]
        with SessionStore(path) as store:
            page = store.history(KEY, limit=1000)
    assert page.total == len(drafts)
    assert page.messages == appended
    assert [m.seq for m in page.messages] == list(range(1, len(drafts) + 1))
    for draft, message in zip(drafts, page.messages, strict=True):
        assert (message.role, message.content, message.usage, message.run_id) == (
            draft.role,
            draft.content,
            draft.usage,
            draft.run_id,
        )
        if draft.timestamp_ms is not None:
            assert message.timestamp_ms == draft.timestamp_ms


def test_release_claimed_sessions_frees_only_keys_a_plugin_held_outside_its_subagent_sessions(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "s.sqlite3") as store:
        store.get_or_create("agent:main:main", agent_id="main", owner="plugin:grabber")
        store.get_or_create("agent:main:channel:webhook:carol", agent_id="main", owner="plugin:grabber")
        store.get_or_create("agent:main:subagent:work", agent_id="main", owner="plugin:grabber")
        store.get_or_create("agent:main:subagent:child", agent_id="main", owner="native")
        store.get_or_create("agent:main:channel:webhook:dave", agent_id="main")
        assert store.release_claimed_sessions() == ["agent:main:channel:webhook:carol", "agent:main:main"]
        assert store.get("agent:main:main") is None
        assert store.get("agent:main:channel:webhook:carol") is None
        assert store.get("agent:main:subagent:work") is not None
        assert store.get("agent:main:subagent:child") is not None
        assert store.get("agent:main:channel:webhook:dave") is not None
        # The key is free: a person's session is a new one, with no owner.
        assert store.get_or_create("agent:main:main", agent_id="main").owner is None
        assert store.release_claimed_sessions() == []

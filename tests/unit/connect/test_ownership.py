"""Which gateway session a ``sessionKey`` names for which caller, who may use it, and who the agent is told is
asking (:mod:`clawstack.connect.ownership`)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.connect import ANONYMOUS, OPERATOR, PUBLIC, Caller, ConnectService, JobStore, ToolError
from clawstack.connect.agents import Agent
from clawstack.connect.jobs import Job, SessionOwner
from clawstack.connect.ownership import (
    SessionName,
    check_owner,
    may_read,
    sender_name,
    session_name,
    short_name_key,
)
from clawstack.connect.tools import RunTaskArgs, parse_arguments
from clawstack.gateway.keys import parse_session_key
from tests.unit.connect.conftest import agents_for

AGENT = Agent("house", "ws://h:1", "research")
ALICE, BOB = Caller.user("Alice"), Caller.user("Bob")
PREFIX = "agent:research:channel:clawconnect:"


def owned_by(caller: Caller, key: str = PREFIX + "x") -> SessionOwner:
    return SessionOwner(key, caller.key, "house", 1)


def test_a_missing_key_mints_a_new_conversation_each_time() -> None:
    first, second = session_name(AGENT, ALICE, None), session_name(AGENT, ALICE, None)
    assert first.kind == second.kind == "new"
    assert first.key != second.key
    assert first.key.startswith(PREFIX)


def test_short_names_are_scoped_to_their_caller() -> None:
    assert session_name(AGENT, OPERATOR, "thread-1") == SessionName(PREFIX + "thread-1", "name")
    keys = {caller: short_name_key(AGENT, caller, "review") for caller in (ALICE, BOB, PUBLIC, ANONYMOUS, OPERATOR)}
    assert len(set(keys.values())) == 5
    assert keys[PUBLIC] == PREFIX + "review@public"
    assert keys[ANONYMOUS] == PREFIX + "review@anonymous"
    assert keys[ALICE].startswith(PREFIX + "review@u-")
    assert keys[ALICE] == short_name_key(AGENT, Caller.user("Alice"), "review")  # stable across restarts


def test_every_scoped_short_name_is_a_valid_gateway_key() -> None:
    longest = "n" * 100
    for caller in (Caller.user("x" * 300), PUBLIC, ANONYMOUS, OPERATOR):
        parse_session_key(short_name_key(AGENT, caller, longest))  # one channel peer segment of <= 128


def test_full_keys_and_malformed_names() -> None:
    assert session_name(AGENT, ALICE, "agent:main:main") == SessionName("agent:main:main", "key")
    for bad in ("has space", "a:b", "", "agent: x", "-lead", "n" * 101):
        with pytest.raises(ToolError) as info:
            session_name(AGENT, ALICE, bad)
        assert info.value.code == "invalid_arguments"


@pytest.mark.parametrize("kind", ["name", "key"])
def test_only_the_owner_runs_in_an_owned_session(kind: str) -> None:
    name = SessionName(PREFIX + "x", kind)  # type: ignore[arg-type]
    check_owner(name, owned_by(ALICE), ALICE)  # the owner can
    for other in (BOB, PUBLIC, ANONYMOUS, OPERATOR):
        with pytest.raises(ToolError) as info:
            check_owner(name, owned_by(ALICE), other)
        assert info.value.code == "session_not_found"


def test_an_unowned_full_key_is_only_the_operators() -> None:
    name = SessionName("agent:main:main", "key")
    check_owner(name, None, OPERATOR)  # the stdio operator's own sessions stay usable
    for other in (ALICE, PUBLIC, ANONYMOUS):
        with pytest.raises(ToolError) as info:
            check_owner(name, None, other)
        assert info.value.code == "session_not_found"
    check_owner(SessionName(PREFIX + "review@u-1", "name"), None, ALICE)  # a new short name is claimed


def test_reads_are_the_owners_only() -> None:
    assert may_read(owned_by(ALICE), ALICE)
    assert not may_read(owned_by(ALICE), BOB)
    assert not may_read(owned_by(ALICE), OPERATOR)
    assert not may_read(None, OPERATOR)


def test_the_sender_is_who_the_caller_is() -> None:
    assert sender_name(ALICE, "Bob") == "Alice"  # cannot pose as another
    assert sender_name(ALICE, None) == "Alice"
    assert sender_name(PUBLIC, "Alice") == "Alice (unverified)"
    assert sender_name(ANONYMOUS, "Ada") == "Ada (unverified)"
    assert sender_name(PUBLIC, None) is None
    assert sender_name(OPERATOR, "Ada") == "Ada"


CALLERS = st.one_of(
    st.builds(Caller.user, st.text(min_size=1, max_size=12)), st.sampled_from([PUBLIC, ANONYMOUS, OPERATOR])
)
KEYS = st.one_of(
    st.none(),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,20}", fullmatch=True),
    st.from_regex(r"agent:[a-z]{1,5}:[^\s]{1,30}", fullmatch=True),
    st.text(max_size=40),
)


@given(a=CALLERS, b=CALLERS, key_a=KEYS, key_b=KEYS)
def test_no_key_lets_one_caller_into_anothers_session(
    a: Caller, b: Caller, key_a: str | None, key_b: str | None
) -> None:
    """Whatever A and B send: if A's job lands in a session, B's job can land in it only when B is A."""
    try:
        name_a = session_name(AGENT, a, key_a)
        check_owner(name_a, None, a)
    except ToolError:
        return
    owner = SessionOwner(name_a.key, a.key, AGENT.id, 1)
    try:
        name_b = session_name(AGENT, b, key_b)
        check_owner(name_b, owner if name_b.key == name_a.key else None, b)
    except ToolError:
        return
    assert name_b.key != name_a.key or b.key == a.key


def _job(n: int, key: str, agent: str, caller: Caller) -> Job:
    return Job(
        job_id=f"job_{n}",
        task_id=f"task_{n}",
        run_id=f"run_{n}",
        agent=agent,
        openclaw_agent_id="main",
        session_key=key,
        created_at_ms=n,
        updated_at_ms=n,
        status="completed",
        caller=caller.key,
    )


@settings(max_examples=150, deadline=None)
@given(pairs=st.lists(st.tuples(CALLERS, KEYS), min_size=2, max_size=6))
def test_through_the_service_and_store_no_job_lands_in_another_callers_session(
    pairs: list[tuple[Caller, str | None]],
) -> None:
    """Callers take turns naming keys; every job the store accepts is in a session whose owner is its caller."""
    with tempfile.TemporaryDirectory() as directory:
        store = JobStore(Path(directory) / "jobs.sqlite3")
        service = ConnectService(agents_for("ws://127.0.0.1:9"), store)
        store.open()
        try:
            for n, (caller, key) in enumerate(pairs):
                try:
                    args = parse_arguments("run_task", {"task": "t", "sessionKey": key})
                    assert isinstance(args, RunTaskArgs)
                    agent, session_key = asyncio.run(service._session_for_run(args, caller))
                    store.create(_job(n, session_key, agent.id, caller))
                except ToolError:
                    continue
                owner = store.session_owner(session_key)
                assert owner is not None
                assert owner.owner == caller.key
            for job in store.recent(active_only=False, limit=100)[0]:
                owner = store.session_owner(job.session_key)
                assert owner is not None
                assert owner.owner == job.caller
        finally:
            store.close()

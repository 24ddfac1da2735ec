"""Every caller (a personal token's owner, the shared pass, an open endpoint's anonymous caller, the stdio operator)
lists, reads, continues and cancels only its own tasks and sessions: another caller's job or session is refused
exactly as an unknown id is. Short names are scoped to their caller; a full key only to its owner."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from clawstack.connect import ANONYMOUS, OPERATOR, PUBLIC, Caller, ConnectService, JobStore, ToolError

from .test_service import WAIT

ALICE, BOB = Caller.user("Alice"), Caller.user("Bob")


async def finished(service: ConnectService, caller: Caller, task: str, **extra: Any) -> dict[str, Any]:
    job = await service.call("run_task", {"task": task, **extra}, caller=caller)
    return await until_end(service, caller, job["jobId"])


async def until_end(service: ConnectService, caller: Caller, job_id: str) -> dict[str, Any]:
    for _ in range(20):
        snap = await service.call("check_task", {"jobId": job_id, **WAIT}, caller=caller)
        if snap["isTerminal"]:
            return snap
    raise AssertionError("the task did not end")


async def test_each_caller_sees_only_their_own(service: ConnectService) -> None:
    alice = await finished(service, ALICE, "@fake reply: for alice")
    bob = await finished(service, BOB, "@fake reply: for bob")
    for tool, arguments, code in (
        ("check_task", {"jobId": alice["jobId"], "mode": "poll"}, "job_not_found"),
        ("get_task", {"taskId": alice["taskId"]}, "task_not_found"),
        ("cancel_task", {"jobId": alice["jobId"]}, "job_not_found"),
    ):
        for other in (BOB, PUBLIC, ANONYMOUS, OPERATOR):
            with pytest.raises(ToolError) as info:
                await service.call(tool, arguments, caller=other)
            assert info.value.code == code  # the same answer as an id that does not exist
    listed = await service.call("list_tasks", {"view": "all"}, caller=BOB)
    assert [t["jobId"] for t in listed["tasks"]] == [bob["jobId"]]
    assert listed["total"] == 1
    sessions = await service.call("list_sessions", {}, caller=BOB)
    assert [s["sessionKey"] for s in sessions["sessions"]] == [bob["sessionKey"]]
    foreign = await service.call("get_session", {"sessionId": alice["sessionKey"]}, caller=BOB)
    missing = await service.call("get_session", {"sessionId": alice["sessionKey"] + "x"}, caller=BOB)
    assert foreign == {**missing, "sessionId": alice["sessionKey"]}  # reads exactly as a key that does not exist
    assert (foreign["found"], foreign["tasks"], foreign["events"], foreign["agentSession"]) == (False, [], [], None)
    for mode in ("events", "tail", "tasks"):
        read = await service.call("get_session", {"sessionId": alice["sessionKey"], "mode": mode}, caller=BOB)
        assert (read["found"], read["events"], read["tasks"]) == (False, [], [])
    with pytest.raises(ToolError) as info:
        await service.call("run_task", {"task": "x", "sessionKey": alice["sessionKey"]}, caller=BOB)
    assert info.value.code == "session_not_found"
    # Alice still reads and continues her own.
    assert (await service.call("get_task", {"taskId": alice["taskId"]}, caller=ALICE))["taskId"] == alice["taskId"]
    own = await service.call("get_session", {"sessionId": alice["sessionKey"], "mode": "events"}, caller=ALICE)
    assert own["found"] is True
    assert own["events"]
    again = await finished(service, ALICE, "@fake reply: more", sessionKey=alice["sessionKey"])
    assert again["sessionKey"] == alice["sessionKey"]
    assert (await service.call("list_tasks", {"view": "all"}, caller=ALICE))["total"] == 2
    assert (await service.call("list_tasks", {"view": "all"}, caller=OPERATOR))["total"] == 0


async def test_two_callers_short_names_are_two_sessions(service: ConnectService) -> None:
    alice = await finished(service, ALICE, "@fake reply: alice-first-words", sessionKey="review")
    bob = await finished(service, BOB, "@fake reply: b1", sessionKey="review")
    assert alice["sessionKey"] != bob["sessionKey"]
    again = await finished(service, ALICE, "@fake reply: a2", sessionKey="review")
    assert again["sessionKey"] == alice["sessionKey"]  # the owner continues her own "review"
    # Each reads its own "review" by its short name, and only its own jobs are there.
    for caller, first in ((ALICE, alice), (BOB, bob)):
        read = await service.call("get_session", {"sessionId": "review"}, caller=caller)
        assert read["found"] is True
        assert {t["jobId"] for t in read["tasks"]} <= {alice["jobId"], again["jobId"], bob["jobId"]}
        assert first["jobId"] in {t["jobId"] for t in read["tasks"]}
    history = await service.call("get_task", {"taskId": bob["taskId"], "detail": "prompt"}, caller=BOB)
    assert "alice-first-words" not in str(history)
    with pytest.raises(ToolError) as info:
        await service.call("run_task", {"task": "x", "sessionKey": alice["sessionKey"]}, caller=BOB)
    assert info.value.code == "session_not_found"


async def test_only_the_operator_may_name_a_gateway_session_clawconnect_never_created(
    service: ConnectService,
) -> None:
    for caller in (ALICE, PUBLIC, ANONYMOUS):
        for key in ("agent:main:main", "agent:main:webhook:hook-1", "agent:main:channel:clawconnect:never"):
            with pytest.raises(ToolError) as info:
                await service.call("run_task", {"task": "/reset", "sessionKey": key}, caller=caller)
            assert info.value.code == "session_not_found"
    assert service.store.session_owner("agent:main:main") is None
    assert service.store.count() == 0  # nothing was recorded, nothing reached the gateway
    # The stdio operator's own sessions stay usable by their keys, and are then the operator's.
    mine = await finished(service, OPERATOR, "@fake reply: op", sessionKey="agent:main:main")
    assert mine["sessionKey"] == "agent:main:main"
    owner = service.store.session_owner("agent:main:main")
    assert owner is not None
    assert owner.owner == "operator"
    with pytest.raises(ToolError) as info:
        await service.call("run_task", {"task": "x", "sessionKey": "agent:main:main"}, caller=ALICE)
    assert info.value.code == "session_not_found"


async def test_identified_callers_are_the_sender(service: ConnectService) -> None:
    alice = await finished(service, ALICE, "@fake reply: hi", senderName="Bob")
    prompt = await service.call("get_task", {"taskId": alice["taskId"], "detail": "prompt"}, caller=ALICE)
    assert prompt["prompt"]["senderName"] == "Alice"
    shared = await finished(service, PUBLIC, "@fake reply: hi", senderName="Alice")
    prompt = await service.call("get_task", {"taskId": shared["taskId"], "detail": "prompt"}, caller=PUBLIC)
    assert prompt["prompt"]["senderName"] == "Alice (unverified)"


def test_a_version_1_store_gets_its_caller_column(tmp_path: Path) -> None:
    path = tmp_path / "jobs" / "jobs.sqlite3"
    store = JobStore(path)
    store.open()
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP INDEX jobs_caller")
    db.execute("DROP INDEX jobs_session_caller")
    db.execute("DROP INDEX jobs_caller_session")
    db.execute("DROP TABLE sessions")
    db.execute("ALTER TABLE jobs DROP COLUMN caller")
    record = (
        '{"job_id":"job_1","task_id":"task_1","run_id":"r1","agent":"house","openclaw_agent_id":"main",'
        '"session_key":"s1","created_at_ms":1,"updated_at_ms":1,"caller":"Alice"}'
    )
    db.execute(
        "INSERT INTO jobs (job_id, task_id, run_id, agent, session_key, status, created_at_ms, updated_at_ms, record)"
        " VALUES ('job_1','task_1','r1','house','s1','running',1,1,?)",
        (record,),
    )
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    store = JobStore(path)
    store.open()
    try:
        assert [job.job_id for job in store.recent(active_only=False, limit=10, scope="user:Alice")[0]] == ["job_1"]
        assert store.recent(active_only=False, limit=10, scope="Alice") == ([], 0)
        owner = store.session_owner("s1")
        assert owner is not None
        assert (owner.owner, owner.agent) == ("user:Alice", "house")
    finally:
        store.close()


def test_a_version_2_store_gets_owner_keys_and_session_owners(tmp_path: Path) -> None:
    path = tmp_path / "jobs" / "jobs.sqlite3"
    store = JobStore(path)
    store.open()
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE sessions")
    rows = [
        ("job_1", "s1", 1, "Alice"),
        ("job_2", "s1", 2, "Bob"),
        ("job_3", "s2", 3, None),
        ("job_4", "s3", 4, "public"),
    ]
    for job_id, key, at, caller in rows:
        record = json.dumps(
            {
                "job_id": job_id,
                "task_id": "t" + job_id,
                "run_id": "r" + job_id,
                "agent": "house",
                "openclaw_agent_id": "main",
                "session_key": key,
                "created_at_ms": at,
                "updated_at_ms": at,
                "caller": caller,
            }
        )
        db.execute(
            "INSERT INTO jobs (job_id, task_id, run_id, agent, session_key, status, created_at_ms, updated_at_ms,"
            " record, caller) VALUES (?,?,?,'house',?,'completed',?,?,?,?)",
            (job_id, "t" + job_id, "r" + job_id, key, at, at, record, caller),
        )
    db.execute("PRAGMA user_version=2")
    db.commit()
    db.close()
    store = JobStore(path)
    store.open()
    try:
        job = store.get("job_3")
        assert job is not None
        assert job.caller == "operator"  # a version-2 job without a caller was a stdio or open server's
        assert [store.get(j).caller for j in ("job_1", "job_2", "job_4")] == ["user:Alice", "user:Bob", "public"]  # type: ignore[union-attr]
        owners = {key: store.session_owner(key) for key in ("s1", "s2", "s3")}
        assert {key: o.owner for key, o in owners.items() if o} == {
            "s1": "user:Alice",
            "s2": "operator",
            "s3": "public",
        }
    finally:
        store.close()

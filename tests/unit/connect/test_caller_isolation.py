"""With personal tokens (``MCP_USER_TOKENS``), a caller lists, reads and continues only their own tasks and
sessions: another caller's job is refused exactly as an unknown id is. An unauthenticated server (no caller) is
one user's, and sees every job."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from clawstack.connect import ConnectService, JobStore, ToolError

from .test_service import WAIT


async def finished(service: ConnectService, caller: str, task: str, **extra: Any) -> dict[str, Any]:
    job = await service.call("run_task", {"task": task, **extra}, caller=caller)
    for _ in range(20):
        snap = await service.call("check_task", {"jobId": job["jobId"], **WAIT}, caller=caller)
        if snap["isTerminal"]:
            return snap
    raise AssertionError("the task did not end")


async def test_each_caller_sees_only_their_own(service: ConnectService) -> None:
    alice = await finished(service, "Alice", "@fake reply: for alice")
    bob = await finished(service, "Bob", "@fake reply: for bob")
    for tool, arguments, code in (
        ("check_task", {"jobId": alice["jobId"], "mode": "poll"}, "job_not_found"),
        ("get_task", {"taskId": alice["taskId"]}, "task_not_found"),
    ):
        with pytest.raises(ToolError) as info:
            await service.call(tool, arguments, caller="Bob")
        assert info.value.code == code  # the same answer as an id that does not exist
    listed = await service.call("list_tasks", {"view": "all"}, caller="Bob")
    assert [t["jobId"] for t in listed["tasks"]] == [bob["jobId"]]
    assert listed["total"] == 1
    sessions = await service.call("list_sessions", {}, caller="Bob")
    assert [s["sessionKey"] for s in sessions["sessions"]] == [bob["sessionKey"]]
    other = await service.call("get_session", {"sessionId": alice["sessionKey"]}, caller="Bob")
    assert (other["found"], other["tasks"], other["events"], other["agentSession"]) == (False, [], [], None)
    with pytest.raises(ToolError) as info:
        await service.call("run_task", {"task": "x", "sessionKey": alice["sessionKey"]}, caller="Bob")
    assert info.value.code == "session_mismatch"
    # Alice still reads and continues her own; an unauthenticated caller (None) sees both.
    assert (await service.call("get_task", {"taskId": alice["taskId"]}, caller="Alice"))["taskId"] == alice["taskId"]
    again = await finished(service, "Alice", "@fake reply: more", sessionKey=alice["sessionKey"])
    assert again["sessionKey"] == alice["sessionKey"]
    everyone = await service.call("list_tasks", {"view": "all"})
    assert everyone["total"] == 3


def test_a_version_1_store_gets_its_caller_column(tmp_path: Path) -> None:
    path = tmp_path / "jobs" / "jobs.sqlite3"
    store = JobStore(path)
    store.open()
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP INDEX jobs_caller")
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
        assert [job.job_id for job in store.recent(active_only=False, limit=10, scope="Alice")[0]] == ["job_1"]
        assert store.recent(active_only=False, limit=10, scope="Bob") == ([], 0)
    finally:
        store.close()

"""ConnectService over a real in-process gateway: how runs end (each terminalReason it can observe here), the job
store's failure modes as tool errors, and the exported API."""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import pytest

import clawstack.connect
from clawstack.connect import ConnectService, JobStore, ToolError
from clawstack.gateway.server import GatewayServer
from tests.unit.connect.conftest import PASSWORD, agents_for

WAIT = {"waitMs": 10000}


async def run_to_end(service: ConnectService, **arguments: Any) -> dict[str, Any]:
    job = await service.call("run_task", arguments)
    for _ in range(20):
        snap = await service.call("check_task", {"jobId": job["jobId"], **WAIT})
        if snap["isTerminal"]:
            return snap
    raise AssertionError("the task did not end")


async def test_a_completed_task(service: ConnectService) -> None:
    snap = await run_to_end(service, task="@fake reply: fine")
    assert (snap["status"], snap["terminalReason"], snap["summary"]) == ("completed", "final", "fine")
    full = await service.call("get_task", {"taskId": snap["taskId"], "detail": "full"})
    assert full["diagnostics"]["caller"] == "operator"
    assert full["diagnostics"]["gateway"]["liveness"] == "connected"
    assert PASSWORD not in repr(full)


async def test_an_empty_answer_is_completed_without_summary(service: ConnectService) -> None:
    snap = await run_to_end(service, task="@fake empty")
    assert (snap["status"], snap["terminalReason"], snap["summary"]) == ("completed_no_summary", "empty_reply", None)
    assert snap["resultSource"] is None


async def test_a_model_failure_is_an_error(service: ConnectService) -> None:
    snap = await run_to_end(service, task="@fake fail: 400")
    assert (snap["status"], snap["terminalReason"], snap["isError"]) == ("error", "run_error", True)
    assert snap["errorInfo"]["code"]


async def test_a_refused_chat_send_is_an_error(service: ConnectService) -> None:
    snap = await run_to_end(service, task="hello", agent="ghost")
    assert (snap["status"], snap["terminalReason"]) == ("error", "send_refused")
    assert snap["errorInfo"]["code"] == "INVALID_REQUEST"


async def test_get_session_and_list_sessions(service: ConnectService) -> None:
    first = await run_to_end(service, task="@fake reply: one")
    await run_to_end(service, task="@fake reply: two", sessionKey=first["sessionKey"])
    key = first["sessionKey"]
    snapshot = await service.call("get_session", {"sessionId": key})
    assert snapshot["found"] is True
    assert [t["summary"] for t in snapshot["tasks"]] == ["one", "two"]
    assert snapshot["agentSession"] is None
    events = await service.call("get_session", {"sessionId": key, "mode": "events", "limit": 2})
    assert len(events["events"]) == 2
    more = await service.call("get_session", {"sessionId": key, "mode": "events", "after": events["nextAfter"]})
    assert more["events"][0]["cursor"] > events["nextAfter"]
    tail = await service.call("get_session", {"sessionId": key, "mode": "tail", "limit": 1})
    assert tail["events"][0]["kind"] == "end"
    sessions = await service.call("list_sessions", {})
    assert sessions["sessions"][0]["taskCount"] == 2
    assert sessions["sessions"][0]["summary"] == "two"
    assert [a["id"] for a in sessions["agents"]] == ["house", "ghost"]


async def test_a_store_that_refuses_turns_into_tool_errors(tmp_path: Path, gateway: GatewayServer) -> None:
    path = tmp_path / "jobs.sqlite3"
    path.write_bytes(b"garbage, not sqlite" * 50)

    def refuse(source: Path, target: Path) -> None:
        raise OSError(30, "Read-only file system")

    svc = ConnectService(agents_for(gateway.url), JobStore(path, rename=refuse))
    await svc.start()
    try:
        assert svc.health()["jobStore"] == "refusing"
        for name, arguments in (("run_task", {"task": "x"}), ("list_tasks", {}), ("get_task", {"taskId": "task_1"})):
            with pytest.raises(ToolError) as info:
                await svc.call(name, arguments)
            assert info.value.code == "job_store_corrupt"
    finally:
        await svc.stop()
    assert path.read_bytes() == b"garbage, not sqlite" * 50


async def test_a_corrupt_store_is_reported_in_health(tmp_path: Path, gateway: GatewayServer) -> None:
    path = tmp_path / "jobs.sqlite3"
    path.write_bytes(b"garbage" * 50)
    svc = ConnectService(agents_for(gateway.url), JobStore(path))
    await svc.start()
    try:
        assert svc.health() == {"status": "ok", "jobStore": "moved_aside", "agents": 2}
        assert (await run_to_end(svc, task="@fake reply: fresh"))["summary"] == "fresh"
    finally:
        await svc.stop()


def test_exported_members() -> None:
    public = {
        name
        for name in dir(clawstack.connect)
        if not name.startswith("_") and not isinstance(getattr(clawstack.connect, name), types.ModuleType)
    }
    assert sorted(clawstack.connect.__all__) == sorted(public)


def test_connect_never_imports_the_gateway() -> None:
    source = Path(clawstack.connect.__file__).parent
    for module in source.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(name.startswith("clawstack.gateway") for name in names), module.name

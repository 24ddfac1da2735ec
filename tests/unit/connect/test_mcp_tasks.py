"""Native MCP tasks for run_task (the 2025-11-25 revision, and 2026-07-28's extension io.modelcontextprotocol/tasks),
driven by the official SDK's client against the real server: in memory (``Client(server, mode="legacy")`` for
2025-11-25, ``Client(server)`` for 2026-07-28) and over Streamable HTTP with personal tokens, over a real in-process
gateway with the scripted model.

- Only ``run_task`` declares task support (``optional``); the capability is served on 2025-11-25 only; a client
  that asks for no task sees today's tools, in today's order.
- A task-augmented ``tools/call run_task`` creates the same durable job as ``run_task`` and answers at once; the
  task id is the job id. ``tasks/get`` maps the job's status (``input_required`` from a delegated agent session
  waiting on a human), ``tasks/result`` blocks and answers check_task's final payload, ``tasks/list`` pages the
  caller's tasks newest first with a stable cursor, ``tasks/cancel`` cancels through cancel_task.
- Every refusal is a JSON-RPC error with a stable code in ``data``; another caller's task is refused exactly as an
  unknown id is. Status notifications reach the session that created the task. Task ids survive a restart.
- On 2026-07-28 a request declaring the extension gets ``resultType: "task"`` for run_task; ``tasks/get`` inlines
  the final result (an error job is ``completed`` with ``isError``), ``tasks/cancel`` and ``tasks/update``
  acknowledge; without the extension every answer is today's and ``tasks/*`` is -32021 or -32601.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as t
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client._memory import InMemoryTransport
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import JSONRPCError, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse

from clawstack.connect import (
    Caller,
    ConnectService,
    JobStore,
    TokenAuth,
    create_app,
    create_mcp_server,
    tool_definitions,
)
from clawstack.connect.http import HttpServer
from clawstack.connect.jobs import Job
from clawstack.connect.mcp_tasks import (
    POLL_INTERVAL_MS,
    RELATED_TASK_META_KEY,
    TASKS_EXTENSION,
    TASKS_PROTOCOL_VERSION,
    decode_cursor,
    encode_cursor,
    task_status,
)
from clawstack.connect.mcp_tasks_ext import extension_task
from clawstack.connect.tools import TOOLS
from clawstack.gateway.server import GatewayServer
from tests.unit.connect.agent_session.fakes import FakeRuntime, marker, now_s, registry_with
from tests.unit.connect.conftest import agents_for

ISO_8601 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TASK_KEYS = {"taskId", "status", "createdAt", "lastUpdatedAt", "ttl", "pollInterval"}
SLOW = "@fake reply: slow answer\n@fake delay-ms: 20000"
ALICE, BOB = "alice-token-123", "bob-token-456"


class StatusWatcher(ClientExtension):
    """Collects ``notifications/tasks/status`` (validated as the SDK's Task: ``ttl`` must be present)."""

    identifier = "org.example/task-status-watch"

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def on_status(params: t.TaskStatusNotificationParams) -> None:
            self.seen.append((params.task_id, params.status))

        return [
            NotificationBinding(
                method="notifications/tasks/status", params_type=t.TaskStatusNotificationParams, handler=on_status
            )
        ]


async def eventually(check: Callable[[], Awaitable[bool] | bool], *, timeout_s: float = 15.0) -> None:
    """Poll ``check`` every 20 ms until it holds; fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while True:
            outcome = check()
            if await outcome if isinstance(outcome, Awaitable) else outcome:
                return
            await asyncio.sleep(0.02)


async def raw(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One request as sent and answered on the wire (the session would reshape a task-augmented result)."""
    opts: Any = {"headers": {"mcp-protocol-version": client.protocol_version}}
    return await client.session._dispatcher.send_raw_request(method, params, opts)


async def create(client: Client, arguments: dict[str, Any], name: str = "run_task") -> dict[str, Any]:
    answer = await raw(client, "tools/call", {"name": name, "arguments": arguments, "task": {"ttl": 60000}})
    assert set(answer) == {"task"}, answer
    task: dict[str, Any] = answer["task"]
    return task


async def refused(call: Awaitable[Any]) -> MCPError:
    with pytest.raises(MCPError) as info:
        await call
    return info.value


@asynccontextmanager
async def in_memory(service: ConnectService, **kw: Any) -> AsyncIterator[tuple[Client, StatusWatcher]]:
    watcher = StatusWatcher()
    async with Client(create_mcp_server(service, **kw), mode="legacy", extensions=[watcher]) as client:
        assert client.protocol_version == TASKS_PROTOCOL_VERSION
        yield client, watcher


@asynccontextmanager
async def over_http(url: str, token: str) -> AsyncIterator[tuple[Client, StatusWatcher]]:
    watcher = StatusWatcher()
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy", extensions=[watcher]) as client,
    ):
        yield client, watcher


@pytest.fixture
async def http_url(service: ConnectService) -> AsyncIterator[str]:
    app = create_app(service, TokenAuth(user_tokens={"Alice": ALICE, "Bob": BOB}))
    server = HttpServer(app)
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()


async def wait_accepted(service: ConnectService, job_id: str) -> None:
    async def accepted() -> bool:
        snap = await service.call("check_task", {"jobId": job_id, "mode": "poll"})
        return any("accepted the run" in line["message"] for line in snap["logs"])

    await eventually(accepted)


# -- declaration ---------------------------------------------------------------------------------------------------


def test_only_run_task_declares_task_support_and_the_order_is_kept() -> None:
    tools = tool_definitions()
    assert [tool.name for tool in tools] == [spec.name for spec in TOOLS]
    support = {tool.name: tool.execution.task_support if tool.execution else None for tool in tools}
    assert support == {spec.name: ("optional" if spec.name == "run_task" else None) for spec in TOOLS}


async def test_a_2025_11_25_client_sees_the_tasks_capability_and_execution(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        caps = client.server_capabilities.tasks
        assert caps is not None
        assert caps.model_dump(by_alias=True, exclude_none=True) == {
            "list": {},
            "cancel": {},
            "requests": {"tools": {"call": {}}},
        }
        listed = (await raw(client, "tools/list", {}))["tools"]
        assert [tool["name"] for tool in listed] == [spec.name for spec in TOOLS]
        assert [tool.get("execution") for tool in listed] == [{"taskSupport": "optional"}] + [None] * (len(TOOLS) - 1)
        assert TASKS_EXTENSION not in (client.server_capabilities.extensions or {})  # that is 2026-07-28's


async def test_a_client_that_asks_for_no_task_gets_todays_answers(service: ConnectService) -> None:
    async with in_memory(service) as (client, watcher):
        plain = await client.call_tool("run_task", {"task": "@fake reply: as ever"})
        started = plain.structured_content
        assert started is not None
        assert (started["status"], started["nextAction"]["tool"]) == ("running", "check_task")
        assert "task" not in started
        end = await client.call_tool("check_task", {"jobId": started["jobId"], "waitMs": 10000})
        assert end.structured_content is not None
        assert (end.structured_content["status"], end.structured_content["summary"]) == ("completed", "as ever")
        assert watcher.seen == []  # nobody asked for a task, so nobody is told about one


async def test_a_2025_06_18_client_is_served_no_task_surface(service: ConnectService) -> None:
    # The SDK's client always asks for the newest handshake revision: speak JSON-RPC on the memory streams instead.
    async with InMemoryTransport(create_mcp_server(service)) as (read, write):
        ids = iter(range(1, 100))

        async def send(method: str, params: dict[str, Any]) -> Any:
            request = JSONRPCRequest(jsonrpc="2.0", id=next(ids), method=method, params=params)
            await write.send(SessionMessage(request))
            while True:
                message = await read.receive()
                assert isinstance(message, SessionMessage)
                answer = message.message
                if isinstance(answer, JSONRPCResponse | JSONRPCError) and answer.id == request.id:
                    return answer

        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
        init = await send("initialize", hello)
        assert init.result["protocolVersion"] == "2025-06-18"
        assert "tasks" not in init.result["capabilities"]
        assert "tools" in init.result["capabilities"]
        await write.send(SessionMessage(JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")))
        tools = (await send("tools/list", {})).result["tools"]
        assert [tool.get("execution") for tool in tools] == [None] * len(TOOLS)
        got = await send("tasks/get", {"taskId": "job_x"})
        assert isinstance(got, JSONRPCError)
        assert got.error.code == t.METHOD_NOT_FOUND
        # A task field it should not send is not honoured: the call runs as a plain tools/call.
        plain = await send("tools/call", {"name": "run_task", "arguments": {"task": "@fake reply: old"}, "task": {}})
        assert plain.result["structuredContent"]["status"] == "running"
        assert "task" not in plain.result


# -- creating ------------------------------------------------------------------------------------------------------


async def test_a_task_augmented_run_task_creates_the_same_job_and_answers_at_once(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = await create(client, {"task": SLOW, "senderName": "Ada"})
        assert loop.time() - started < 5  # at once, not after the 20 s answer
        assert set(task) - {"statusMessage"} == TASK_KEYS
        assert task["status"] == "working"
        assert task["taskId"].startswith("job_")
        assert ISO_8601.fullmatch(task["createdAt"])
        assert ISO_8601.fullmatch(task["lastUpdatedAt"])
        assert task["ttl"] is None  # present and null: a task lives as long as its job
        assert task["pollInterval"] == POLL_INTERVAL_MS == 2000
        job = await service.call("get_task", {"taskId": task["taskId"], "detail": "full"})
        assert (job["jobId"], job["status"], job["createdAt"]) == (task["taskId"], "running", task["createdAt"])
        prompt = await service.call("get_task", {"taskId": task["taskId"], "detail": "prompt"})
        assert prompt["prompt"]["senderName"] == "Ada"
        await service.call("cancel_task", {"jobId": task["taskId"]})


async def test_a_task_augmented_call_of_another_tool_is_method_not_found(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        before = service.store.count()
        for name, arguments in (
            ("check_task", {"jobId": "job_x"}),
            ("list_tasks", {}),
            ("cancel_task", {"jobId": "job_x"}),
            ("no_such_tool", {}),
        ):
            error = await refused(raw(client, "tools/call", {"name": name, "arguments": arguments, "task": {}}))
            assert error.code == t.METHOD_NOT_FOUND, name
        assert service.store.count() == before


async def test_a_refused_run_task_is_a_json_rpc_error_and_stores_nothing(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        busy = await create(client, {"task": SLOW, "sessionKey": "shared"})
        theirs = "agent:main:channel:clawconnect:theirs@public"
        service.store.create(
            Job("job_x", "task_x", "run_x", "house", "main", theirs, 1, 1, status="completed", caller="public")
        )
        count = service.store.count()
        for arguments, code in (
            ({}, "invalid_arguments"),
            ({"task": "x", "sessionKey": theirs}, "session_not_found"),  # another caller's session
            ({"task": 5}, "invalid_arguments"),
            ({"task": "x", "agent": "nobody"}, "agent_not_found"),
            ({"task": "x", "sessionKey": "bad key"}, "invalid_arguments"),
            ({"task": "x", "sessionKey": "shared"}, "session_busy"),
        ):
            error = await refused(raw(client, "tools/call", {"name": "run_task", "arguments": arguments, "task": {}}))
            assert (error.code, error.data["code"]) == (t.INVALID_PARAMS, code), arguments
            assert "x" not in error.message.split()  # the task text is never echoed
        assert error.data["activeJobId"] == busy["taskId"]
        assert error.data["retryable"] is True
        assert service.store.count() == count
        await service.call("cancel_task", {"jobId": busy["taskId"]})


# -- reading -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("task_text", "status", "message"),
    [
        ("@fake reply: fine", "completed", "final"),
        ("@fake empty", "completed", "empty_reply"),
        ("@fake fail: 400", "failed", "run_error"),
    ],
)
async def test_tasks_get_maps_how_the_job_ended(
    service: ConnectService, task_text: str, status: str, message: str
) -> None:
    async with in_memory(service) as (client, _):
        task = await create(client, {"task": task_text})
        await raw(client, "tasks/result", {"taskId": task["taskId"]})
        got = await raw(client, "tasks/get", {"taskId": task["taskId"]})
        assert set(got) == TASK_KEYS | {"statusMessage"}
        assert got["status"] == status
        assert got["statusMessage"].startswith(message)
        assert (got["ttl"], got["pollInterval"], got["createdAt"]) == (None, 2000, task["createdAt"])
        assert got["lastUpdatedAt"] >= task["lastUpdatedAt"]
        typed = await client.session.send_request(
            t.GetTaskRequest(params=t.GetTaskRequestParams(task_id=task["taskId"])), t.GetTaskResult
        )
        assert (typed.task_id, typed.status) == (task["taskId"], status)


async def test_tasks_get_of_a_running_task_is_working(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        task = await create(client, {"task": SLOW})
        got = await raw(client, "tasks/get", {"taskId": task["taskId"]})
        assert got["status"] == "working"
        assert "liveness" in got["statusMessage"]
        await service.call("cancel_task", {"jobId": task["taskId"]})


async def test_a_task_whose_delegated_session_waits_on_a_human_is_input_required(
    tmp_path: Path, gateway: GatewayServer
) -> None:
    fake = FakeRuntime(sessions={"s-1": {"state": "running", "lastEventAt": now_s()}})
    service = ConnectService(
        agents_for(gateway.url),
        JobStore(tmp_path / "seam" / "jobs.sqlite3"),
        agent_session_runtimes=registry_with(fake),
    )
    await service.start()

    async def status_becomes(task_id: str, status: str) -> None:
        async def reached() -> bool:
            got = await raw(client, "tasks/get", {"taskId": task_id})
            await service.agent_sessions.wait_for_refreshes()  # the read refreshed the record for the next one
            return bool(got["status"] == status)

        await eventually(reached)

    try:
        async with in_memory(service) as (client, watcher):
            context = marker(state="running", remoteUrl="https://example.org/s-1")
            task = await create(client, {"task": SLOW, "context": context})
            assert task["status"] == "working"
            fake.sessions["s-1"] = {"state": "needs_input", "lastEventAt": now_s()}
            await status_becomes(task["taskId"], "input_required")
            await service.agent_sessions.wait_for_refreshes()
            calls = len(fake.calls)
            listed = await raw(client, "tasks/list", {})
            assert [(x["taskId"], x["status"]) for x in listed["tasks"]] == [(task["taskId"], "input_required")]
            assert len(fake.calls) == calls  # tasks/list reads the stored record and calls no runtime
            got = await raw(client, "tasks/get", {"taskId": task["taskId"]})
            assert "needs_input" in got["statusMessage"]
            assert "https://example.org/s-1" in got["statusMessage"]
            await eventually(lambda: (task["taskId"], "input_required") in watcher.seen)
            # The human answered: the session runs again, and so does the task.
            fake.sessions["s-1"] = {"state": "running", "lastEventAt": now_s()}
            await status_becomes(task["taskId"], "working")
            await eventually(lambda: watcher.seen[-1] == (task["taskId"], "working"))
            # A later task of the same conversation is not the turn the session was delegated.
            await service.call("cancel_task", {"jobId": task["taskId"]})
            fake.sessions["s-1"] = {"state": "needs_input", "lastEventAt": now_s()}
            later = await create(client, {"task": SLOW, "sessionKey": task_session(service, task)})
            for _ in range(3):
                assert (await raw(client, "tasks/get", {"taskId": later["taskId"]}))["status"] == "working"
                await service.agent_sessions.wait_for_refreshes()
            await service.call("cancel_task", {"jobId": later["taskId"]})
    finally:
        await service.stop()


def task_session(service: ConnectService, task: dict[str, Any]) -> str:
    job = service.store.get(task["taskId"])
    assert job is not None
    return job.session_key


async def test_tasks_result_blocks_then_answers_check_tasks_final_payload(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        task = await create(client, {"task": "@fake reply: the answer\n@fake delay-ms: 1500"})
        assert (await raw(client, "tasks/get", {"taskId": task["taskId"]}))["status"] == "working"
        result = await raw(client, "tasks/result", {"taskId": task["taskId"]})
        final = await service.call("check_task", {"jobId": task["taskId"]})
        assert result["structuredContent"] == final
        assert final["summary"] == "the answer"
        assert final["isTerminal"] is True
        assert result["content"] == [{"type": "text", "text": json.dumps(final, ensure_ascii=False)}]
        assert result["isError"] is False
        assert result["_meta"] == {RELATED_TASK_META_KEY: {"taskId": task["taskId"]}}
        assert set(result) == {"content", "structuredContent", "isError", "_meta"}  # a 2025-11-25 CallToolResult
        typed = await client.session.send_request(
            t.GetTaskPayloadRequest(params=t.GetTaskPayloadRequestParams(task_id=task["taskId"])), t.CallToolResult
        )
        assert typed.structured_content == final
        assert typed.is_error is False


async def test_tasks_result_of_a_failed_task_is_an_error_result(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        task = await create(client, {"task": "@fake fail: 400"})
        result = await raw(client, "tasks/result", {"taskId": task["taskId"]})
        assert result["isError"] is True
        assert (result["structuredContent"]["status"], result["structuredContent"]["terminalReason"]) == (
            "error",
            "run_error",
        )


async def test_unknown_task_ids_are_invalid_params(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            for task_id in ("job_nope", "task_nope", "", "x" * 300):
                error = await refused(raw(client, method, {"taskId": task_id}))
                assert (error.code, error.data) == (t.INVALID_PARAMS, {"code": "task_not_found"}), (method, task_id)
            error = await refused(raw(client, method, {}))
            assert error.code == t.INVALID_PARAMS


async def test_a_store_that_cannot_be_used_is_an_internal_error(tmp_path: Path, gateway: GatewayServer) -> None:
    path = tmp_path / "broken" / "jobs.sqlite3"
    path.parent.mkdir()
    path.write_bytes(b"garbage, not sqlite" * 50)

    def refuse(source: Path, target: Path) -> None:
        raise OSError(30, "Read-only file system")

    broken = ConnectService(agents_for(gateway.url), JobStore(path, rename=refuse))
    await broken.start()
    try:
        async with in_memory(broken) as (client, _):
            for call in (
                raw(client, "tools/call", {"name": "run_task", "arguments": {"task": "x"}, "task": {}}),
                raw(client, "tasks/get", {"taskId": "job_1"}),
                raw(client, "tasks/list", {}),
                raw(client, "tasks/cancel", {"taskId": "job_1"}),
            ):
                error = await refused(call)
                assert (error.code, error.data["code"]) == (t.INTERNAL_ERROR, "job_store_corrupt")
    finally:
        await broken.stop()


# -- listing -------------------------------------------------------------------------------------------------------


async def test_tasks_list_pages_newest_first_with_a_stable_cursor(service: ConnectService) -> None:
    async with in_memory(service, tasks_page_size=2) as (client, _):
        made = [await create(client, {"task": f"@fake reply: {n}"}) for n in range(5)]
        newest_first = [task["taskId"] for task in reversed(made)]
        first = await raw(client, "tasks/list", {})
        assert [task["taskId"] for task in first["tasks"]] == newest_first[:2]
        assert all(set(task) >= TASK_KEYS for task in first["tasks"])
        # A task created meanwhile does not move the pages already handed out.
        extra = await create(client, {"task": "@fake reply: later"})
        seen: list[str] = [task["taskId"] for task in first["tasks"]]
        cursor = first["nextCursor"]
        while cursor is not None:
            page = await raw(client, "tasks/list", {"cursor": cursor})
            assert len(page["tasks"]) <= 2
            seen += [task["taskId"] for task in page["tasks"]]
            cursor = page.get("nextCursor")
        assert seen == newest_first
        assert (await raw(client, "tasks/list", {}))["tasks"][0]["taskId"] == extra["taskId"]
        typed = await client.session.send_request(t.ListTasksRequest(), t.ListTasksResult)
        assert [task.task_id for task in typed.tasks] == [extra["taskId"], *newest_first[:1]]


@pytest.mark.parametrize(
    "cursor", ["", "nonsense", "!!!", base64.urlsafe_b64encode(b"12:").decode(), encode_cursor(1, "job_a") + "x"]
)
async def test_a_malformed_cursor_is_invalid_params(service: ConnectService, cursor: str) -> None:
    async with in_memory(service) as (client, _):
        error = await refused(raw(client, "tasks/list", {"cursor": cursor}))
        assert (error.code, error.data) == (t.INVALID_PARAMS, {"code": "invalid_cursor"})


def test_a_cursor_round_trips() -> None:
    assert decode_cursor(encode_cursor(1_700_000_000_123, "job_abc")) == (1_700_000_000_123, "job_abc")


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=80))
def test_no_malformed_cursor_is_accepted(text: str) -> None:
    decoded = decode_cursor(text)
    if decoded is not None:
        assert encode_cursor(*decoded) == text  # only a cursor this server minted reads as one


def test_the_store_pages_newest_first_and_within_scope(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs" / "jobs.sqlite3")
    store.open()
    try:
        for n, (created, caller) in enumerate([(5, "A"), (7, "B"), (7, "A"), (9, "A"), (7, "A")]):
            job = Job(
                job_id=f"job_{n}",
                task_id=f"task_{n}",
                run_id=f"run_{n}",
                agent="house",
                openclaw_agent_id="main",
                session_key=f"agent:main:s{n}",
                created_at_ms=created,
                updated_at_ms=created,
                caller=caller,
            )
            store.create(job)
        assert [j.job_id for j in store.page(limit=10, scope="A")] == ["job_3", "job_4", "job_2", "job_0"]
        assert [j.job_id for j in store.page(limit=2, scope="A", after=(7, "job_4"))] == ["job_2", "job_0"]
        assert [j.job_id for j in store.page(limit=10)] == ["job_3", "job_4", "job_2", "job_1", "job_0"]
        assert store.page(limit=10, scope="C") == []
    finally:
        store.close()


# -- cancelling ----------------------------------------------------------------------------------------------------


async def test_tasks_cancel_cancels_through_cancel_task(service: ConnectService) -> None:
    async with in_memory(service) as (client, watcher):
        task = await create(client, {"task": SLOW})
        await wait_accepted(service, task["taskId"])
        cancelled = await raw(client, "tasks/cancel", {"taskId": task["taskId"]})
        assert set(cancelled) == TASK_KEYS | {"statusMessage"}
        assert (cancelled["taskId"], cancelled["status"], cancelled["statusMessage"]) == (
            task["taskId"],
            "cancelled",
            "aborted",
        )
        snap = await service.call("check_task", {"jobId": task["taskId"], "mode": "poll"})
        assert (snap["status"], snap["terminalReason"]) == ("cancelled", "aborted")
        again = await raw(client, "tasks/cancel", {"taskId": task["taskId"]})
        assert again["status"] == "cancelled"  # idempotent
        typed = await client.session.send_request(
            t.CancelTaskRequest(params=t.CancelTaskRequestParams(task_id=task["taskId"])), t.CancelTaskResult
        )
        assert typed.status == "cancelled"
        result = await raw(client, "tasks/result", {"taskId": task["taskId"]})
        assert (result["structuredContent"]["status"], result["isError"]) == ("cancelled", False)
        await eventually(lambda: (task["taskId"], "cancelled") in watcher.seen)


async def test_a_task_that_ended_otherwise_cannot_be_cancelled(service: ConnectService) -> None:
    async with in_memory(service) as (client, _):
        task = await create(client, {"task": "@fake reply: done"})
        await raw(client, "tasks/result", {"taskId": task["taskId"]})
        error = await refused(raw(client, "tasks/cancel", {"taskId": task["taskId"]}))
        assert (error.code, error.data["code"]) == (t.INVALID_PARAMS, "task_terminal")
        assert (await raw(client, "tasks/get", {"taskId": task["taskId"]}))["status"] == "completed"


# -- notifications, callers, restarts ------------------------------------------------------------------------------


async def test_status_notifications_reach_the_session_that_created_the_task(service: ConnectService) -> None:
    async with in_memory(service) as (client, watcher), in_memory(service) as (bystander, other):
        task = await create(client, {"task": "@fake reply: told\n@fake delay-ms: 1000"})
        await eventually(lambda: (task["taskId"], "completed") in watcher.seen)
        assert watcher.seen == [(task["taskId"], "completed")]
        assert other.seen == []
        await bystander.list_tools()


async def test_over_http_each_caller_sees_only_their_tasks(service: ConnectService, http_url: str) -> None:
    async with over_http(http_url, ALICE) as (alice, watcher), over_http(http_url, BOB) as (bob, _):
        assert alice.protocol_version == TASKS_PROTOCOL_VERSION
        hers = await create(alice, {"task": "@fake reply: for alice\n@fake delay-ms: 1000"})
        his = await create(bob, {"task": "@fake reply: for bob"})
        await eventually(lambda: (hers["taskId"], "completed") in watcher.seen)  # on stateful HTTP too
        assert [task["taskId"] for task in (await raw(bob, "tasks/list", {}))["tasks"]] == [his["taskId"]]
        assert [task["taskId"] for task in (await raw(alice, "tasks/list", {}))["tasks"]] == [hers["taskId"]]
        unknown = await refused(raw(bob, "tasks/get", {"taskId": "job_nope"}))
        for method in ("tasks/get", "tasks/result", "tasks/cancel"):
            error = await refused(raw(bob, method, {"taskId": hers["taskId"]}))
            assert (error.code, error.message, error.data) == (unknown.code, unknown.message, unknown.data), method
        mine = await raw(alice, "tasks/result", {"taskId": hers["taskId"]})
        assert mine["structuredContent"]["summary"] == "for alice"
        diagnostics = await service.call(
            "get_task", {"taskId": hers["taskId"], "detail": "diagnostics"}, caller=Caller.user("Alice")
        )
        assert diagnostics["diagnostics"]["caller"] == "user:Alice"


async def test_task_ids_survive_a_restart(tmp_path: Path, gateway: GatewayServer) -> None:
    path = tmp_path / "restart" / "jobs.sqlite3"
    first = ConnectService(agents_for(gateway.url), JobStore(path))
    await first.start()
    try:
        async with in_memory(first) as (client, _):
            task = await create(client, {"task": "@fake reply: after the restart\n@fake delay-ms: 1500"})
            await wait_accepted(first, task["taskId"])
    finally:
        await first.stop()
    second = ConnectService(agents_for(gateway.url), JobStore(path))
    await second.start()
    try:
        async with in_memory(second) as (client, _):
            got = await raw(client, "tasks/get", {"taskId": task["taskId"]})
            assert (got["taskId"], got["createdAt"]) == (task["taskId"], task["createdAt"])
            assert got["status"] in ("working", "completed")
            result = await raw(client, "tasks/result", {"taskId": task["taskId"]})
            assert result["structuredContent"]["summary"] == "after the restart"
            listed = await raw(client, "tasks/list", {})
            assert [(x["taskId"], x["status"]) for x in listed["tasks"]] == [(task["taskId"], "completed")]
    finally:
        await second.stop()


def test_task_status_mapping() -> None:
    session = {"actionRequired": True, "delegatedTurnId": "job_1"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"jobId": "job_1", "status": "running", "agentSession": None}, "working"),
        ({"jobId": "job_1", "status": "running", "agentSession": session}, "input_required"),
        ({"jobId": "job_2", "status": "running", "agentSession": session}, "working"),
        ({"jobId": "job_1", "status": "running", "agentSession": {**session, "actionRequired": False}}, "working"),
        ({"jobId": "job_1", "status": "completed", "agentSession": session}, "completed"),
        ({"jobId": "job_1", "status": "completed_no_summary", "agentSession": None}, "completed"),
        ({"jobId": "job_1", "status": "error", "agentSession": None}, "failed"),
        ({"jobId": "job_1", "status": "cancelled", "agentSession": None}, "cancelled"),
    ]
    for snapshot, expected in cases:
        assert task_status(snapshot) == expected, snapshot


# -- 2026-07-28: the extension io.modelcontextprotocol/tasks -------------------------------------------------------


class ExtTask(t.Result):
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None  # required: present even when null
    poll_interval_ms: int | None = None


class ExtCreateTaskResult(ExtTask):
    result_type: Literal["task"] = "task"


class ExtGetTaskResult(ExtTask):
    result_type: str = "complete"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = None


class ExtGetTaskRequest(t.Request[t.GetTaskRequestParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: t.GetTaskRequestParams
    name_param = "taskId"  # Mcp-Name on Streamable HTTP


class ExtCancelTaskRequest(t.Request[t.CancelTaskRequestParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: t.CancelTaskRequestParams
    name_param = "taskId"


class ExtUpdateTaskParams(t.RequestParams):
    task_id: str
    input_responses: dict[str, Any] | None = None


class ExtUpdateTaskRequest(t.Request[ExtUpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: ExtUpdateTaskParams
    name_param = "taskId"


async def ext_get(client: Client, task_id: str) -> ExtGetTaskResult:
    request = ExtGetTaskRequest(params=t.GetTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, ExtGetTaskResult)


async def ext_until_ended(client: Client, task_id: str) -> ExtGetTaskResult:
    for _ in range(300):
        got = await ext_get(client, task_id)
        if got.status in ("completed", "failed", "cancelled"):
            return got
        await asyncio.sleep(0.05)
    raise AssertionError("the task did not end")


class TasksExtension(ClientExtension):
    """Declares the extension and resolves a task result by polling tasks/get (as a 2026 client does)."""

    identifier = TASKS_EXTENSION

    def claims(self) -> list[ResultClaim[Any]]:
        async def resolve(created: ExtCreateTaskResult, ctx: ClaimContext) -> t.CallToolResult:
            async with asyncio.timeout(15):
                while True:
                    request = ExtGetTaskRequest(params=t.GetTaskRequestParams(task_id=created.task_id))
                    got = await ctx.session.send_request(request, ExtGetTaskResult)
                    if got.status in ("completed", "failed", "cancelled"):
                        return t.CallToolResult.model_validate(got.result or {"content": [], "isError": True})
                    await asyncio.sleep(0.05)

        return [ResultClaim(result_type="task", model=ExtCreateTaskResult, resolve=resolve)]


async def ext_create(client: Client, arguments: dict[str, Any]) -> ExtCreateTaskResult:
    created = await client.session.call_tool("run_task", arguments, allow_claimed=True)
    assert isinstance(created, ExtCreateTaskResult), created
    return created


async def test_a_2026_client_without_the_extension_gets_todays_answers(service: ConnectService) -> None:
    async with Client(create_mcp_server(service)) as client:
        assert client.protocol_version != TASKS_PROTOCOL_VERSION
        assert client.server_capabilities.tasks is None
        assert TASKS_EXTENSION in (client.server_capabilities.extensions or {})
        assert [tool.execution for tool in (await client.list_tools()).tools] == [None] * len(TOOLS)
        plain = await client.call_tool("run_task", {"task": "@fake reply: as ever"})
        assert plain.structured_content is not None
        assert plain.structured_content["status"] == "running"
        job_id = plain.structured_content["jobId"]
        for request, result in (
            (ExtGetTaskRequest(params=t.GetTaskRequestParams(task_id=job_id)), ExtGetTaskResult),
            (ExtCancelTaskRequest(params=t.CancelTaskRequestParams(task_id=job_id)), t.EmptyResult),
        ):
            error = await refused(client.session.send_request(request, result))
            assert error.code == t.MISSING_REQUIRED_CLIENT_CAPABILITY
        for request, result in (
            (t.ListTasksRequest(params=t.PaginatedRequestParams()), t.ListTasksResult),
            (t.GetTaskPayloadRequest(params=t.GetTaskPayloadRequestParams(task_id=job_id)), t.CallToolResult),
        ):
            error = await refused(client.session.send_request(request, result))  # not methods of this revision
            assert error.code == t.METHOD_NOT_FOUND


async def test_the_extension_answers_run_task_with_a_task_and_inlines_the_result(service: ConnectService) -> None:
    async with Client(create_mcp_server(service), extensions=[TasksExtension()]) as client:
        assert client.protocol_version != TASKS_PROTOCOL_VERSION
        created = await ext_create(client, {"task": "@fake reply: from the extension\n@fake delay-ms: 1500"})
        assert (created.result_type, created.status, created.ttl_ms, created.poll_interval_ms) == (
            "task",
            "working",
            None,
            2000,
        )
        assert created.task_id.startswith("job_")
        assert ISO_8601.fullmatch(created.created_at)
        assert (await ext_get(client, created.task_id)).result is None  # not before it ends
        ended = await ext_until_ended(client, created.task_id)
        final = await service.call("check_task", {"jobId": created.task_id})
        assert ended.status == "completed"
        assert ended.result == {
            "content": [{"type": "text", "text": json.dumps(final, ensure_ascii=False)}],
            "structuredContent": final,
            "isError": False,
            "resultType": "complete",  # a 2026-07-28 CallToolResult
        }
        # The SDK's client resolves a claimed task into the tool's final result.
        resolved = await client.call_tool("run_task", {"task": "@fake reply: resolved"})
        assert resolved.structured_content is not None
        assert resolved.structured_content["summary"] == "resolved"


async def test_an_error_job_completes_with_an_error_result_under_the_extension(service: ConnectService) -> None:
    async with Client(create_mcp_server(service), extensions=[TasksExtension()]) as client:
        created = await ext_create(client, {"task": "@fake fail: 400"})
        ended = await ext_until_ended(client, created.task_id)
        assert ended.status == "completed"  # "failed" is for JSON-RPC errors
        assert ended.result is not None
        assert ended.result["isError"] is True
        assert ended.result["structuredContent"]["terminalReason"] == "run_error"
        assert ended.status_message is not None
        assert ended.status_message.startswith("run_error")


async def test_a_refused_run_task_under_the_extension_is_todays_error_result(service: ConnectService) -> None:
    async with Client(create_mcp_server(service), extensions=[TasksExtension()]) as client:
        count = service.store.count()
        refusal = await client.session.call_tool("run_task", {"agent": "nobody", "task": "x"}, allow_claimed=True)
        assert isinstance(refusal, t.CallToolResult)
        assert refusal.is_error is True
        assert refusal.structured_content is not None
        assert refusal.structured_content["error"]["code"] == "agent_not_found"
        assert service.store.count() == count


async def test_cancel_and_update_under_the_extension_acknowledge(service: ConnectService) -> None:
    async with Client(create_mcp_server(service), extensions=[TasksExtension()]) as client:
        created = await ext_create(client, {"task": SLOW})
        await wait_accepted(service, created.task_id)
        cancel = ExtCancelTaskRequest(params=t.CancelTaskRequestParams(task_id=created.task_id))
        await client.session.send_request(cancel, t.EmptyResult)
        ended = await ext_until_ended(client, created.task_id)
        assert (ended.status, ended.result, ended.status_message) == ("cancelled", None, "aborted")
        await client.session.send_request(cancel, t.EmptyResult)  # again: acknowledged, nothing changes
        done = await ext_create(client, {"task": "@fake reply: done"})
        await ext_until_ended(client, done.task_id)
        await client.session.send_request(
            ExtCancelTaskRequest(params=t.CancelTaskRequestParams(task_id=done.task_id)), t.EmptyResult
        )
        assert (await ext_get(client, done.task_id)).status == "completed"  # cooperative: it had ended already
        update = ExtUpdateTaskRequest(params=ExtUpdateTaskParams(task_id=done.task_id, input_responses={"k": {}}))
        await client.session.send_request(update, t.EmptyResult)  # no input is ever outstanding: ignored
        missing = ExtUpdateTaskRequest(params=ExtUpdateTaskParams(task_id=done.task_id))
        assert (await refused(client.session.send_request(missing, t.EmptyResult))).code == t.INVALID_PARAMS
        for request, result in (
            (ExtGetTaskRequest(params=t.GetTaskRequestParams(task_id="job_nope")), ExtGetTaskResult),
            (ExtCancelTaskRequest(params=t.CancelTaskRequestParams(task_id="job_nope")), t.EmptyResult),
            (ExtUpdateTaskRequest(params=ExtUpdateTaskParams(task_id="job_nope", input_responses={})), t.EmptyResult),
        ):
            error = await refused(client.session.send_request(request, result))
            assert (error.code, error.data) == (t.INVALID_PARAMS, {"code": "task_not_found"})


async def test_over_http_the_extension_keeps_callers_apart(service: ConnectService, http_url: str) -> None:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {ALICE}"}, timeout=30) as alice_http,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {BOB}"}, timeout=30) as bob_http,
        Client(streamable_http_client(http_url, http_client=alice_http), extensions=[TasksExtension()]) as alice,
        Client(streamable_http_client(http_url, http_client=bob_http), extensions=[TasksExtension()]) as bob,
    ):
        hers = await ext_create(alice, {"task": "@fake reply: hers"})
        assert (await ext_until_ended(alice, hers.task_id)).status == "completed"
        unknown = await refused(ext_get(bob, "job_nope"))
        theirs = await refused(ext_get(bob, hers.task_id))
        assert (theirs.code, theirs.message, theirs.data) == (unknown.code, unknown.message, unknown.data)
        full = await service.call(
            "get_task", {"taskId": hers.task_id, "detail": "diagnostics"}, caller=Caller.user("Alice")
        )
        assert full["diagnostics"]["caller"] == "user:Alice"


def test_the_extensions_task_mapping() -> None:
    base = {"jobId": "job_1", "createdAt": "c", "updatedAt": "u", "terminalReason": None, "isError": False}
    waiting = {"actionRequired": True, "delegatedTurnId": "job_1", "runtime": "r", "sessionId": "s"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"status": "running", "agentSession": None}, "working"),
        ({"status": "running", "agentSession": {**waiting, "lastReportedState": "needs_input"}}, "working"),
        ({"status": "completed", "agentSession": None}, "completed"),
        ({"status": "completed_no_summary", "agentSession": None}, "completed"),
        ({"status": "error", "agentSession": None, "isError": True}, "completed"),
        ({"status": "cancelled", "agentSession": None}, "cancelled"),
    ]
    for fields, expected in cases:
        task = extension_task({**base, **fields}, "2026-07-28")
        assert task["status"] == expected, fields
        assert ("result" in task) == (expected == "completed"), fields
        assert (task["ttlMs"], task["pollIntervalMs"]) == (None, 2000)
    blocked = extension_task(
        {**base, "status": "running", "agentSession": {**waiting, "lastReportedState": "needs_input"}}
    )
    assert "waits for a human" in blocked["statusMessage"]

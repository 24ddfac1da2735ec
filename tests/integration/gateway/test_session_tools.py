"""The model-facing session tools (``sessions_spawn``, ``agents_wait``, ``subagents``, ``sessions_*``) and the
built-in chat commands, in a real gateway over WebSocket with a real scripted fake model.

The parent's model calls are script steps matched on a marker in the parent's message (``match_user``); each
child's model call is matched on a marker in its task. Tool results are read back from ``chat.history``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.common.clock import ManualClock
from clawstack.gateway.config import parse_config
from clawstack.gateway.custody import MAX_RESULT_BYTES
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.server import GatewayServer
from clawstack.gateway.session_tools import SESSION_TOOL_NAMES
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway.test_ws_protocol import API_KEY, Client, config_document, connected

KEY = "agent:main:main"
WAIT_S = 20.0
SESSION_TOOLS = set(SESSION_TOOL_NAMES)


def spawn_call(task: str, **extra: Any) -> dict[str, Any]:
    return {"name": "sessions_spawn", "arguments": {"task": task, **extra}}


def config(tmp_path: Path, base_url: str, **subagents: Any) -> Any:
    document = config_document(base_url)
    document["agents"]["defaults"]["subagents"] = {"runTimeoutSeconds": 30, **subagents}
    return parse_config(document, base_dir=tmp_path, environ={})


class Gateway:
    """A gateway, its fake model and one operator connection."""

    def __init__(self, server: GatewayServer, fake: FakeModelServer, client: Client) -> None:
        self.server, self.fake, self.client = server, fake, client
        self._n = 0

    def script(self, steps: list[dict[str, Any]]) -> None:
        self.fake.add_script_steps(parse_script(steps))

    async def turn(self, message: str, key: str = KEY) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Send ``message``; wait for the run's end; return its terminal chat payload and its tool results."""
        self._n += 1
        idem = f"turn-{self._n}"
        res = await self.client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": idem})
        assert res["ok"], res
        async with asyncio.timeout(WAIT_S):
            final = await self.client.wait_for_chat(res["payload"]["runId"], "final", "error", "aborted")
        return final["payload"], await self.tool_results(key, run_id=res["payload"]["runId"])

    async def tool_results(self, key: str, *, run_id: str) -> list[dict[str, Any]]:
        history = await self.client.request("chat.history", {"sessionKey": key, "limit": 200})
        results = []
        for message in history["payload"]["messages"]:
            if message["role"] == "tool" and message.get("runId") == run_id:
                block = message["content"][0]
                results.append({"isError": block["isError"], **_json_or_text(block["text"])})
        return results


def _json_or_text(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def gateway_factory(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Any]:
    opened: list[tuple[GatewayServer, FakeModelServer, aiohttp.ClientSession]] = []

    async def make(**subagents: Any) -> Gateway:
        fake = FakeModelServer(api_key=API_KEY)
        await fake.start()
        server = GatewayServer(config(tmp_path, fake.base_url, **subagents), data_dir=tmp_path / "data", clock=clock)
        await server.start()
        http = aiohttp.ClientSession()
        opened.append((server, fake, http))
        return Gateway(server, fake, await connected(http, server.port))

    yield make
    for server, fake, http in reversed(opened):
        await http.close()
        await server.stop()
        await fake.stop()


async def spawn_one(
    gateway: Gateway, marker: str, child_reply: dict[str, Any], *more_child_steps: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    gateway.script(
        [
            {"match_user": f"PARENT-{marker}", "tool_calls": [spawn_call(f"CHILD-{marker} do the work", **extra)]},
            {"match_user": f"CHILD-{marker}", **child_reply},
            *({"match_user": f"CHILD-{marker}", **step} for step in more_child_steps),
            {"match_user": f"PARENT-{marker}", "reply": "spawned"},
        ]
    )
    _, results = await gateway.turn(f"PARENT-{marker} please delegate")
    assert len(results) == 1, results
    return results[0]


async def wait_call(gateway: Gateway, ids: list[str], timeout_s: float) -> dict[str, Any]:
    gateway.script(
        [
            {
                "match_user": "WAIT-",
                "tool_calls": [{"name": "agents_wait", "arguments": {"ids": ids, "timeoutSeconds": timeout_s}}],
            },
            {"match_user": "WAIT-", "reply": "waited"},
        ]
    )
    _, results = await gateway.turn("WAIT- collect the children")
    return results[0]


async def test_spawn_then_collect_returns_the_childs_complete_answer(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    receipt = await spawn_one(gateway, "A", {"reply": "child answer"}, label="probe")
    assert receipt["isError"] is False
    assert receipt["status"] == "accepted"
    assert receipt["childSessionKey"].startswith("agent:main:subagent:")
    assert receipt["sessionKey"] == receipt["childSessionKey"]
    assert receipt["mode"] == "run"
    assert receipt["context"] == "isolated"
    assert receipt["expectsCompletionMessage"] is False
    assert receipt["resolvedModel"] == "fake/fake-model"
    assert receipt["resolvedProvider"] == "fake"
    state = await wait_call(gateway, [receipt["runId"]], 10)
    assert state["pending"] == []
    assert "errors" not in state
    [done] = state["completed"]
    assert done["runId"] == receipt["runId"]
    assert done["status"] == "done"
    assert done["result"] == "child answer"
    assert done["sessionKey"] == receipt["childSessionKey"]
    assert done["label"] == "probe"
    assert set(done["usage"]) == {"inputTokens", "outputTokens"}
    # The child got its task as a [Subagent Task] message, on the subagent lane, in its own session.
    child = await gateway.client.request("chat.history", {"sessionKey": receipt["childSessionKey"]})
    first = child["payload"]["messages"][0]
    assert first["role"] == "user"
    assert "[Subagent Task]" in first["content"]
    assert "CHILD-A" in first["content"]


async def test_pending_is_not_failure_and_a_bounded_wait_returns(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    receipt = await spawn_one(gateway, "B", {"reply": "late", "delay_ms": 3000})
    state = await wait_call(gateway, [receipt["runId"]], 0)
    assert state == {"isError": False, "completed": [], "pending": [receipt["runId"]]}
    state = await wait_call(gateway, [receipt["runId"]], 20)
    assert [c["result"] for c in state["completed"]] == ["late"]


async def test_unknown_ids_and_a_reset_parent_cannot_read_results(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    receipt = await spawn_one(gateway, "C", {"reply": "secret result"})
    state = await wait_call(gateway, [receipt["runId"], "no-such-run"], 10)
    assert state["errors"] == [{"runId": "no-such-run", "error": "not_found"}]
    assert state["completed"][0]["result"] == "secret result"
    before = (await gateway.client.request("chat.history", {"sessionKey": KEY}))["payload"]["sessionId"]
    final, _ = await gateway.turn("/reset")
    assert final["message"]["content"][0]["text"] == "✅ Session reset."
    after = (await gateway.client.request("chat.history", {"sessionKey": KEY}))["payload"]["sessionId"]
    assert after != before
    state = await wait_call(gateway, [receipt["runId"]], 1)
    assert state["completed"] == []
    assert state["pending"] == []
    assert state["errors"] == [{"runId": receipt["runId"], "error": "not_owner"}]
    assert state["success"] is False


async def test_max_spawn_depth_forbids_a_child_from_spawning(gateway_factory: Any) -> None:
    gateway = await gateway_factory()  # maxSpawnDepth defaults to 1
    receipt = await spawn_one(gateway, "D", {"tool_calls": [spawn_call("GRANDCHILD task")]}, {"reply": "child done"})
    state = await wait_call(gateway, [receipt["runId"]], 10)
    assert state["completed"][0]["status"] == "done", state
    child_run = state["completed"][0]["sessionKey"]
    history = await gateway.client.request("chat.history", {"sessionKey": child_run})
    tool = next(m for m in history["payload"]["messages"] if m["role"] == "tool")
    refusal = json.loads(tool["content"][0]["text"])
    assert refusal["status"] == "forbidden"
    assert "depth" in refusal["error"]


async def test_max_children_per_agent_counts_active_children(gateway_factory: Any) -> None:
    gateway = await gateway_factory(maxChildrenPerAgent=2)
    gateway.script(
        [
            {
                "match_user": "PARENT-E",
                "tool_calls": [spawn_call("CHILD-E1 slow"), spawn_call("CHILD-E2 slow"), spawn_call("CHILD-E3 slow")],
            },
            {"match_user": "CHILD-E1", "reply": "one", "delay_ms": 2000},
            {"match_user": "CHILD-E2", "reply": "two", "delay_ms": 2000},
            {"match_user": "PARENT-E", "reply": "spawned"},
        ]
    )
    _, results = await gateway.turn("PARENT-E spawn three")
    assert [r["status"] for r in results] == ["accepted", "accepted", "forbidden"]
    assert "max: 2" in results[2]["error"]


async def test_max_concurrent_bounds_running_children(gateway_factory: Any) -> None:
    gateway = await gateway_factory(maxConcurrent=2)
    steps: list[dict[str, Any]] = [
        {"match_user": "PARENT-F", "tool_calls": [spawn_call(f"CHILD-F{i} slow") for i in range(4)]},
        {"match_user": "PARENT-F", "reply": "spawned"},
    ]
    steps += [{"match_user": f"CHILD-F{i}", "reply": f"r{i}", "delay_ms": 1500} for i in range(4)]
    gateway.script(steps)
    _, results = await gateway.turn("PARENT-F spawn four")
    assert [r["status"] for r in results] == ["accepted"] * 4
    peak = 0
    async with asyncio.timeout(WAIT_S):
        while True:
            stats = gateway.server.lanes.stats()["subagent"]
            peak = max(peak, stats["running"])
            assert stats["running"] <= 2
            if stats["running"] == 0 and stats["queued"] == 0:
                break
            await asyncio.sleep(0.02)
    assert peak == 2
    state = await wait_call(gateway, [r["runId"] for r in results], 10)
    assert sorted(c["result"] for c in state["completed"]) == ["r0", "r1", "r2", "r3"]


async def test_archive_after_minutes_archives_the_childs_session_and_keeps_its_result(
    gateway_factory: Any, clock: ManualClock
) -> None:
    gateway = await gateway_factory(archiveAfterMinutes=5)
    receipt = await spawn_one(gateway, "G", {"reply": "kept"})
    state = await wait_call(gateway, [receipt["runId"]], 10)
    assert state["completed"][0]["result"] == "kept"
    natives = gateway.server._natives
    assert natives is not None
    assert await natives.archive_due() == 0
    clock.advance(4 * 60)
    assert await natives.archive_due() == 0
    clock.advance(2 * 60)
    assert await natives.archive_due() == 1
    assert gateway.server.store.get(receipt["childSessionKey"]) is None
    state = await wait_call(gateway, [receipt["runId"]], 1)
    assert state["completed"][0]["result"] == "kept"


async def test_cleanup_delete_archives_at_once(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    receipt = await spawn_one(gateway, "H", {"reply": "gone soon"}, cleanup="delete")
    state = await wait_call(gateway, [receipt["runId"]], 10)
    assert state["completed"][0]["result"] == "gone soon"
    assert gateway.server.store.get(receipt["childSessionKey"]) is None


async def test_a_long_answer_is_kept_to_100_kb_and_marked_truncated(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    long = "word " * 30_000  # 150 000 bytes
    receipt = await spawn_one(gateway, "I", {"reply": long})
    state = await wait_call(gateway, [receipt["runId"]], 20)
    [done] = state["completed"]
    assert done["resultTruncated"] is True
    assert len(done["result"].encode()) == MAX_RESULT_BYTES
    assert long.startswith(done["result"])


async def test_subagents_lists_and_cancels_own_children(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    receipt = await spawn_one(gateway, "J", {"reply": "never", "delay_ms": 20000})
    gateway.script(
        [
            {"match_user": "LIST-", "tool_calls": [{"name": "subagents", "arguments": {"action": "list"}}]},
            {"match_user": "LIST-", "reply": "listed"},
        ]
    )
    _, [listing] = await gateway.turn("LIST- children")
    assert [c["runId"] for c in listing["children"]] == [receipt["runId"]]
    assert listing["children"][0]["status"] in ("queued", "running")
    gateway.script(
        [
            {
                "match_user": "KILL-",
                "tool_calls": [{"name": "subagents", "arguments": {"action": "cancel", "taskId": receipt["runId"]}}],
            },
            {"match_user": "KILL-", "reply": "cancelled"},
        ]
    )
    _, [cancel] = await gateway.turn("KILL- the child")
    assert cancel["cancelled"] is True
    state = await wait_call(gateway, [receipt["runId"]], 10)
    assert state["completed"][0]["status"] == "killed"


async def test_native_children_are_one_shot_and_others_sessions_are_invisible(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    receipt = await spawn_one(gateway, "K", {"reply": "done"})
    child = receipt["childSessionKey"]
    # Another user session exists, but "tree" visibility does not reach it.
    gateway.script([{"match_user": "OTHER", "reply": "other"}])
    await gateway.turn("OTHER hello", key="agent:main:channel:webhook:other")
    calls = [
        {"name": "sessions_send", "arguments": {"sessionKey": child, "message": "more work"}},
        {"name": "sessions_history", "arguments": {"sessionKey": child}},
        {"name": "sessions_history", "arguments": {"sessionKey": "agent:main:channel:webhook:other"}},
        {"name": "sessions_list", "arguments": {}},
        {"name": "subagents", "arguments": {"action": "steer", "taskId": receipt["runId"]}},
    ]
    gateway.script([{"match_user": "TOOLS-", "tool_calls": calls}, {"match_user": "TOOLS-", "reply": "ok"}])
    _, (send, history, other, listing, steer) = await gateway.turn("TOOLS- use the session tools")
    assert send["status"] == "forbidden"
    assert "one-shot" in send["error"]
    assert history["sessionKey"] == child
    assert history["messages"]
    assert other["status"] == "forbidden"
    assert {s["key"] for s in listing["sessions"]} == {KEY, child}
    assert steer["status"] == "forbidden"


async def test_blind_requires_isolated_context(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    gateway.script(
        [
            {"match_user": "PARENT-L", "tool_calls": [spawn_call("CHILD-L", blind=True, context="fork")]},
            {"match_user": "PARENT-L", "reply": "refused"},
        ]
    )
    _, [refusal] = await gateway.turn("PARENT-L blind fork")
    assert refusal["status"] == "error"
    assert "isolated" in refusal["error"]


async def test_unsupported_spawn_arguments_are_refused_by_name(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    calls = [
        spawn_call("x", runtime="acp"),
        spawn_call("x", visible=True),
        spawn_call("x", outputSchema={"type": "object"}),
        spawn_call("x", collect=False),
        spawn_call("x", timeoutSeconds=5),
        spawn_call("x", thinking="enormous"),
        {"name": "sessions_spawn", "arguments": {}},
        spawn_call("x", fastMode=True),  # this gateway has no fast mode
        spawn_call("x", fastMode="turbo"),
    ]
    gateway.script([{"match_user": "BAD-", "tool_calls": calls}, {"match_user": "BAD-", "reply": "ok"}])
    _, results = await gateway.turn("BAD- spawns")
    assert [r.get("status") for r in results[:4]] == ["error"] * 4
    assert '"runtime"' in results[0]["error"]
    assert '"visible"' in results[1]["error"]
    assert results[4]["isError"] is True
    assert "runTimeoutSeconds" in results[4]["text"]
    assert results[5]["status"] == "error"
    assert "thinking" in results[5]["error"]
    assert results[6]["isError"] is True
    assert "task" in results[6]["text"]
    assert results[7]["isError"] is True
    assert "no fast mode" in results[7]["text"]
    assert results[8]["isError"] is True
    assert "fastMode must be" in results[8]["text"]
    assert gateway.server._children is not None
    assert await asyncio.to_thread(gateway.server._children.for_parent, KEY) == []


# -- built-in commands ----------------------------------------------------------------------------------------


async def test_builtin_commands_never_reach_the_model(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    gateway.script([{"reply": "unexpected"}])
    for text in ("/status", "/help", "/model", "/whoami", "/think high"):
        final, _ = await gateway.turn(text)
        assert final["state"] == "final"
        assert final["message"]["content"][0]["text"]
    assert gateway.fake.requests == []
    final, _ = await gateway.turn("/status")
    assert "Runs in flight: 0" in final["message"]["content"][0]["text"]  # not counting itself
    final, _ = await gateway.turn("/model fake/fake-model")
    assert "not supported" in final["message"]["content"][0]["text"]


async def test_stop_aborts_the_active_run_and_answers_without_a_run(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    gateway.script([{"reply": "slow", "delay_ms": 20000}])
    res = await gateway.client.request(
        "chat.send", {"sessionKey": KEY, "message": "take your time", "idempotencyKey": "slow-1"}
    )
    await gateway.fake.wait_for_requests(1)
    stop = await gateway.client.request(
        "chat.send", {"sessionKey": KEY, "message": "/stop", "idempotencyKey": "stop-1"}
    )
    assert stop["payload"] == {"ok": True, "aborted": True, "runIds": [res["payload"]["runId"]]}
    async with asyncio.timeout(WAIT_S):
        ended = await gateway.client.wait_for_chat(res["payload"]["runId"], "aborted", "final", "error")
    assert ended["payload"]["state"] == "aborted"
    again = await gateway.client.request(
        "chat.send", {"sessionKey": KEY, "message": "/stop", "idempotencyKey": "stop-2"}
    )
    assert again["payload"] == {"ok": True, "aborted": False, "runIds": []}


async def test_new_starts_a_new_incarnation_with_its_answer_first(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    gateway.script([{"reply": "hello"}])
    await gateway.turn("hi")
    final, _ = await gateway.turn("/new")
    assert final["message"]["content"][0]["text"] == "✅ New session started."
    history = await gateway.client.request("chat.history", {"sessionKey": KEY})
    assert [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
        for m in history["payload"]["messages"]
    ] == [
        "/new",
        "✅ New session started.",
    ]


async def test_sessions_reset_needs_admin_and_starts_a_new_incarnation(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    gateway.script([{"reply": "hello"}])
    await gateway.turn("hi")
    before = (await gateway.client.request("chat.history", {"sessionKey": KEY}))["payload"]["sessionId"]
    async with aiohttp.ClientSession() as http:
        writer = await connected(http, gateway.server.port, scopes=["operator.write"])
        refused = await writer.request("sessions.reset", {"key": KEY})
        assert refused["error"]["code"] == "FORBIDDEN"
        assert refused["error"]["details"]["missingScope"] == "operator.admin"
    res = await gateway.client.request("sessions.reset", {"key": KEY})
    assert res["payload"]["ok"] is True
    assert res["payload"]["key"] == KEY
    assert res["payload"]["entry"]["sessionId"] != before
    history = await gateway.client.request("chat.history", {"sessionKey": KEY})
    assert history["payload"]["sessionId"] == res["payload"]["entry"]["sessionId"]
    assert history["payload"]["messages"] == []
    unknown = await gateway.client.request("sessions.reset", {"key": "agent:main:channel:webhook:nobody"})
    assert unknown["error"]["code"] == "INVALID_REQUEST"
    bad = await gateway.client.request("sessions.reset", {"sessionKey": KEY})
    assert bad["error"]["code"] == "INVALID_REQUEST"


# -- tool configuration -----------------------------------------------------------------------------------------


def offered(fake: FakeModelServer) -> set[str]:
    return {tool["function"]["name"] for tool in fake.requests[-1].body.get("tools", [])}


async def test_the_default_surface_and_tool_profiles(tmp_path: Path) -> None:
    async with FakeModelServer(api_key=API_KEY) as fake:
        for index, (tools, expected) in enumerate(
            [
                ({}, {"read", "write", "edit", "exec", *SESSION_TOOLS}),
                ({"profile": "minimal"}, {"session_status"}),
                ({"profile": "coding", "deny": ["exec"]}, {"read", "write", "edit", *SESSION_TOOLS}),
                ({"profile": "messaging"}, set(SESSION_TOOLS)),
                (
                    {"swarm": {"enabled": False}},
                    {"read", "write", "edit", "exec", *SESSION_TOOLS} - {"sessions_spawn", "agents_wait"},
                ),
            ]
        ):
            document = config_document(fake.base_url)
            document["tools"] = tools
            config = parse_config(document, base_dir=tmp_path, environ={})
            data_dir = tmp_path / f"data-{index}"
            async with GatewayServer(config, data_dir=data_dir) as server, aiohttp.ClientSession() as http:
                client = await connected(http, server.port)
                gateway = Gateway(server, fake, client)
                gateway.script([{"reply": "ok"}])
                await gateway.turn("hello")
            assert offered(fake) == expected, tools


def test_tool_search_and_unknown_visibility_are_refused(tmp_path: Path) -> None:
    for tools, needle in [({"toolSearch": True}, "toolSearch"), ({"sessions": {"visibility": "world"}}, "visibility")]:
        document = config_document("http://127.0.0.1:9/v1")
        document["tools"] = tools
        with pytest.raises(GatewayError, match=needle):
            parse_config(document, base_dir=tmp_path, environ={})


async def test_agent_visibility_reaches_same_agent_sessions_and_sessions_send_waits_for_the_reply(
    tmp_path: Path,
) -> None:
    async with FakeModelServer(api_key=API_KEY) as fake:
        document = config_document(fake.base_url)
        document["tools"] = {"sessions": {"visibility": "agent"}}
        config = parse_config(document, base_dir=tmp_path, environ={})
        async with GatewayServer(config, data_dir=tmp_path / "data") as server, aiohttp.ClientSession() as http:
            gateway = Gateway(server, fake, await connected(http, server.port))
            other = "agent:main:channel:webhook:bob"
            gateway.script([{"match_user": "BOB-HI", "reply": "hi from bob"}])
            await gateway.turn("BOB-HI", key=other)
            calls = [
                {"name": "sessions_list", "arguments": {}},
                {
                    "name": "sessions_send",
                    "arguments": {"sessionKey": other, "message": "BOB-PING", "timeoutSeconds": 20},
                },
            ]
            gateway.script(
                [
                    {"match_user": "SEND-", "tool_calls": calls},
                    {"match_user": "BOB-PING", "reply": "pong from bob"},
                    {"match_user": "SEND-", "reply": "sent"},
                ]
            )
            _, (listing, sent) = await gateway.turn("SEND- ping bob")
    assert {s["key"] for s in listing["sessions"]} == {KEY, other}
    assert listing["visibility"] == "agent"
    assert sent["status"] == "ok"
    assert sent["reply"] == "pong from bob"
    inbound = next(r for r in fake.requests if "BOB-PING" in json.dumps(r.body["messages"][-1]))
    assert "isUser=false" in json.dumps(inbound.body["messages"][-1])


async def test_a_builtin_followed_by_a_new_line_or_in_capitals_never_reaches_the_model(gateway_factory: Any) -> None:
    gateway = await gateway_factory()
    gateway.script([{"reply": "unexpected"}])
    for text in ("/status\nand more", "/HELP", "/Model\tfake/fake-model"):
        final, _ = await gateway.turn(text)
        assert final["state"] == "final"
    assert gateway.fake.requests == []

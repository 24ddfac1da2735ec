"""Session custody in a real gateway: a plugin never claims, reads, waits on or deletes a conversation it did not
create, and no chat, channel or hook run ever lands in a plugin's session.

A real :class:`GatewayServer` on 127.0.0.1 with the webhook channel and the HTTP hooks endpoint enabled, a real
scripted fake model over TCP, and two plugins written to a temporary directory; people are played by real
WebSocket clients, a channel bridge by signed HTTP posts, an external trigger by the hooks endpoint.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.channels import signed_headers
from clawstack.gateway.config import parse_config
from clawstack.gateway.plugins import (
    PluginApi,
    SubagentArgumentError,
    SubagentRunNotFoundError,
    SubagentSessionForbiddenError,
)
from clawstack.gateway.plugins.subagent import PluginSubagent, plugin_owner
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_ws_protocol import API_KEY, WAIT_S, Client, config_document, connected

SECRET = "webhook-secret-0123456789abcdef"
HOOK_TOKEN = "hook-token-0123456789"
MAIN = "agent:main:main"
CHILD = "agent:main:subagent:helper"
CAROL = "agent:main:channel:webhook:carol"

PLUGIN = "def register(api):\n    pass\n"

#: Session keys no plugin may run in, read or delete: every kind but ``subagent``.
NOT_SUBAGENT_KEYS = [
    MAIN,
    CAROL,
    "agent:main:main:thread:1",
    "agent:main:subagent:helper:thread:1",
    "hook:imap:account:1",
]


def write_plugin(root: Path, plugin_id: str) -> Path:
    directory = root / plugin_id
    directory.mkdir(parents=True)
    (directory / "claw.plugin.json").write_text(json.dumps({"id": plugin_id, "version": "1.0.0", "entry": "plugin.py"}))
    (directory / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    return directory


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    document = config_document(fake.base_url)
    document["plugins"] = {"entries": {"runner": {"trust": "trusted"}, "other": {"trust": "trusted"}}}
    document["channels"] = {"webhook": {"enabled": True, "secret": SECRET, "allowFrom": ["carol"]}}
    document["hooks"] = {"enabled": True, "token": HOOK_TOKEN}
    document["cron"] = {"maxConcurrent": 2}
    config = parse_config(document, base_dir=tmp_path, environ={})
    paths = [write_plugin(tmp_path / "plugins", name) for name in ("runner", "other")]
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=paths) as gateway:
        yield gateway


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def person(server: GatewayServer, http: aiohttp.ClientSession) -> AsyncIterator[Client]:
    client = await connected(http, server.port)
    yield client
    await client.ws.close()


def api_of(server: GatewayServer, plugin_id: str) -> PluginApi:
    record = {p.id: p for p in server.plugins}[plugin_id]
    assert record.api is not None, record.error
    return record.api


def subagent_of(server: GatewayServer, plugin_id: str) -> PluginSubagent:
    return api_of(server, plugin_id).runtime.subagent


async def chat(person: Client, key: str, text: str, run_id: str) -> dict[str, Any]:
    """``chat.send`` and, when it was accepted, its terminal chat event's payload."""
    res = await person.request("chat.send", {"sessionKey": key, "message": text, "idempotencyKey": run_id})
    if not res["ok"]:
        return res
    return (await person.wait_for_chat(run_id, "final", "error"))["payload"]


async def history(person: Client, key: str) -> list[str]:
    res = await person.request("chat.history", {"sessionKey": key})
    return [
        m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in res["payload"]["messages"]
    ]


async def session_keys(person: Client) -> set[str]:
    res = await person.request("sessions.list", {})
    return {row["key"] for row in res["payload"]["sessions"]}


async def post_channel(
    http: aiohttp.ClientSession, server: GatewayServer, sender: str, text: str, message_id: str
) -> Any:
    body = json.dumps({"messageId": message_id, "sender": {"id": sender}, "text": text}).encode()
    headers = signed_headers(SECRET, body, timestamp=int(time.time()))
    async with http.post(f"http://127.0.0.1:{server.port}/channels/webhook", data=body, headers=headers) as res:
        assert res.status == 202
        return await res.json()


async def post_hook(http: aiohttp.ClientSession, server: GatewayServer, body: dict[str, Any]) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {HOOK_TOKEN}"}
    async with http.post(f"http://127.0.0.1:{server.port}/hooks/agent", json=body, headers=headers) as res:
        return res.status, await res.json()


async def ended(server: GatewayServer, run_id: str) -> str:
    run = await server.runs.wait_run(run_id, WAIT_S)
    assert run is not None
    return run.state


# -- plugin runs are confined to subagent keys ---------------------------------------------------------------------


@pytest.mark.parametrize("key", NOT_SUBAGENT_KEYS)
async def test_a_plugin_cannot_run_in_read_or_delete_any_key_but_a_subagent_key(
    key: str, server: GatewayServer, fake: FakeModelServer, person: Client
) -> None:
    runner = subagent_of(server, "runner")
    with pytest.raises(SubagentArgumentError, match="subagent session key") as caught:
        await runner.run(session_key=key, message="@fake reply: mine now")
    assert caught.value.code == "subagent_invalid_argument"
    with pytest.raises(SubagentArgumentError, match="subagent session key"):
        await runner.get_session_messages(key)
    with pytest.raises(SubagentArgumentError, match="subagent session key"):
        await runner.delete_session(key)
    # Refused before anything was recorded: no session, no run, no model call.
    assert await session_keys(person) == set()
    assert fake.requests == []


async def test_claiming_the_main_session_before_the_user_writes_there_is_refused(
    server: GatewayServer, person: Client
) -> None:
    runner = subagent_of(server, "runner")
    with pytest.raises(SubagentArgumentError):
        await runner.run(session_key=MAIN, message="@fake reply: waiting for the user", idempotency_key="claim")
    # The user's conversation starts as theirs alone.
    final = await chat(person, MAIN, "@fake reply: hello user", "u1")
    assert final["state"] == "final"
    assert server.store.get(MAIN).owner is None  # type: ignore[union-attr]
    assert await history(person, MAIN) == ["@fake reply: hello user", "hello user"]


# -- create-then-chat and chat-then-claim --------------------------------------------------------------------------


async def test_create_then_chat_a_person_cannot_write_into_a_plugin_session(
    server: GatewayServer, fake: FakeModelServer, person: Client
) -> None:
    runner = subagent_of(server, "runner")
    accepted = await runner.run(session_key=CHILD, message="@fake reply: plugin work")
    assert (await runner.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"
    requests = len(fake.requests)

    refused = await chat(person, CHILD, "@fake reply: the user's secret", "u-child")
    assert refused["ok"] is False
    assert refused["error"]["details"]["code"] == "session_owner_mismatch"
    assert len(fake.requests) == requests
    page = await runner.get_session_messages(CHILD)
    assert [m["role"] for m in page.messages] == ["user", "assistant"]
    assert "the user's secret" not in json.dumps(page.messages)
    assert server.store.get(CHILD).owner == plugin_owner("runner")  # type: ignore[union-attr]


async def test_chat_then_claim_a_plugin_cannot_take_a_subagent_session_a_person_started(
    server: GatewayServer, fake: FakeModelServer, person: Client
) -> None:
    key = "agent:main:subagent:opened-by-a-person"
    assert (await chat(person, key, "@fake reply: person's turn", "u1"))["state"] == "final"
    requests = len(fake.requests)
    runner = subagent_of(server, "runner")
    with pytest.raises(SubagentSessionForbiddenError, match="not created by plugin 'runner'"):
        await runner.run(session_key=key, message="@fake reply: taken over")
    with pytest.raises(SubagentSessionForbiddenError):
        await runner.get_session_messages(key)
    with pytest.raises(SubagentSessionForbiddenError):
        await runner.delete_session(key)
    assert len(fake.requests) == requests
    assert await history(person, key) == ["@fake reply: person's turn", "person's turn"]
    assert server.store.get(key).owner is None  # type: ignore[union-attr]
    assert (await chat(person, key, "@fake reply: still mine", "u2"))["state"] == "final"


async def test_a_plugin_cannot_claim_or_reach_another_plugins_session(server: GatewayServer) -> None:
    runner, other = subagent_of(server, "runner"), subagent_of(server, "other")
    accepted = await runner.run(session_key=CHILD, message="@fake reply: runner's")
    with pytest.raises(SubagentSessionForbiddenError):
        await other.run(session_key=CHILD, message="@fake reply: hijack")
    with pytest.raises(SubagentSessionForbiddenError):
        await other.get_session_messages(CHILD)
    with pytest.raises(SubagentSessionForbiddenError):
        await other.delete_session(CHILD)
    with pytest.raises(SubagentRunNotFoundError):
        await other.wait_for_run(accepted.run_id, timeout_ms=0)
    assert (await runner.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"
    assert (await runner.get_session_messages(CHILD)).total == 2


# -- channels --------------------------------------------------------------------------------------------------------


async def test_a_channel_message_never_lands_in_a_plugin_session(
    server: GatewayServer, http: aiohttp.ClientSession, person: Client
) -> None:
    runner = subagent_of(server, "runner")
    with pytest.raises(SubagentArgumentError):
        await runner.run(session_key=CAROL, message="@fake reply: waiting for carol")
    answer = await post_channel(http, server, "carol", "@fake reply: hi carol", "m-1")
    assert answer["ok"] is True
    assert await ended(server, answer["runId"]) == "ok"
    session = server.store.get(CAROL)
    assert session is not None
    assert session.owner is None
    assert await history(person, CAROL) == ["@fake reply: hi carol", "hi carol"]
    # Carol's conversation stays out of the plugin's reach.
    with pytest.raises(SubagentArgumentError):
        await runner.get_session_messages(CAROL)
    with pytest.raises(SubagentRunNotFoundError):
        await runner.wait_for_run(answer["runId"], timeout_ms=0)
    assert {key for key in await session_keys(person) if server.store.get(key).owner is not None} == set()  # type: ignore[union-attr]


# -- hooks -----------------------------------------------------------------------------------------------------------


async def test_hook_turns_never_land_in_a_plugin_or_person_session(
    server: GatewayServer, fake: FakeModelServer, http: aiohttp.ClientSession, person: Client
) -> None:
    runner = subagent_of(server, "runner")
    accepted = await runner.run(session_key=CHILD, message="@fake reply: plugin work")
    assert (await runner.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"
    requests = len(fake.requests)

    # The HTTP hooks endpoint takes only hook: keys.
    for key in (CHILD, MAIN, CAROL):
        status, body = await post_hook(http, server, {"message": "@fake reply: x", "sessionKey": key})
        assert status == 400, key
        assert body["ok"] is False
    # So does a plugin's hook dispatch, the dispatching plugin's own subagent session included.
    hooks = api_of(server, "runner").runtime.hooks
    for key in (CHILD, MAIN, CAROL):
        result = await hooks.dispatch_hook_agent_turn(agent_id="main", session_key=key, message="x", deliver=False)
        assert result.ok is False, key
        assert result.reason is not None
        assert result.reason.startswith("invalid_session_key:"), result.reason
    assert len(fake.requests) == requests
    assert (await runner.get_session_messages(CHILD)).total == 2

    # A hook session, by either route, is not the plugin's to run in, read or wait on.
    status, body = await post_hook(
        http, server, {"message": "@fake reply: external", "sessionKey": "hook:ext:1", "deliver": False}
    )
    assert status == 202
    dispatched = await hooks.dispatch_hook_agent_turn(
        agent_id="main", session_key="hook:mail:1", message="@fake reply: mail", deliver=False
    )
    assert dispatched.ok is True
    assert dispatched.run_id is not None
    for run_id, key in ((body["runId"], "hook:ext:1"), (dispatched.run_id, "hook:mail:1")):
        assert await ended(server, run_id) == "ok"
        assert server.store.get(key).owner is None  # type: ignore[union-attr]
        with pytest.raises(SubagentArgumentError):
            await runner.run(session_key=key, message="x")
        with pytest.raises(SubagentArgumentError):
            await runner.get_session_messages(key)
        with pytest.raises(SubagentRunNotFoundError):
            await runner.wait_for_run(run_id, timeout_ms=0)


# -- delete, read, wait ----------------------------------------------------------------------------------------------


async def test_delete_and_read_answer_alike_for_someone_elses_session_and_no_session(
    server: GatewayServer, person: Client
) -> None:
    theirs = "agent:main:subagent:a-persons"
    assert (await chat(person, theirs, "@fake reply: private", "u1"))["state"] == "final"
    runner = subagent_of(server, "runner")
    messages = []
    for key in (theirs, "agent:main:subagent:nobody-has-this"):
        with pytest.raises(SubagentSessionForbiddenError) as read:
            await runner.get_session_messages(key)
        with pytest.raises(SubagentSessionForbiddenError) as delete:
            await runner.delete_session(key)
        assert read.value.code == delete.value.code == "subagent_session_forbidden"
        messages.append((read.value.message.replace(key, "KEY"), delete.value.message.replace(key, "KEY")))
    assert messages[0] == messages[1]  # nothing tells the plugin that the person's session exists
    assert "private" not in json.dumps(messages)
    assert await history(person, theirs) == ["@fake reply: private", "private"]


async def test_waiting_on_someone_elses_run_answers_not_found_at_once(
    server: GatewayServer, person: Client, http: aiohttp.ClientSession
) -> None:
    runner = subagent_of(server, "runner")
    res = await person.request(
        "chat.send",
        {"sessionKey": MAIN, "message": "@fake delay-ms: 1500\n@fake reply: slow", "idempotencyKey": "u-slow"},
    )
    assert res["payload"]["status"] == "started"
    other = await subagent_of(server, "other").run(session_key="agent:main:subagent:o", message="@fake reply: o")
    answers = []
    async with asyncio.timeout(1.0):  # no wait at all, though the person's run is still going
        for run_id in ("u-slow", other.run_id, "no-such-run"):
            with pytest.raises(SubagentRunNotFoundError) as caught:
                await runner.wait_for_run(run_id, timeout_ms=10_000)
            assert caught.value.code == "subagent_run_not_found"
            answers.append(caught.value.message.replace(run_id, "RUN"))
    assert answers[0] == answers[1] == answers[2]
    assert (await person.wait_for_chat("u-slow", "final"))["payload"]["message"]["content"][0]["text"] == "slow"


async def test_a_deleted_plugin_session_frees_the_key_without_giving_the_plugin_the_new_one(
    server: GatewayServer, person: Client
) -> None:
    runner = subagent_of(server, "runner")
    accepted = await runner.run(session_key=CHILD, message="@fake reply: first")
    assert (await runner.wait_for_run(accepted.run_id, timeout_ms=10_000)).status == "ok"
    assert await runner.delete_session(CHILD) is True
    # A person may now start a conversation under the freed key; it is theirs, not the plugin's.
    assert (await chat(person, CHILD, "@fake reply: person's now", "u1"))["state"] == "final"
    with pytest.raises(SubagentSessionForbiddenError):
        await runner.get_session_messages(CHILD)
    with pytest.raises(SubagentSessionForbiddenError):
        await runner.run(session_key=CHILD, message="@fake reply: back")
    with pytest.raises(SubagentRunNotFoundError):
        await runner.wait_for_run("u1", timeout_ms=0)
    # Its own finished run stays readable, and holds only its own messages.
    old = await runner.wait_for_run(accepted.run_id, timeout_ms=0)
    assert (old.status, old.terminal_reply) == ("ok", "first")


async def test_a_key_a_plugin_claimed_before_the_rule_is_freed_at_start(tmp_path: Path, fake: FakeModelServer) -> None:
    from clawstack.gateway.server import STORE_FILE
    from clawstack.gateway.sessions import SessionStore

    data = tmp_path / "claimed-data"
    with SessionStore(data / STORE_FILE) as store:
        store.get_or_create(MAIN, agent_id="main", owner=plugin_owner("runner"))
    config = parse_config(config_document(fake.base_url), base_dir=tmp_path, environ={})
    async with GatewayServer(config, data_dir=data) as gateway, aiohttp.ClientSession() as session:
        person = await connected(session, gateway.port)
        final = await chat(person, MAIN, "@fake reply: mine again", "reclaim-1")
        assert final["state"] == "final"
        assert gateway.store.get(MAIN).owner is None  # type: ignore[union-attr]

"""``ctx.runtime_context.subagents`` for channel senders: a command's native children exist only for a verified
sender whom the channel authorizes and whose identity is linked to an operator holding ``operator.admin``, rechecked
on every native call; demoting or unlinking her fails her waiting children at once.

The webhook channel allows ``alice`` (linked, ``operator.admin``), ``bob`` (linked, ``operator.read``) and
``carol`` (not linked); ``dave`` is not allowed at all.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.channels import signed_headers
from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_command_natives import steps, write_plugin
from tests.integration.gateway.test_subagent_complete import wait_until
from tests.integration.gateway.test_ws_protocol import API_KEY, WAIT_S, config_document

SECRET = "webhook-secret-0123456789abcdef"
ALICE = "agent:main:channel:webhook:alice"


def document(base_url: str, *, alice_roles: list[str], alice_linked: bool = True) -> dict[str, Any]:
    doc = config_document(base_url)
    doc["agents"]["defaults"]["subagents"] = {"maxConcurrent": 1, "runTimeoutSeconds": 60}
    doc["channels"] = {"webhook": {"enabled": True, "secret": SECRET, "allowFrom": ["alice", "bob", "carol"]}}
    doc["operators"] = [
        {
            "name": "alice",
            "roles": alice_roles,
            "links": [{"channel": "webhook", "id": "alice"}] if alice_linked else [],
        },
        {"name": "bob", "roles": ["operator.read"], "links": [{"channel": "webhook", "id": "bob"}]},
    ]
    return doc


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    config = parse_config(document(fake.base_url, alice_roles=["operator.admin"]), base_dir=tmp_path, environ={})
    plugin = write_plugin(tmp_path / "plugins")
    async with GatewayServer(config, data_dir=tmp_path / "data", plugin_paths=[plugin]) as gateway:
        yield gateway


async def post(server: GatewayServer, sender: str, text: str, message_id: str, *, sign: bool = True) -> Any:
    body = json.dumps({"messageId": message_id, "sender": {"id": sender}, "text": text}).encode()
    headers = signed_headers(SECRET if sign else "another-secret-0123456789ab", body, timestamp=int(time.time()))
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{server.port}/channels/webhook"
        async with http.post(url, data=body, headers=headers) as res:
            return res.status, await res.json()


async def reply_of(server: GatewayServer, run_id: str) -> str:
    run = await server.runs.wait_run(run_id, WAIT_S)
    assert run is not None
    messages = server.store.run_messages(run_id)
    return str(messages[-1].content[0]["text"])  # type: ignore[index]


def model_calls(fake: FakeModelServer) -> int:
    return sum(1 for r in fake.requests if r.path.endswith("/chat/completions"))


SPAWN = {"op": "spawn", "args": {"task": "@fake reply: reviewed for alice"}}
JOIN = {"op": "collect", "args": {"ids": ["$0"], "await_results": True}}


async def test_a_linked_admin_senders_command_gets_native_children(server: GatewayServer) -> None:
    status, answer = await post(server, "alice", "/review " + steps(SPAWN, JOIN), "m-1")
    assert status == 202, answer
    accepted, collected = json.loads(await reply_of(server, answer["runId"]))
    assert accepted["child_session_key"].startswith("agent:main:subagent:")
    assert collected["results"][0]["result"] == "reviewed for alice"


async def test_senders_without_operator_authority_get_no_facade(server: GatewayServer, fake: FakeModelServer) -> None:
    for sender, message_id in (("bob", "m-bob"), ("carol", "m-carol")):  # demoted role; allowed but unlinked
        status, answer = await post(server, sender, "/review " + steps(SPAWN), message_id)
        assert status == 202, answer
        assert await reply_of(server, answer["runId"]) == "unavailable"
    # A sender the channel does not authorize cannot run the command at all.
    status, answer = await post(server, "dave", "/review " + steps(SPAWN), "m-dave")
    assert status == 202
    assert "runId" not in answer
    # An unverified request (a bad signature) is refused before anything is recorded.
    status, answer = await post(server, "alice", "/review " + steps(SPAWN), "m-forged", sign=False)
    assert status == 401
    # Quoted command text is not a command: it is an ordinary agent turn, which gets no facade.
    status, answer = await post(server, "alice", "> /review " + steps(SPAWN), "m-quoted")
    assert status == 202
    await server.runs.wait_run(answer["runId"], WAIT_S)
    assert model_calls(fake) == 1  # the quoted turn's own model call; no child was spawned anywhere
    assert server._children.for_parent("agent:main:main") == []  # type: ignore[union-attr]


@pytest.mark.parametrize("change", ["demote", "unlink"])
async def test_losing_authority_fails_waiting_children_at_once(
    server: GatewayServer, fake: FakeModelServer, tmp_path: Path, change: str
) -> None:
    hold = {"op": "spawn", "args": {"task": "@fake delay-ms: 20000\n@fake reply: held the slot"}}
    waiting = {"op": "spawn", "args": {"task": "@fake reply: never runs"}}
    join_waiting = {"op": "collect", "args": {"ids": ["$1"], "await_results": True}}
    status, answer = await post(server, "alice", "/review " + steps(hold, waiting, join_waiting), "m-2")
    assert status == 202, answer
    await fake.wait_for_requests(1)  # the first child holds the only slot; the second waits for it
    children = server._children
    assert children is not None
    await wait_until(lambda: len(children.for_parent(ALICE)) == 2, steps=100_000)
    doc = (
        document(fake.base_url, alice_roles=["operator.read"])
        if change == "demote"
        else document(fake.base_url, alice_roles=["operator.admin"], alice_linked=False)
    )
    started = asyncio.get_running_loop().time()
    server.reload(parse_config(doc, base_dir=tmp_path, environ={}))
    _held, queued, joined = json.loads(await reply_of(server, answer["runId"]))
    assert asyncio.get_running_loop().time() - started < 10  # not the held child's 20 s
    assert joined == {"error": "native_authority_revoked"}
    await wait_until(lambda: children.get(queued["run_id"]).completion is not None, steps=100_000)  # type: ignore[union-attr]
    assert children.get(queued["run_id"]).completion == "failed"  # type: ignore[union-attr]
    assert not any("never runs" in json.dumps(r.body) for r in fake.requests)
    # Her next command carries no authority, so it gets no facade.
    status, answer = await post(server, "alice", "/review " + steps(SPAWN), "m-3")
    assert await reply_of(server, answer["runId"]) == "unavailable"

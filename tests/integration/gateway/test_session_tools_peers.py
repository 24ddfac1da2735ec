"""The model-facing session tools, run unchanged against ``claw gateway serve`` and the real OpenClaw gateway.

Both peers get the same offline config with OpenClaw's settings for collector children (``tools.swarm.enabled``,
direct tool schemas, the ``full`` profile), which clawstack accepts with the same meaning. The scripted fake model
(restarted per phase on one port, because the second phase needs the child's run id) drives a spawn and then a
collection; the assertions are the tool-result shapes and values both peers share. Where OpenClaw sends more keys
(its receipt's ``note`` text, for one), only the shared keys are compared.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from tests.integration.gateway.peers import (
    FakeModel,
    Peer,
    PeerClient,
    free_port,
    openclaw_marks,
    running_peer,
    start_fake_model,
)

PEERS = [pytest.param("claw", id="claw"), pytest.param("openclaw", id="openclaw", marks=openclaw_marks())]
TOOLS = {"swarm": {"enabled": True}, "toolSearch": False, "profile": "full"}
WAIT_S = 90.0

RECEIPT_KEYS = {
    "status",
    "childSessionKey",
    "sessionKey",
    "runId",
    "mode",
    "expectsCompletionMessage",
    "context",
    "note",
    "resolvedModel",
    "resolvedProvider",
    "modelApplied",
}
COMPLETION_KEYS = {"runId", "status", "result", "sessionKey", "label", "usage"}


@pytest.fixture(scope="module")
def model_port() -> int:
    return free_port()


@pytest.fixture(scope="module", params=PEERS)
def peer(request: pytest.FixtureRequest, model_port: int) -> Iterator[Peer]:
    with running_peer(request.param, model_port, extra={"tools": TOOLS}) as gateway:
        yield gateway


@pytest.fixture
async def client(peer: Peer) -> AsyncIterator[PeerClient]:
    async with aiohttp.ClientSession() as http:
        opened = await PeerClient.connected(http, peer.url, auth=peer.credentials)
        yield opened
        await opened.ws.close()


class Phases:
    """One fake model at a time on the peer's model port."""

    def __init__(self, peer: Peer, port: int) -> None:
        self.peer, self.port = peer, port
        self.fake: FakeModel | None = None

    def script(self, steps: list[dict[str, Any]]) -> None:
        if self.fake is not None:
            self.fake.stop()
        self.fake = start_fake_model(self.peer.workdir / "fake-llm.log", port=self.port, script=steps)


@pytest.fixture
def phases(peer: Peer, model_port: int) -> Iterator[Phases]:
    running = Phases(peer, model_port)
    yield running
    if running.fake is not None:
        running.fake.stop()


async def turn(client: PeerClient, key: str, message: str) -> list[dict[str, Any]]:
    """Send ``message``; once the run ended, the JSON tool results of that run, in order."""
    idem = str(uuid.uuid4())
    res = await client.request("chat.send", {"sessionKey": key, "message": message, "idempotencyKey": idem})
    assert res["ok"], res
    run_id = res["payload"]["runId"]
    async with asyncio.timeout(WAIT_S):
        await client.wait_for_chat(run_id, "final", "error")
    history = await client.request("chat.history", {"sessionKey": key, "limit": 200})
    results = []
    for message_ in history["payload"]["messages"]:
        owner = message_.get("runId") or (message_.get("__openclaw") or {}).get("runId")
        if message_["role"] in ("tool", "toolResult") and owner == run_id:
            results.append(json.loads(message_["content"][0]["text"]))
    return results


async def test_spawn_and_collect_answer_in_the_same_shapes(client: PeerClient, phases: Phases) -> None:
    key = "agent:main:main"
    marker = uuid.uuid4().hex[:6]
    phases.script(
        [
            {
                "match_user": f"SPAWN-{marker}",
                "tool_calls": [
                    {
                        "name": "sessions_spawn",
                        "arguments": {"task": f"CHILD-{marker} do it", "collect": True, "label": "peer"},
                    }
                ],
            },
            {"match_user": f"CHILD-{marker}", "reply": "child answer"},
            {"match_user": f"SPAWN-{marker}", "reply": "spawned"},
        ]
    )
    [receipt] = await turn(client, key, f"SPAWN-{marker} please")
    assert set(receipt) >= RECEIPT_KEYS, receipt
    assert receipt["status"] == "accepted"
    assert receipt["sessionKey"] == receipt["childSessionKey"]
    assert receipt["childSessionKey"].startswith("agent:main:subagent:")
    assert receipt["mode"] == "run"
    assert receipt["expectsCompletionMessage"] is False
    assert receipt["context"] == "isolated"
    assert receipt["modelApplied"] is True

    phases.script(
        [
            {
                "match_user": f"WAIT-{marker}",
                "tool_calls": [
                    {
                        "name": "agents_wait",
                        "arguments": {"ids": [receipt["runId"], "no-such-run"], "timeoutSeconds": 30},
                    }
                ],
            },
            {"match_user": f"WAIT-{marker}", "reply": "waited"},
            # The real gateway may start the child only after the spawn turn ended, so after this restart.
            {"match_user": f"CHILD-{marker}", "reply": "child answer"},
        ]
    )
    [state] = await turn(client, key, f"WAIT-{marker} collect")
    assert set(state) >= {"completed", "pending", "errors"}
    assert state["pending"] == []
    assert state["errors"] == [{"runId": "no-such-run", "error": "not_found"}]
    [done] = state["completed"]
    assert set(done) >= COMPLETION_KEYS, done
    assert done["runId"] == receipt["runId"]
    assert done["status"] == "done"
    assert done["result"] == "child answer"
    assert done["sessionKey"] == receipt["childSessionKey"]
    assert done["label"] == "peer"
    assert set(done["usage"]) == {"inputTokens", "outputTokens"}


async def test_channel_delivery_arguments_are_refused_by_both(client: PeerClient, phases: Phases) -> None:
    marker = uuid.uuid4().hex[:6]
    phases.script(
        [
            {
                "match_user": f"BAD-{marker}",
                "tool_calls": [{"name": "sessions_spawn", "arguments": {"task": "x", "channel": "webhook"}}],
            },
            {"match_user": f"BAD-{marker}", "reply": "refused"},
        ]
    )
    idem = str(uuid.uuid4())
    res = await client.request(
        "chat.send", {"sessionKey": "agent:main:main", "message": f"BAD-{marker}", "idempotencyKey": idem}
    )
    async with asyncio.timeout(WAIT_S):
        await client.wait_for_chat(res["payload"]["runId"], "final", "error")
    history = await client.request("chat.history", {"sessionKey": "agent:main:main", "limit": 200})
    tool = [
        m
        for m in history["payload"]["messages"]
        if m["role"] in ("tool", "toolResult") and (m.get("runId") or (m.get("__openclaw") or {}).get("runId")) == idem
    ]
    [result] = tool
    block = result["content"][0]
    is_error = block.get("isError", result.get("isError"))
    assert is_error is True
    assert "channel-delivery" in block["text"]

"""The example gateway config and ``examples/plugins/example-plugin`` in a real gateway, used as a person would.

The config is ``examples/gateway/gateway.json5`` itself, with only its ports and the model's address changed; the
plugin's commands and its ``delegate:`` hook run over a real WebSocket against a real scripted fake model.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import json5
import pytest

from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_ws_protocol import Client, connected

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TOKEN = "example-gateway-token-0123456789"


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


@pytest.fixture
async def server(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    # A copy of the examples: the gateway prepares (and seeds) the agents' workspaces beside the config.
    examples = tmp_path / "examples"
    shutil.copytree(EXAMPLES, examples, ignore=shutil.ignore_patterns("__pycache__"))
    document: dict[str, Any] = json5.loads((examples / "gateway" / "gateway.json5").read_text())
    document["gateway"]["port"] = 0
    document["models"]["providers"]["fake"]["baseUrl"] = fake.base_url
    config = parse_config(document, base_dir=examples / "gateway", environ={"CLAW_GATEWAY_TOKEN": TOKEN})
    async with GatewayServer(config, data_dir=tmp_path / "data") as gateway:
        yield gateway


@pytest.fixture
async def client(server: GatewayServer) -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as http:
        client = await connected(http, server.port, auth={"token": TOKEN})
        yield client
        await client.ws.close()


async def say(client: Client, text: str, run_id: str) -> str:
    res = await client.request(
        "chat.send", {"sessionKey": "agent:main:main", "message": text, "idempotencyKey": run_id}
    )
    assert res["ok"] is True, res
    final = await client.wait_for_chat(run_id, "final")
    return str(final["payload"]["message"]["content"][0]["text"])


async def test_the_example_plugin_loads(server: GatewayServer) -> None:
    plugins = {p.id: p for p in server.plugins}
    assert plugins["example-plugin"].state == "loaded", plugins["example-plugin"].error
    assert plugins["example-plugin"].trust == "trusted"
    assert plugins["example-plugin"].warnings == ()
    assert plugins["hello"].state == "loaded"


async def test_review_trial_and_reviews_use_command_scoped_native_children(
    client: Client, fake: FakeModelServer
) -> None:
    answer = await say(client, '/review the parser change\n@fake reply: {"findings": ["the loop never ends"]}', "v1")
    assert answer == "Findings: the loop never ends"
    review_request = [r for r in fake.requests if r.path.endswith("/chat/completions")][-1]
    system = str(review_request.body["messages"][0]["content"])
    assert "You review a proposed change" in system  # the reviewer profile's instructions
    assert {"write", "edit", "exec"}.isdisjoint(
        tool["function"]["name"] for tool in review_request.body.get("tools", [])
    )
    assert await say(client, "/review again\n@fake reply: looks fine", "v2") == (
        "Review failed: the answer is not the JSON document the output schema asks for"
    )
    assert await say(client, "/trial the frozen task\n@fake reply: 42", "v3") == "42"
    trial_request = [r for r in fake.requests if r.path.endswith("/chat/completions")][-1]
    assert "agent:main:main" not in json.dumps(trial_request.body["messages"])  # a blind child
    listed = await say(client, "/reviews", "v4")
    assert listed.count(" done") == 3


async def test_summarize_uses_the_allowed_model(client: Client, fake: FakeModelServer) -> None:
    answer = await say(client, "/summarize @fake reply: One sentence.", "s1")
    assert answer
    assert fake.requests[-1].body["model"] == "scripted-small"


async def test_research_runs_a_subagent_with_the_plugin_tool(client: Client, fake: FakeModelServer) -> None:
    answer = await say(client, "/research what is new\n@fake reply: Nothing much.", "r1")
    assert answer == "Nothing much. (2 messages, 0 notes)"
    body = fake.requests[-1].body
    assert "example_take_note" in [tool["function"]["name"] for tool in body.get("tools", [])]
    assert body["messages"][0]["role"] == "system"
    listed = await client.request("sessions.list", {})
    assert not any(":research-" in s["key"] for s in listed["payload"]["sessions"])


async def test_background_announces_on_the_main_session(client: Client) -> None:
    answer = await say(client, "/background tidy up\n@fake reply: All tidy.", "b1")
    assert answer.startswith("Started in the background as run ")
    run_id = answer.removeprefix("Started in the background as run ").split(";")[0]
    announce = await client.wait_for_chat(f"{run_id}:announce", "final")
    assert announce["payload"]["message"]["content"][0]["text"].endswith("All tidy.")


async def test_mail_dispatches_a_hook_turn(client: Client, fake: FakeModelServer) -> None:
    answer = await say(client, "/mail Please call me back.\n@fake reply: Call requested.", "m1")
    assert answer.startswith("The e-mail is being handled as run ")
    run_id = answer.removeprefix("The e-mail is being handled as run ").rstrip(".")
    announce = await client.wait_for_chat(f"{run_id}:announce", "final")
    assert announce["payload"]["message"]["content"][0]["text"] == "[Example inbox] Call requested."
    assert "EXTERNAL_UNTRUSTED_CONTENT" in fake.requests[-1].body["messages"][-1]["content"]


async def test_delegate_hook_delivers_to_the_requester(client: Client) -> None:
    answer = await say(client, "delegate:\n@fake reply: Delegated work done.", "d1")
    assert answer == "Delegated to a subagent; its answer will follow in this conversation."
    announce = await client.wait_for_event(
        lambda f: (
            f.get("event") == "chat"
            and str(f["payload"].get("runId", "")).endswith(":announce")
            and f["payload"].get("state") == "final"
        )
    )
    assert announce["payload"]["message"]["content"][0]["text"].endswith("Delegated work done.")


async def claw_chat(server: GatewayServer, *args: str, token: str = TOKEN) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys; from clawstack.cli.gateway import gateway; gateway(sys.argv[1:])",
        "chat",
        "--url",
        server.url,
        *args,
        env={**os.environ, "CLAW_GATEWAY_TOKEN": token},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_claw_gateway_chat_streams_runs_commands_and_follows_announcements(server: GatewayServer) -> None:
    code, out, _ = await claw_chat(server, "Hi\n@fake reply: Hello from the scripted model.")
    assert (code, out) == (0, "Hello from the scripted model.\n")
    code, out, _ = await claw_chat(server, "--follow", "3", "/background tidy\n@fake reply: All tidy.")
    assert code == 0
    started, announced = out.splitlines()
    assert started.startswith("Started in the background as run ")
    assert announced.endswith("] All tidy.")
    code, out, err = await claw_chat(server, "hi", token="wrong-token")
    assert code == 1
    assert "token mismatch" in err

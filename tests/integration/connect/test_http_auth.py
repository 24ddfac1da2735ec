"""``claw connect http``'s front door over real HTTP: tokens (header, query, file reloaded on change, shared
pass), refusals (403 with JSON-RPC -32001), non-JSON posts (415), ``/health``, and the open mode's announcement."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from clawstack.connect import ConnectService, HttpServer, JobStore, TokenAuth, create_app, parse_agents
from tests.integration.connect.harness import HttpConnect, free_port

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-fedcba9876543210"
PUBLIC = "shared-pass-0123456789"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


async def serve(tmp_path: Path, auth: TokenAuth) -> AsyncIterator[str]:
    agents = parse_agents({"agents": [{"id": "a", "url": f"ws://127.0.0.1:{free_port()}", "password": "p"}]})
    service = ConnectService(agents, JobStore(tmp_path / "jobs.sqlite3"))
    await service.start()
    server = HttpServer(create_app(service, auth), port=0)
    await server.start()
    try:
        yield server.url
    finally:
        await server.stop()
        await service.stop()


@pytest.fixture
async def url(tmp_path: Path) -> AsyncIterator[str]:
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps({"Bob": BOB}))
    auth = TokenAuth(user_tokens={"Alice": ALICE}, tokens_file=tokens_file, public_pass=PUBLIC)
    async for value in serve(tmp_path, auth):
        yield value


async def post(url: str, *, headers: dict[str, Any] | None = None, body: Any = INIT) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=30) as http:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await http.post(url, headers={**JSON_HEADERS, **(headers or {})}, content=content)


def assert_refused(reply: httpx2.Response) -> None:
    assert reply.status_code == 403
    body = reply.json()
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["code"] == -32001
    assert ALICE not in reply.text
    assert BOB not in reply.text
    assert PUBLIC not in reply.text


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer  {ALICE} {ALICE}"},
        {"Authorization": f"Basic {ALICE}"},
        {"Authorization": f"Bearer {ALICE}x"},
        {"Authorization": f"Bearer {ALICE[:-1]}"},
        {"Authorization": "Bearer \u00e9\u00e9"},
    ],
    ids=["missing", "wrong", "empty", "doubled", "basic", "longer", "shorter", "latin1"],
)
async def test_wrong_missing_and_malformed_tokens_are_refused(url: str, headers: dict[str, str]) -> None:
    raw = {k: v.encode("utf-8") for k, v in headers.items()}
    assert_refused(await post(url, headers=raw))


async def test_wrong_pass_in_the_query_is_refused(url: str) -> None:
    assert_refused(await post(f"{url}?pass=nope"))


@pytest.mark.parametrize(
    "how",
    [
        {"Authorization": f"Bearer {ALICE}"},
        {"Authorization": f"bearer {BOB}"},
        {"Authorization": f"Bearer {PUBLIC}"},
    ],
    ids=["alice", "bob-from-file", "public"],
)
async def test_valid_tokens_are_admitted(url: str, how: dict[str, str]) -> None:
    reply = await post(url, headers=how)
    assert reply.status_code == 200, reply.text


async def test_the_pass_query_parameter_is_admitted(url: str) -> None:
    assert (await post(f"{url}?pass={ALICE}")).status_code == 200


async def test_a_non_json_post_gets_415(url: str) -> None:
    reply = await post(url, headers={"Authorization": f"Bearer {ALICE}", "Content-Type": "text/plain"}, body=b"hi")
    assert reply.status_code == 415


async def test_a_refused_non_json_post_gets_403_first(url: str) -> None:
    assert_refused(await post(url, headers={"Content-Type": "text/plain"}, body=b"hi"))


async def test_health_needs_no_token(url: str) -> None:
    async with httpx2.AsyncClient(timeout=30) as http:
        reply = await http.get(url.removesuffix("/mcp") + "/health")
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok", "jobStore": "ok", "agents": 1}


async def test_the_tokens_file_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps({"Bob": BOB}))
    async for url in serve(tmp_path, TokenAuth(tokens_file=tokens_file)):
        assert (await post(url, headers={"Authorization": f"Bearer {BOB}"})).status_code == 200
        tokens_file.write_text(json.dumps({"Carol": ALICE}))
        os.utime(tokens_file, ns=(1, 1))  # a change even within the filesystem's timestamp granularity
        assert_refused(await post(url, headers={"Authorization": f"Bearer {BOB}"}))
        assert (await post(url, headers={"Authorization": f"Bearer {ALICE}"})).status_code == 200
        tokens_file.write_text("{not json")
        assert_refused(await post(url, headers={"Authorization": f"Bearer {ALICE}"}))


async def test_open_mode_is_announced_at_start(tmp_path: Path) -> None:
    env = {"OPENCLAW_URL": f"ws://127.0.0.1:{free_port()}", "OPENCLAW_PASSWORD": "p"}
    env.update({"MCP_USER_TOKENS": "", "MCP_USER_TOKENS_FILE": "", "PUBLIC_MCP_PASS": ""})
    http = HttpConnect(tmp_path, env)
    try:
        assert http.mode.startswith("(open:")
        assert (await post(http.url)).status_code == 200
    finally:
        assert http.close() == 0


async def test_a_configured_server_says_how_it_admits(tmp_path: Path) -> None:
    env = {"OPENCLAW_URL": f"ws://127.0.0.1:{free_port()}", "OPENCLAW_PASSWORD": "p"}
    env.update({"MCP_USER_TOKENS": f"Alice:{ALICE}", "MCP_USER_TOKENS_FILE": "", "PUBLIC_MCP_PASS": ""})
    http = HttpConnect(tmp_path, env)
    try:
        assert http.mode == "(auth: personal tokens)"
        assert ALICE not in http.mode
        assert_refused(await post(http.url))
    finally:
        assert http.close() == 0

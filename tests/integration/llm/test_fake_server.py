"""The scripted fake as an HTTP server, spoken to with a plain aiohttp client: its routes, error envelopes,
request validation, the request log, the API key, the wire format, and its lifecycle."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.llm import FakeScriptError
from clawstack.llm.fake import FakeModelServer, ServerState, parse_script


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _post(http: aiohttp.ClientSession, fake: FakeModelServer, body: Any, **kwargs: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(f"{fake.base_url}/chat/completions", data=data, **kwargs) as response:
        return response.status, await response.json()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "invalid_json"),
        ([], "invalid_body"),
        ({"messages": [{"role": "user", "content": "x"}]}, "invalid_model"),
        ({"model": "", "messages": [{"role": "user", "content": "x"}]}, "invalid_model"),
        ({"model": "m"}, "invalid_messages"),
        ({"model": "m", "messages": []}, "invalid_messages"),
        ({"model": "m", "messages": ["hi"]}, "invalid_messages"),
        ({"model": "m", "messages": [{"content": "no role"}]}, "invalid_messages"),
        ({"model": "m", "messages": [{"role": "user"}], "stream": "yes"}, "invalid_stream"),
        ({"model": "m", "messages": [{"role": "user"}], "stream_options": []}, "invalid_stream"),
        ({"model": "m", "messages": [{"role": "user"}], "stream_options": {"include_usage": 1}}, "invalid_stream"),
        ({"model": "m", "messages": [{"role": "user", "content": "@fake nope"}]}, "fake_directive_invalid"),
    ],
)
async def test_bad_requests_get_openai_error_envelopes(
    fake: FakeModelServer, http: aiohttp.ClientSession, body: Any, code: str
) -> None:
    status, answer = await _post(http, fake, body)
    assert status == 400
    assert set(answer) == {"error"}
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert (answer["error"]["type"], answer["error"]["code"]) == ("invalid_request_error", code)


async def test_unknown_route_and_method(fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{fake.base_url}/embeddings") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "unknown_url"
    async with http.get(f"{fake.base_url}/chat/completions") as response:
        assert response.status == 405
        assert (await response.json())["error"]["code"] == "method_not_allowed"


async def test_request_log_over_http(fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "@fake reply: ok"}], "seed": 1}
    await _post(http, fake, body, headers={"Authorization": "Bearer sk-hidden", "X-Api-Key": "k", "X-Run": "r1"})
    async with http.get(f"{fake.base_url}/models"):
        pass
    async with http.get(f"http://{fake.base_url.split('/')[2]}/_fake/requests") as response:
        log = await response.json()
    first, second = log["requests"]
    assert (first["method"], first["path"], first["body"]) == ("POST", "/v1/chat/completions", body)
    assert first["headers"]["x-run"] == "r1"
    assert {"authorization", "x-api-key"}.isdisjoint(first["headers"])
    assert "sk-hidden" not in json.dumps(log)
    assert (second["method"], second["path"], second["body"]) == ("GET", "/v1/models", None)
    async with http.delete(f"http://{fake.base_url.split('/')[2]}/_fake/requests") as response:
        assert response.status == 204
    assert fake.requests == []


async def test_api_key_401_envelope_and_recorded_request(http: aiohttp.ClientSession) -> None:
    async with FakeModelServer(api_key="sk-right") as fake:
        status, answer = await _post(
            http, fake, {"model": "m", "messages": [{"role": "user"}]}, headers={"Authorization": "Bearer sk-no"}
        )
        status_ok, _ = await _post(
            http, fake, {"model": "m", "messages": [{"role": "user"}]}, headers={"Authorization": "bearer sk-right"}
        )
    assert status == 401
    assert answer == {
        "error": {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert status_ok == 200
    assert len(fake.requests) == 2


async def test_sse_wire_format(fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "@fake reply: a b"}], "stream": True}
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as response:
        assert response.content_type == "text/event-stream"
        wire = await response.read()
    events = wire.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    payloads = [json.loads(event.removeprefix("data: ")) for event in events[:-2]]
    assert all(payload["object"] == "chat.completion.chunk" for payload in payloads)
    assert [p["choices"][0]["delta"].get("content") for p in payloads] == ["", "a ", "b", None]


async def test_rate_limit_sends_retry_after(fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "@fake fail: 429\n@fake retry-after-s: 4"}]}
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as response:
        assert response.status == 429
        assert response.headers["Retry-After"] == "4"
    body["messages"][0]["content"] = "@fake fail: 500"
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as response:
        assert response.status == 500
        assert "Retry-After" not in response.headers


async def test_a_step_whose_client_left_during_its_delay_is_given_to_the_retry(http: aiohttp.ClientSession) -> None:
    script = parse_script([{"reply": "the scripted answer", "delay_ms": 60000}])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with FakeModelServer(script) as fake:
        first = asyncio.create_task(_post(http, fake, body))
        async with asyncio.timeout(10):
            await fake.wait_for_requests(1)  # recorded, and its step taken, before the fake starts waiting
        assert fake.script_steps_remaining == 0
        first.cancel()  # the connection drops while the fake waits, before any byte of the answer
        with pytest.raises(asyncio.CancelledError):
            await first
        async with asyncio.timeout(10):
            await fake.wait_for_client_disconnects(1)
        assert fake.script_steps_remaining == 1
        # The retry takes the step it was scripted to get (and waits its delay) rather than fake_script_exhausted.
        retry = asyncio.create_task(_post(http, fake, body))
        async with asyncio.timeout(10):
            await fake.wait_for_requests(2)
        assert fake.script_steps_remaining == 0
        retry.cancel()
        with pytest.raises(asyncio.CancelledError):
            await retry


async def test_models(fake: FakeModelServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{fake.base_url}/models") as response:
        assert await response.json() == {
            "object": "list",
            "data": [{"id": "clawstack-fake", "object": "model", "created": 0, "owned_by": "clawstack"}],
        }


async def test_lifecycle_with_start_and_stop() -> None:
    fake = FakeModelServer(model_ids=("a", "b"))
    assert fake.state is ServerState.NEW
    with pytest.raises(RuntimeError, match="not started"):
        _ = fake.base_url
    await fake.start()
    try:
        assert fake.state is ServerState.RUNNING
        with pytest.raises(RuntimeError, match="cannot start"):
            await fake.start()
    finally:
        await fake.stop()
    await fake.stop()
    assert fake.state is ServerState.STOPPED


async def test_unix_socket_is_private_and_removed(socket_path: Path) -> None:
    async with FakeModelServer(unix_socket=socket_path) as fake:
        mode = os.stat(socket_path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        assert fake.base_url == "http://localhost/v1"
    with pytest.raises(FileNotFoundError):
        os.stat(socket_path)


async def test_port_in_use_fails_to_start() -> None:
    async with FakeModelServer() as first:
        port = int(first.base_url.rsplit(":", 1)[1].split("/")[0])
        second = FakeModelServer(port=port)
        with pytest.raises(OSError, match=r"(?i)address already in use"):
            await second.start()
        assert second.state is ServerState.STOPPED


def test_bad_script_path_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FakeScriptError, match="cannot read the script file"):
        FakeModelServer(tmp_path / "missing.json")

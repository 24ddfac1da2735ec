"""Request shapes learned from upstream answers: a model that rejects ``max_tokens`` is served through the
Responses API from then on (one rejection, paid once); a rejected sampling parameter is dropped and the request
retried once; a Responses upstream's answer reaches the worker as Chat Completions, streamed or not, with the
slot's effort as ``reasoning.effort``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from clawstack.common.clock import SystemClock
from clawstack.common.ids import new_id, new_secret
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.server import ProxyServer

from .conftest import ENVIRON, OPERATOR_TOKEN, proxy_config

UNSUPPORTED_MAX_TOKENS = {
    "error": {
        "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead.",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "unsupported_parameter",
    }
}


def unsupported(param: str) -> dict[str, Any]:
    return {
        "error": {
            "message": f"Unsupported value: '{param}' does not support 0.2 with this model.",
            "type": "invalid_request_error",
            "param": param,
            "code": "unsupported_value",
        }
    }


def completed(text: str) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1_790_000_000,
        "status": "completed",
        "model": "gpt-6.1-terra",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
    }


def events(text: str) -> bytes:
    response = completed(text)
    items = [
        ("response.created", {"response": {**response, "status": "in_progress", "output": []}}),
        ("response.output_item.added", {"output_index": 0, "item": {**response["output"][0], "content": []}}),
        ("response.output_text.delta", {"output_index": 0, "content_index": 0, "item_id": "msg_1", "delta": text}),
        ("response.output_item.done", {"output_index": 0, "item": response["output"][0]}),
        ("response.completed", {"response": response}),
    ]
    out = b""
    for number, (kind, body) in enumerate(items):
        out += f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': number, **body})}\n\n".encode()
    return out


@dataclass
class Upstream:
    """Rejects max_tokens and temperature on Chat Completions; serves the Responses API."""

    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(("chat", body))
        if "max_tokens" in body:
            return web.json_response(UNSUPPORTED_MAX_TOKENS, status=400)
        if "temperature" in body:
            return web.json_response(unsupported("temperature"), status=400)
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "chat ok"}, "finish_reason": "stop"}
                ],
            }
        )

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(("responses", body))
        if "temperature" in body:
            return web.json_response(unsupported("temperature"), status=400)
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(events("streamed via responses"))
            await response.write_eof()
            return response
        return web.json_response(completed("via responses"))


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Upstream, ProxyServer, str]]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream.chat)
    app.router.add_post("/v1/responses", upstream.responses)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    proxy = ProxyServer(proxy_config(tmp_path, {"openai": f"http://127.0.0.1:{port}/v1"}), environ=ENVIRON)
    await proxy.start()
    ident, secret = new_id("run-"), new_secret()
    async with ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url) as operator:
        await operator.create_identity(
            identity_id=ident,
            secret=secret,
            chain=[ChainEntry("primary", "openai/gpt-6.1-terra", reasoning_effort="high")],
            tools=[],
            expires_at=SystemClock().now() + timedelta(hours=1),
            labels={},
        )
    try:
        yield upstream, proxy, f"{ident}:{secret}"
    finally:
        await proxy.stop()
        await runner.cleanup()


async def ask(proxy: ProxyServer, credential: str, **extra: Any) -> httpx.Response:
    body = {"model": "primary", "messages": [{"role": "user", "content": "hi"}], **extra}
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            proxy.worker_base_url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {credential}"}
        )


async def test_a_max_tokens_rejection_switches_the_model_to_responses_once(
    served: tuple[Upstream, ProxyServer, str],
) -> None:
    upstream, proxy, credential = served
    first = await ask(proxy, credential, max_tokens=64)
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["message"]["content"] == "via responses"
    assert first.json()["object"] == "chat.completion"
    assert [kind for kind, _ in upstream.requests] == ["chat", "responses"]
    sent = upstream.requests[1][1]
    assert sent["max_output_tokens"] == 64
    assert "max_tokens" not in sent
    assert sent["reasoning"] == {"effort": "high"}  # the slot's effort, in the Responses API's shape
    assert sent["store"] is False
    second = await ask(proxy, credential, max_tokens=64, stream=True)
    assert second.status_code == 200
    text = "".join(
        (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in second.text.splitlines()
        if line.startswith("data: {")
    )
    assert text == "streamed via responses"
    assert second.text.rstrip().endswith("data: [DONE]")
    assert [kind for kind, _ in upstream.requests] == ["chat", "responses", "responses"]  # the shape was reused
    described = proxy.service.describe(proxy.service.get_identity(credential.split(":")[0]))
    assert described["served_by"] == {"api_key": 2}  # the rejected try is not a served call


async def test_a_sampling_rejection_is_retried_once_without_it(served: tuple[Upstream, ProxyServer, str]) -> None:
    upstream, proxy, credential = served
    answer = await ask(proxy, credential, temperature=0.2)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "chat ok"
    assert [("temperature" in body) for _, body in upstream.requests] == [True, False]
    await ask(proxy, credential, temperature=0.2)
    assert len(upstream.requests) == 3  # learned: later requests go without it at once
    assert "temperature" not in upstream.requests[2][1]


async def test_an_effort_the_model_table_refuses_is_refused_before_dispatch(
    served: tuple[Upstream, ProxyServer, str],
) -> None:
    upstream, proxy, _ = served
    ident, secret = new_id("run-"), new_secret()
    async with ProxyOperatorClient(token=OPERATOR_TOKEN, base_url=proxy.operator_base_url) as operator:
        await operator.create_identity(
            identity_id=ident,
            secret=secret,
            chain=[ChainEntry("primary", "openai/gpt-6-luna", reasoning_effort="minimal")],
            tools=[],
            expires_at=SystemClock().now() + timedelta(hours=1),
            labels={},
        )
    answer = await ask(proxy, f"{ident}:{secret}")
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "reasoning_effort_unsupported"
    assert "openai/gpt-6-luna does not support reasoning effort 'minimal'" in answer.json()["error"]["message"]
    assert upstream.requests == []  # nothing was dispatched

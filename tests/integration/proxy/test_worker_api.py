"""The worker-facing API: authentication, bodies, models, and chain routing through real fake upstreams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from clawstack.llm import LLMHTTPError, LLMStreamError
from clawstack.llm.fake import parse_script
from clawstack.proxy.identities import ChainEntry

from .conftest import KEYS, StackFactory


async def raw(
    url: str, *, headers: dict[str, str] | None = None, data: bytes | None = None, method: str = "POST"
) -> tuple[int, dict[str, Any], bytes]:
    async with aiohttp.ClientSession() as session, session.request(method, url, headers=headers, data=data) as resp:
        body = await resp.read()
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = {}
        return resp.status, parsed, body


CHAT = json.dumps({"model": "primary", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.mark.parametrize(
    ("header", "status", "code"),
    [
        (None, 401, "missing_credentials"),
        ("Basic dXNlcjpwYXNz", 401, "malformed_credentials"),
        ("Bearer ", 401, "malformed_credentials"),
        ("Bearer :secret", 401, "malformed_credentials"),
        ("Bearer someid:", 401, "malformed_credentials"),
        ("Bearer noseparator", 401, "malformed_credentials"),
        ("Bearer unknown-id:" + "s" * 43, 403, "identity_unknown"),
    ],
)
async def test_credential_shapes(make_stack: StackFactory, header: str | None, status: int, code: str) -> None:
    stack = await make_stack()
    headers = {"Authorization": header} if header is not None else {}
    got, body, _ = await raw(stack.proxy.worker_base_url + "/chat/completions", headers=headers, data=CHAT)
    assert got == status
    assert body["error"]["code"] == code
    assert set(body["error"]) == {"message", "type", "code"}
    assert stack.primary.requests == []


async def test_split_is_on_the_first_colon_and_secret_must_match(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    url = stack.proxy.worker_base_url + "/chat/completions"
    # "<id>:<secret>:extra" means id=<id>, secret="<secret>:extra": a wrong secret.
    got, body, raw_body = await raw(url, headers={"Authorization": f"Bearer {ident}:{secret}:x"}, data=CHAT)
    assert (got, body["error"]["code"]) == (403, "identity_refused")
    assert secret.encode() not in raw_body
    got, _, _ = await raw(url, headers={"x-api-key": f"{ident}:{secret}"}, data=CHAT)
    assert got == 200


async def test_expired_identity_is_refused(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity(ttl_s=1)
    await asyncio.sleep(1.1)  # wall-clock expiry of a real identity; one second is the smallest
    got, body, _ = await raw(
        stack.proxy.worker_base_url + "/models", method="GET", headers={"Authorization": f"Bearer {ident}:{secret}"}
    )
    assert (got, body["error"]["code"]) == (403, "identity_expired")


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"{not json", "json_syntax"),
        (b'{"model": "primary", "model": "x", "messages": []}', "json_duplicate_key"),
        (b'"just a string"', "invalid_request"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "invalid_request"),
        (b'{"model": "primary", "messages": []}', "invalid_request"),
        (b'{"model": "primary", "messages": [{"role":"user","content":"x"}], "stream": "yes"}', "invalid_request"),
        (b'{"model": "nope/model", "messages": [{"role":"user","content":"x"}]}', "model_not_found"),
        (
            b'{"model": "primary", "messages": [{"role":"user","content":"x"}], "tools": [{"type": "function",'
            b' "function": {"name": "ticket-api__get_ticket", "parameters": {}}}]}',
            "tool_name_reserved",
        ),
    ],
)
async def test_malformed_bodies(make_stack: StackFactory, data: bytes, code: str, tmp_path: Any) -> None:
    stack = await make_stack(config_extra={"tools": _ticket_tools("http://127.0.0.1:9")})
    ident, secret = await stack.identity()
    got, body, raw_body = await raw(
        stack.proxy.worker_base_url + "/chat/completions",
        headers={"Authorization": f"Bearer {ident}:{secret}"},
        data=data,
    )
    assert got in (400, 404)
    assert body["error"]["code"] == code
    assert stack.primary.requests == []
    assert str(tmp_path).encode() not in raw_body


async def test_oversized_body(make_stack: StackFactory) -> None:
    stack = await make_stack(config_extra={"routing": {"max_request_bytes": 4096}})
    ident, secret = await stack.identity()
    big = json.dumps({"model": "primary", "messages": [{"role": "user", "content": "x" * 5000}]}).encode()
    got, body, _ = await raw(
        stack.proxy.worker_base_url + "/chat/completions",
        headers={"Authorization": f"Bearer {ident}:{secret}"},
        data=big,
    )
    assert got == 413
    assert body["error"]["code"] in ("body_too_large", "json_too_large")


async def test_models_lists_the_chain(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        models = await client.list_models()
    assert [m.id for m in models] == ["openai/gpt-test", "custom/fallback-model"]


async def test_primary_serves_with_the_proxys_key_and_upstream_model(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        done = await client.chat_completion(model="primary", messages=[{"role": "user", "content": "@fake reply: ok"}])
    assert done.content == "ok"
    (request,) = stack.primary.requests
    assert request.body["model"] == "gpt-test"
    assert "reasoning_effort" not in request.body
    assert stack.fallback.requests == []
    # The upstream saw the proxy's key, never the worker's identity.
    assert all(secret not in json.dumps(r.body) for r in stack.primary.requests)


@pytest.mark.parametrize(
    ("step", "failure"),
    [
        ({"fail": 500}, "server_error"),
        ({"fail": 503}, "server_error"),
        ({"fail": 401}, "key_dead"),
        ({"fail": 403}, "key_dead"),
        ({"fail": 402}, "key_dead"),
        ({"fail": 429, "retry_after_s": 5}, "rate_limited"),
        ({"delay_ms": 3000, "reply": "late"}, "first_byte_timeout"),
        ({"reply": "x", "drop_after_chunks": 0}, "transport"),
    ],
)
async def test_fallback_on_each_failure_class(make_stack: StackFactory, step: dict[str, Any], failure: str) -> None:
    stack = await make_stack(
        primary_script=parse_script([step]), fallback_script=parse_script([{"reply": "from the fallback"}])
    )
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        done = await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    assert done.content == "from the fallback"
    assert len(stack.fallback.requests) == 1
    assert stack.fallback.requests[0].body["model"] == "fallback-model"


async def test_400_does_not_move_on(make_stack: StackFactory) -> None:
    stack = await make_stack(primary_script=parse_script([{"fail": 400}]))
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMHTTPError) as info:
            await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    assert info.value.status == 400
    assert info.value.error_code == "upstream_bad_request"
    assert stack.fallback.requests == []


async def test_dead_key_is_skipped_and_resting_key_waits(make_stack: StackFactory) -> None:
    stack = await make_stack(
        primary_script=parse_script([{"fail": 401}, {"reply": "never"}]),
        fallback_script=parse_script([{"reply": "ok"}] * 3),
    )
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        for _ in range(3):
            done = await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
            assert done.content == "ok"
    assert len(stack.primary.requests) == 1  # the dead key was not tried again
    assert len(stack.fallback.requests) == 3
    health = await stack.operator.health()
    assert health["keys"] == {"openai:OPENAI_API_KEY": "key_dead"}
    assert KEYS["OPENAI_API_KEY"] not in json.dumps(health)


@pytest.mark.parametrize(
    ("primary", "fallback", "status", "code"),
    [
        ({"fail": 502}, {"fail": 500}, 502, "upstream_unavailable"),
        ({"fail": 500}, {"delay_ms": 3000, "reply": "late"}, 504, "upstream_timeout"),
        ({"fail": 500}, {"fail": 429, "retry_after_s": 1}, 429, "upstream_rate_limited"),
        ({"fail": 401}, {"fail": 403}, 502, "upstream_unavailable"),
    ],
)
async def test_exhausted_chain_names_the_last_failure(
    make_stack: StackFactory, primary: dict[str, Any], fallback: dict[str, Any], status: int, code: str
) -> None:
    stack = await make_stack(primary_script=parse_script([primary]), fallback_script=parse_script([fallback]))
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMHTTPError) as info:
            await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    assert (info.value.status, info.value.error_code) == (status, code)


async def test_streaming_passes_through_and_is_never_retried_after_bytes(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        async with client.stream_chat_completion(
            model="primary", messages=[{"role": "user", "content": "@fake reply: one two three"}]
        ) as stream:
            done = await stream.final_completion()
        assert done.content == "one two three"
        with pytest.raises(LLMStreamError) as info:
            async with client.stream_chat_completion(
                model="primary",
                messages=[{"role": "user", "content": "@fake reply: a b c d e f\n@fake drop-after-chunks: 3"}],
            ) as stream:
                await stream.final_completion()
        assert info.value.error_code == "upstream_stream_broken"
    assert len(stack.primary.requests) == 2
    assert stack.fallback.requests == []  # bytes had reached the worker: no retry elsewhere


async def test_streaming_falls_back_before_the_first_byte(make_stack: StackFactory) -> None:
    stack = await make_stack(
        primary_script=parse_script([{"fail": 503}]), fallback_script=parse_script([{"reply": "streamed by fallback"}])
    )
    ident, secret = await stack.identity()
    async with (
        stack.worker(ident, secret) as client,
        client.stream_chat_completion(model="primary", messages=[{"role": "user", "content": "x"}]) as stream,
    ):
        done = await stream.final_completion()
    assert done.content == "streamed by fallback"


async def test_model_can_start_at_a_later_slot(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity()
    async with stack.worker(ident, secret) as client:
        await client.chat_completion(model="custom/fallback-model", messages=[{"role": "user", "content": "x"}])
    assert stack.primary.requests == []
    assert len(stack.fallback.requests) == 1


async def test_reasoning_effort_per_slot(make_stack: StackFactory) -> None:
    stack = await make_stack(primary_script=parse_script([{"fail": 500}]))
    ident, secret = await stack.identity(
        chain=[ChainEntry("primary", "openai/gpt-test", reasoning_effort="high"), ChainEntry("fallback", "custom/m")]
    )
    async with stack.worker(ident, secret) as client:
        await client.chat_completion(
            model="primary", messages=[{"role": "user", "content": "x"}], reasoning_effort="low"
        )
    assert stack.primary.requests[0].body["reasoning_effort"] == "high"
    assert "reasoning_effort" not in stack.fallback.requests[0].body  # a slot without an entry sends none


async def test_openrouter_provider_object_and_data_policy(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity(
        chain=[
            ChainEntry(
                "primary",
                "openrouter/google/gemini-test",
                provider_preferences={"only": ["google-vertex/global", "google-ai-studio"], "allow_fallbacks": False},
            )
        ]
    )
    async with stack.worker(ident, secret) as client:
        await client.chat_completion(
            model="primary",
            messages=[{"role": "user", "content": "x"}],
            extra={"provider": {"only": ["google-vertex/global"]}},
        )
        sent = stack.fallback.requests[0].body
        assert sent["model"] == "google/gemini-test"
        assert sent["provider"] == {
            "only": ["google-vertex/global"],
            "allow_fallbacks": False,
            "zdr": True,
            "data_collection": "deny",
        }
        for weakening in (
            {"data_collection": "allow"},
            {"zdr": False},
            {"allow_fallbacks": True},
            {"only": ["other/provider"]},
            {"only": []},
        ):
            with pytest.raises(LLMHTTPError) as info:
                await client.chat_completion(
                    model="primary", messages=[{"role": "user", "content": "x"}], extra={"provider": weakening}
                )
            assert info.value.error_code == "data_policy_violation"
        # A key outside the five narrowing ones is not a preference the proxy knows: outside the allowlist.
        with pytest.raises(LLMHTTPError) as info:
            await client.chat_completion(
                model="primary", messages=[{"role": "user", "content": "x"}], extra={"provider": {"sort": "price"}}
            )
        assert info.value.error_code == "request_field_refused"
        assert "provider.sort" in (info.value.server_message or "")
    assert len(stack.fallback.requests) == 1


async def test_plan_route_moves_on_and_is_reported(make_stack: StackFactory) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity(
        chain=[ChainEntry("primary", "chatgpt/gpt-plan"), ChainEntry("fallback", "custom/m")]
    )
    async with stack.worker(ident, secret) as client:
        done = await client.chat_completion(model="primary", messages=[{"role": "user", "content": "@fake reply: k"}])
    assert done.content == "k"
    described = await stack.operator.get_identity(ident)
    assert described["last_plan_failure"] == "subscription_signin_required"
    assert described["served_by"] == {"api_key": 1}
    assert described["served_by_complete"] is True


def _ticket_tools(base_url: str) -> dict[str, Any]:
    return {
        "ticket-api": {
            "base_url": base_url,
            "descriptor": {
                "version": 2,
                "auth": {"type": "bearer", "env": "TICKET_TOKEN"},
                "tools": [
                    {
                        "name": "get_ticket",
                        "description": "Read a ticket.",
                        "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
                        "http": {"method": "POST", "path": "/tools/get_ticket"},
                    },
                    {
                        "name": "close_ticket",
                        "description": "Close a ticket.",
                        "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
                        "http": {"method": "POST", "path": "/tools/close_ticket"},
                    },
                ],
            },
        }
    }


HOSTED = [
    {"type": "mcp", "server_label": "remote", "server_url": "https://mcp.example.com/sse"},
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter"},
    {"type": "computer_use_preview", "display_width": 1024, "display_height": 768},
    {"type": "image_generation"},
    {"type": "some_future_hosted_tool"},
    {"function": {"name": "untyped", "parameters": {}}},  # no type at all is not a worker tool either
]


@pytest.mark.parametrize(
    "ref", ["openai/gpt-test", "custom/m", "openrouter/google/gemini-test", "vercel/openai/gpt-test"]
)
async def test_hosted_tools_are_refused_before_dispatch_on_every_route(make_stack: StackFactory, ref: str) -> None:
    stack = await make_stack()
    ident, secret = await stack.identity(chain=[ChainEntry("primary", ref)])
    url = stack.proxy.worker_base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {ident}:{secret}"}
    base = {"model": "primary", "messages": [{"role": "user", "content": "search the web"}]}
    function = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    for tool in HOSTED:
        got, body, _ = await raw(url, headers=headers, data=json.dumps(base | {"tools": [function, tool]}).encode())
        assert (got, body["error"]["code"], body["error"]["param"]) == (400, "hosted_tool_refused", "tools[1].type")
    # Fields that switch a hosted capability on are outside the allowlist, like any unknown field.
    for field in ({"web_search_options": {}}, {"plugins": [{"id": "web"}]}):
        got, body, _ = await raw(url, headers=headers, data=json.dumps(base | field).encode())
        assert (got, body["error"]["code"]) == (400, "request_field_refused"), field
        assert body["error"]["param"] == next(iter(field))
    assert stack.primary.requests == []
    assert stack.fallback.requests == []  # no upstream saw any of them
    # The worker's own function and custom tools pass.
    custom = {"type": "custom", "custom": {"name": "grep"}}
    got, body, _ = await raw(url, headers=headers, data=json.dumps(base | {"tools": [function, custom]}).encode())
    assert got == 200, body
    served = stack.primary.requests + stack.fallback.requests
    assert [t["type"] for t in served[0].body["tools"]] == ["function", "custom"]

"""Every OpenAI Chat Completions request field through a real proxy to a scripted fake upstream that records what
it receives: forwarded fields arrive as sent, dropped ones never arrive, refused ones are answered ``400`` naming
the field and reach no upstream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from clawstack.proxy.identities import ChainEntry

from .conftest import Stack, StackFactory
from .test_worker_api import raw

MESSAGES = [{"role": "user", "content": "hi"}]
FUNCTION = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

FORWARDED: dict[str, Any] = {
    "frequency_penalty": 0.5,
    "logit_bias": {"50256": -100},
    "logprobs": True,
    "max_completion_tokens": 64,
    "max_tokens": 64,
    "modalities": ["text"],
    "n": 1,
    "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "draft"},
    "presence_penalty": 0.1,
    "prompt_cache_key": "k-1",
    "response_format": {"type": "json_object"},
    "safety_identifier": "s-1",
    "seed": 7,
    "stop": ["\n\n"],
    "store": False,
    "stream": False,
    "stream_options": {"include_usage": True},
    "temperature": 0.2,
    "tool_choice": "auto",
    "tools": [FUNCTION],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "u-1",
    "verbosity": "low",
}
REFUSED: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "wav"},
    "function_call": "auto",
    "functions": [{"name": "lookup", "parameters": {"type": "object"}}],
    "service_tier": "priority",
    "web_search_options": {"search_context_size": "high"},
}


async def send(stack: Stack, body: dict[str, Any], chain: list[ChainEntry] | None = None) -> tuple[int, Any]:
    ident, secret = await stack.identity(chain=chain or [ChainEntry("primary", "openai/gpt-test")])
    got, answer, _ = await raw(
        stack.proxy.worker_base_url + "/chat/completions",
        headers={"Authorization": f"Bearer {ident}:{secret}"},
        data=json.dumps(body).encode(),
    )
    return got, answer


@pytest.mark.parametrize(("field", "value"), sorted(FORWARDED.items()))
async def test_an_allowlisted_field_reaches_the_upstream_as_sent(
    make_stack: StackFactory, field: str, value: Any
) -> None:
    stack = await make_stack()
    got, answer = await send(stack, {"model": "primary", "messages": MESSAGES, field: value})
    assert got == 200, answer
    (request,) = stack.primary.requests
    assert request.body[field] == value


async def test_model_is_replaced_messages_forwarded_and_reasoning_effort_dropped(make_stack: StackFactory) -> None:
    stack = await make_stack()
    got, _ = await send(stack, {"model": "primary", "messages": MESSAGES, "reasoning_effort": "high"})
    assert got == 200
    (request,) = stack.primary.requests
    assert request.body == {"model": "gpt-test", "messages": MESSAGES}  # the slot declares no effort


@pytest.mark.parametrize(("field", "value"), sorted(REFUSED.items()))
async def test_a_refused_field_is_named_and_reaches_no_upstream(
    make_stack: StackFactory, field: str, value: Any
) -> None:
    stack = await make_stack()
    got, answer = await send(stack, {"model": "primary", "messages": MESSAGES, field: value})
    assert got == 400
    assert answer["error"]["code"] == "request_field_refused"
    assert answer["error"]["param"] == field
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"].startswith(f"{field}: ")
    assert json.dumps(value) not in answer["error"]["message"]
    assert stack.primary.requests == []
    assert stack.fallback.requests == []


RETENTION: list[tuple[str, Any]] = [("store", True), ("metadata", {"run": "r-1"})]


@pytest.mark.parametrize(("field", "value"), RETENTION)
async def test_retention_fields_are_refused_under_no_retention(
    make_stack: StackFactory, field: str, value: Any
) -> None:
    stack = await make_stack()  # the default policy: no retention
    got, answer = await send(stack, {"model": "primary", "messages": MESSAGES, field: value})
    assert (got, answer["error"]["code"], answer["error"]["param"]) == (400, "data_policy_violation", field)
    assert stack.primary.requests == []


@pytest.mark.parametrize(("field", "value"), RETENTION)
async def test_retention_fields_are_forwarded_under_a_permissive_policy(
    make_stack: StackFactory, field: str, value: Any
) -> None:
    stack = await make_stack(config_extra={"data_policy": "permissive"})
    got, _ = await send(stack, {"model": "primary", "messages": MESSAGES, field: value})
    assert got == 200
    assert stack.primary.requests[0].body[field] == value


async def test_a_streamed_request_with_every_forwarded_field(make_stack: StackFactory) -> None:
    stack = await make_stack()
    body = {"model": "primary", "messages": MESSAGES, **FORWARDED, "stream": True}
    got, _ = await send(stack, body)
    assert got == 200
    (request,) = stack.primary.requests
    assert request.body == {**body, "model": "gpt-test"}

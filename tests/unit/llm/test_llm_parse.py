"""Parsing OpenAI-shaped bodies: the fields the client uses are checked; malformed ones are refused by name."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from clawstack.llm import LLMProtocolError, LLMStreamError, ToolCall, ToolCallDelta, Usage
from clawstack.llm._parse import loads_json_object, parse_chunk, parse_completion, parse_models

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "provider_extra": {"ignored": True},
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "SECRET-CONTENT",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def test_parse_completion() -> None:
    completion = parse_completion(COMPLETION)
    assert completion.id == "chatcmpl-1"
    assert completion.model == "m"
    assert completion.content == "SECRET-CONTENT"
    assert completion.tool_calls == (ToolCall(id="c1", name="f", arguments="{}"),)
    assert completion.finish_reason == "tool_calls"
    assert completion.usage == Usage(3, 2, 5)
    assert completion.raw is COMPLETION


def test_null_content_and_no_usage() -> None:
    body = copy.deepcopy(COMPLETION)
    body["choices"][0]["message"]["content"] = None
    del body["usage"]
    completion = parse_completion(body)
    assert completion.content is None
    assert completion.usage is None


def _broken(path: str, value: Any) -> dict[str, Any]:
    body = copy.deepcopy(COMPLETION)
    *parents, last = path.split(".")
    target: Any = body
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is KeyError:
        del target[int(last) if last.isdigit() else last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return body


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (_broken("choices", None), "has no choice 0"),
        (_broken("choices", []), "has no choice 0"),
        (_broken("choices", {"index": 0}), "choices is not an array"),
        (_broken("choices.0", "x"), "choices[0] is not an object"),
        (_broken("choices.0.message", KeyError), "choices[0].message is missing"),
        (_broken("choices.0.message", []), "choices[0].message is not an object"),
        (_broken("choices.0.message.content", 5), "choices[0].message.content is not a string"),
        (_broken("choices.0.message.tool_calls", {}), "tool_calls is not an array"),
        (_broken("choices.0.message.tool_calls.0.function", KeyError), "tool_calls[0].function is missing"),
        (_broken("choices.0.message.tool_calls.0.function.name", None), "lacks an id or a function name"),
        (_broken("choices.0.message.tool_calls.0.function.arguments", {}), "arguments is not a string"),
        (_broken("choices.0.finish_reason", 1), "finish_reason is not a string"),
        (_broken("usage", "many"), "body.usage is not an object"),
        (_broken("usage.total_tokens", -1), "total_tokens is not a non-negative integer"),
        (_broken("usage.total_tokens", True), "total_tokens is not a non-negative integer"),
        (_broken("usage.prompt_tokens", KeyError), "prompt_tokens is missing"),
        (_broken("model", 3), "body.model is not a string"),
    ],
)
def test_malformed_completions_are_refused(body: dict[str, Any], where: str) -> None:
    with pytest.raises(LLMProtocolError) as caught:
        parse_completion(body)
    assert where in str(caught.value)
    assert "SECRET-CONTENT" not in str(caught.value)


@pytest.mark.parametrize("data", [b"", b"{", b"[1]", b'"text"', b"null", b"\xff", b"[" * 100_000])
def test_loads_json_object_refuses_non_objects(data: bytes) -> None:
    with pytest.raises(LLMProtocolError):
        loads_json_object(data, "response body")


def test_parse_chunk_content_and_tool_call_deltas() -> None:
    chunk = parse_chunk(
        {
            "id": "c",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "role": "assistant",
                        "content": "Hi",
                        "tool_calls": [{"index": 1, "id": "t", "function": {"name": "f", "arguments": "{"}}],
                    },
                    "finish_reason": None,
                }
            ],
        }
    )
    assert (chunk.role, chunk.content, chunk.finish_reason, chunk.usage) == ("assistant", "Hi", None, None)
    assert chunk.tool_calls == (ToolCallDelta(index=1, id="t", name="f", arguments="{"),)


def test_parse_usage_chunk_without_choices() -> None:
    chunk = parse_chunk(
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    )
    assert chunk.content is None
    assert chunk.usage == Usage(1, 1, 2)


@pytest.mark.parametrize(
    "body",
    [
        {"choices": "x"},
        {"choices": [{"index": 0, "delta": []}]},
        {"choices": [{"index": 0, "delta": {"content": 1}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": {}}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"function": {}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 2}}]}}]},
    ],
)
def test_malformed_chunks_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(LLMProtocolError):
        parse_chunk(body)


def test_error_event_in_a_stream() -> None:
    with pytest.raises(LLMStreamError) as caught:
        parse_chunk({"error": {"message": "SECRET upstream text", "type": "server_error", "code": "overloaded"}})
    error = caught.value
    assert (error.error_type, error.error_code, error.retryable) == ("server_error", "overloaded", True)
    assert error.server_message == "SECRET upstream text"
    assert "SECRET" not in str(error)


def test_parse_models() -> None:
    models = parse_models({"object": "list", "data": [{"id": "a", "owned_by": "me"}, {"id": "b"}]})
    assert [(model.id, model.owned_by) for model in models] == [("a", "me"), ("b", None)]
    for bad in ({}, {"data": {}}, {"data": [{"owned_by": "x"}]}, {"data": ["a"]}):
        with pytest.raises(LLMProtocolError):
            parse_models(bad)

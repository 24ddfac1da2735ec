"""The final-request guard as a pure function: every field's rule, nested shapes, paths, and each shape's
outgoing allowlist."""

from __future__ import annotations

from typing import Any

import pytest

from clawstack.models.policy import DEFAULT_POLICY, PERMISSIVE
from clawstack.proxy.errors import RequestError
from clawstack.proxy.plan.chatgpt import shape_plan_request
from clawstack.proxy.request_guard import (
    CHAT_FIELDS,
    OUTGOING_FIELDS,
    REFUSED_FIELDS,
    check_outgoing,
    field_path,
    guard_chat_request,
)
from clawstack.proxy.responses_api import RESPONSES_FIELDS, chat_to_responses

BASE: dict[str, Any] = {"model": "primary", "messages": [{"role": "user", "content": "hi"}]}
FUNCTION = {"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {"type": "object"}}}
DATA_URL = "data:image/png;base64,iVBORw0KGgo="


def refusal(body: dict[str, Any], policy: Any = DEFAULT_POLICY) -> tuple[str, str | None]:
    with pytest.raises(RequestError) as info:
        guard_chat_request(body, policy)
    assert info.value.status == 400
    return info.value.code, info.value.param


# Every field the worker may send, with a value that is forwarded as it is.
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
    "provider": {"only": ["a/b"]},
    "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
    "safety_identifier": "s-1",
    "seed": 7,
    "stop": ["\n\n"],
    "store": False,
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.2,
    "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    "tools": [FUNCTION, {"type": "custom", "custom": {"name": "grep", "format": {"type": "text"}}}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "user": "u-1",
    "verbosity": "low",
}


def test_the_tables_cover_every_documented_chat_field_once() -> None:
    documented = {
        "model", "messages", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
        "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format", "safety_identifier", "seed",
        "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
        "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
    }  # fmt: skip
    ruled = {*CHAT_FIELDS, *REFUSED_FIELDS, "reasoning_effort"}
    assert documented <= ruled
    assert set(CHAT_FIELDS).isdisjoint(REFUSED_FIELDS)
    assert set(FORWARDED) | {"model", "messages", "metadata"} == set(CHAT_FIELDS)


@pytest.mark.parametrize(("field", "value"), sorted(FORWARDED.items()))
def test_an_allowlisted_field_is_forwarded_as_sent(field: str, value: Any) -> None:
    assert guard_chat_request({**BASE, field: value}, DEFAULT_POLICY) == {**BASE, field: value}


@pytest.mark.parametrize("field", sorted(REFUSED_FIELDS))
def test_a_known_field_refused_on_purpose_names_itself(field: str) -> None:
    assert refusal({**BASE, field: {"x": 1}}) == ("request_field_refused", field)
    assert guard_chat_request({**BASE, field: None}, DEFAULT_POLICY) == BASE  # null asks for nothing


def test_reasoning_effort_is_dropped_and_null_fields_pass() -> None:
    assert guard_chat_request({**BASE, "reasoning_effort": "high"}, DEFAULT_POLICY) == BASE
    assert guard_chat_request({**BASE, "tools": None}, DEFAULT_POLICY) == {**BASE, "tools": None}


def test_retention_fields_follow_the_data_policy() -> None:
    assert refusal({**BASE, "store": True}) == ("data_policy_violation", "store")
    assert refusal({**BASE, "metadata": {"run": "r"}}) == ("data_policy_violation", "metadata")
    assert guard_chat_request({**BASE, "store": True, "metadata": {"run": "r"}}, PERMISSIVE)["metadata"] == {"run": "r"}
    assert refusal({**BASE, "metadata": {"run": 1}}, PERMISSIVE) == ("invalid_request", "metadata.run")


def user(*parts: Any) -> dict[str, Any]:
    return {**BASE, "messages": [{"role": "user", "content": list(parts)}]}


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({**BASE, "search_parameters": {"mode": "on"}}, "request_field_refused", "search_parameters"),
        ({**BASE, "tools": [{**FUNCTION, "google_search": {}}]}, "request_field_refused", "tools[0].google_search"),
        (
            {**BASE, "tools": [{"type": "function", "function": {"name": "f", "cache_control": {}}}]},
            "request_field_refused",
            "tools[0].function.cache_control",
        ),
        ({**BASE, "tools": [FUNCTION, {"type": "web_search"}]}, "hosted_tool_refused", "tools[1].type"),
        ({**BASE, "tools": [{"function": {"name": "untyped"}}]}, "hosted_tool_refused", "tools[0].type"),
        ({**BASE, "tools": [{"type": "function"}]}, "invalid_request", "tools[0].function"),
        ({**BASE, "tools": {"type": "function"}}, "invalid_request", "tools"),
        ({**BASE, "tool_choice": {"type": "allowed_tools"}}, "request_field_refused", "tool_choice.type"),
        ({**BASE, "tool_choice": "any"}, "invalid_request", "tool_choice"),
        ({**BASE, "response_format": {"type": "json_object", "x": 1}}, "request_field_refused", "response_format.x"),
        ({**BASE, "stream_options": {"include_usage": True, "x": 1}}, "request_field_refused", "stream_options.x"),
        ({**BASE, "provider": {"sort": "price"}}, "request_field_refused", "provider.sort"),
        ({**BASE, "modalities": ["text", "audio"]}, "request_field_refused", "modalities[1]"),
        ({**BASE, "logit_bias": {"token": 1}}, "invalid_request", "logit_bias.token"),
        ({**BASE, "temperature": {"google": {}}}, "invalid_request", "temperature"),
        ({**BASE, "stream": "yes"}, "invalid_request", "stream"),
        ({**BASE, "messages": []}, "invalid_request", "messages"),
        ({"messages": BASE["messages"]}, "invalid_request", "model"),
        ({**BASE, "messages": [{"role": "function", "content": "x"}]}, "request_field_refused", "messages[0].role"),
        (
            {**BASE, "messages": [{"role": "user", "content": "x", "cache_control": {}}]},
            "request_field_refused",
            "messages[0].cache_control",
        ),
        (
            {**BASE, "messages": [{"role": "assistant", "content": "x", "reasoning_details": [{"type": "x"}]}]},
            "request_field_refused",
            "messages[0].reasoning_details",
        ),
        (
            {**BASE, "messages": [{"role": "tool", "tool_call_id": "c", "content": "x", "cache_control": {}}]},
            "request_field_refused",
            "messages[0].cache_control",
        ),
        (
            {**BASE, "messages": [{"role": "assistant", "content": "x", "audio": {"id": "audio_1"}}]},
            "request_field_refused",
            "messages[0].audio",
        ),
        ({**BASE, "messages": [{"role": "tool", "content": "x"}]}, "invalid_request", "messages[0].tool_call_id"),
        (user({"type": "video_url", "video_url": {}}), "request_field_refused", "messages[0].content[0].type"),
        (
            user({"type": "image_url", "image_url": {"url": "https://attacker.example/?q=secret"}}),
            "request_field_refused",
            "messages[0].content[0].image_url.url",
        ),
        (
            user({"type": "file", "file": {"file_id": "file-abc"}}),
            "request_field_refused",
            "messages[0].content[0].file.file_id",
        ),
        (
            user({"type": "file", "file": {"file_data": "https://attacker.example/doc.pdf"}}),
            "request_field_refused",
            "messages[0].content[0].file.file_data",
        ),
        (
            user({"type": "text", "text": "x", "cache_control": {}}),
            "request_field_refused",
            "messages[0].content[0].cache_control",
        ),
    ],
)
def test_nested_fields_outside_the_allowlist_are_refused_by_path(body: dict[str, Any], code: str, param: str) -> None:
    assert refusal(body) == (code, param)


def test_documented_message_and_part_shapes_pass() -> None:
    messages = [
        {"role": "system", "content": "s", "name": "sys"},
        {"role": "developer", "content": [{"type": "text", "text": "d"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": DATA_URL, "detail": "low"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "reasoning_content": "look it up first",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}},
                {"id": "c2", "type": "custom", "custom": {"name": "grep", "input": "x"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "tool", "tool_call_id": "c2", "name": "grep", "content": "x:1"},  # as Hermes sends it
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
    ]
    assert guard_chat_request({**BASE, "messages": messages}, DEFAULT_POLICY)["messages"] == messages


def test_an_echoed_answer_loses_only_what_asks_for_nothing() -> None:
    echoed: dict[str, Any] = {
        "role": "assistant",
        "content": "hi",
        "annotations": [],
        "audio": None,
        "function_call": None,
    }
    guarded = guard_chat_request({**BASE, "messages": [echoed]}, DEFAULT_POLICY)
    assert guarded["messages"] == [{"role": "assistant", "content": "hi"}]


def test_a_refusal_names_the_path_never_the_value() -> None:
    secret = "sk-live-" + "s" * 30
    for body in (
        {**BASE, "search_parameters": {"query": secret}},
        {**BASE, "temperature": secret},
        user({"type": "image_url", "image_url": {"url": "https://x.example/" + secret}}),
        user({"type": "file", "file": {"file_id": secret}}),
    ):
        with pytest.raises(RequestError) as info:
            guard_chat_request(body, DEFAULT_POLICY)
        assert secret not in info.value.message
        assert info.value.param is None or secret not in info.value.param


def test_field_paths() -> None:
    assert field_path("", "tools") == "tools"
    assert field_path("tools[0]", "google_search") == "tools[0].google_search"
    assert field_path("x", "a b") == 'x["a b"]'
    assert field_path("", "é" * 100) == "[" + '"' + "\\u00e9" * 64 + '"' + "]"


def test_every_shape_carries_only_its_allowlisted_fields() -> None:
    body = guard_chat_request({**BASE, **FORWARDED, "model": "m"}, DEFAULT_POLICY)
    body.pop("provider")  # consumed for openrouter/ routes only
    check_outgoing("chat", {**body, "reasoning_effort": "low"})
    responses = chat_to_responses(body)
    assert set(responses) <= RESPONSES_FIELDS
    check_outgoing("responses", responses)
    plan = shape_plan_request(responses)
    check_outgoing("plan", plan)
    assert OUTGOING_FIELDS["plan"] < OUTGOING_FIELDS["responses"]


@pytest.mark.parametrize(
    ("shape", "payload", "param"),
    [
        ("chat", {"model": "m", "search_parameters": {}}, "search_parameters"),
        ("chat", {"model": "m", "service_tier": "priority"}, "service_tier"),
        ("responses", {"model": "m", "messages": []}, "messages"),
        ("responses", {"model": "m", "background": True}, "background"),
        ("plan", {"model": "m", "temperature": 0.1}, "temperature"),
    ],
)
def test_a_built_body_outside_its_shape_is_never_sent(shape: Any, payload: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as info:
        check_outgoing(shape, payload)
    assert (info.value.code, info.value.param) == ("request_field_refused", param)

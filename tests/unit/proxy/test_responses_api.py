"""Chat Completions <-> Responses API translation: requests, finished replies, event streams, upstream refusals.

The Responses shapes here follow OpenAI's API reference (request ``input`` items, the ``response`` object and the
streaming events ``response.created`` ... ``response.completed``); the chat shapes follow Chat Completions.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.proxy import responses_api
from clawstack.proxy.responses_api import (
    ResponsesStreamTranslator,
    chat_to_responses,
    rejected_sampling_parameter,
    rejects_max_tokens,
    responses_to_chat,
)

SECRET = "SECRET-7f3a"  # content that must never appear in an error message

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_public_names() -> None:
    assert sorted(responses_api.__all__) == [
        "RESPONSES_FIELDS",
        "ResponsesStreamTranslator",
        "chat_to_responses",
        "rejected_sampling_parameter",
        "rejects_max_tokens",
        "responses_to_chat",
    ]


# ---------------------------------------------------------------------------------------------------- requests


def test_full_conversation_with_tool_calls_and_results() -> None:
    body = {
        "model": "gpt-5-codex",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "Checking both.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": [{"type": "text", "text": "2"}, {"type": "text", "text": "4C"}],
            },
            {"role": "system", "content": "Answer in French."},
            {"role": "assistant", "content": None, "tool_calls": []},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Weather now",
                    "parameters": WEATHER_PARAMS,
                    "strict": True,
                },
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "run-1",
        "metadata": {"run": "r1"},
    }
    assert chat_to_responses(body) == {
        "model": "gpt-5-codex",
        "instructions": "You are terse.\n\nUse tools.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking both."}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "function_call_output", "call_id": "call_2", "output": "24C"},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Answer in French."}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "weather",
                "description": "Weather now",
                "parameters": WEATHER_PARAMS,
                "strict": True,
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "stream": True,
        "temperature": 0.2,
        "top_p": 0.9,
        "user": "run-1",
        "metadata": {"run": "r1"},
        "store": False,
    }


def test_no_system_message_means_no_instructions() -> None:
    out = chat_to_responses({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert "instructions" not in out
    assert out["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def test_openrouter_controls_pass() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "provider": {"zdr": True}}
    assert chat_to_responses(body)["provider"] == {"zdr": True}


def test_store_defaults_to_false_and_an_explicit_value_passes() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert chat_to_responses({"model": "m", "messages": messages})["store"] is False
    assert chat_to_responses({"model": "m", "messages": messages, "store": True})["store"] is True


def test_function_tool_without_strict_or_parameters_keeps_chat_meaning() -> None:
    """Chat functions are non-strict by default and may omit parameters (an empty parameter list)."""
    out = chat_to_responses(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "now"}}],
        }
    )
    assert out["tools"] == [
        {"type": "function", "name": "now", "parameters": {"type": "object", "properties": {}}, "strict": False}
    ]


def test_custom_tools_calls_and_results() -> None:
    grammar = {"type": "grammar", "grammar": {"definition": "start: WORD", "syntax": "lark"}}
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "patch it"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "call_p", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_p", "content": "done"},
        ],
        "tools": [
            {"type": "custom", "custom": {"name": "apply_patch", "description": "Patch files", "format": grammar}},
            {"type": "custom", "custom": {"name": "note", "format": {"type": "text"}}},
            {"type": "custom", "custom": {"name": "plain"}},
        ],
        "tool_choice": {"type": "custom", "custom": {"name": "apply_patch"}},
    }
    out = chat_to_responses(body)
    assert out["input"][1:] == [
        {"type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch", "input": "*** Begin"},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "done"},
    ]
    assert out["tools"] == [
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Patch files",
            "format": {"type": "grammar", "definition": "start: WORD", "syntax": "lark"},
        },
        {"type": "custom", "name": "note", "format": {"type": "text"}},
        {"type": "custom", "name": "plain"},
    ]
    assert out["tool_choice"] == {"type": "custom", "name": "apply_patch"}


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_choice_strings_pass(choice: str) -> None:
    out = chat_to_responses({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": choice})
    assert out["tool_choice"] == choice


def test_named_function_tool_choice_is_flattened() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    out = chat_to_responses({**body, "tool_choice": {"type": "function", "function": {"name": "weather"}}})
    assert out["tool_choice"] == {"type": "function", "name": "weather"}


def test_user_images_and_text_parts() -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]
    out = chat_to_responses({"model": "m", "messages": [{"role": "user", "content": content}]})
    assert out["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
            ],
        }
    ]


def test_user_file_part() -> None:
    part = {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,AA"}}
    out = chat_to_responses({"model": "m", "messages": [{"role": "user", "content": [part]}]})
    assert out["input"][0]["content"] == [
        {"type": "input_file", "file_data": "data:application/pdf;base64,AA", "filename": "a.pdf"}
    ]


def test_assistant_refusal_is_kept() -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "refusal": "I can't."}]
    out = chat_to_responses({"model": "m", "messages": messages})
    assert out["input"][1] == {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "I can't."}],
    }


@pytest.mark.parametrize(
    ("response_format", "text_format"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "answer", "schema": WEATHER_PARAMS, "strict": True}},
            {"type": "json_schema", "name": "answer", "schema": WEATHER_PARAMS, "strict": True},
        ),
        ({"type": "json_object"}, {"type": "json_object"}),
        ({"type": "text"}, {"type": "text"}),
    ],
)
def test_response_format_becomes_text_format(response_format: dict[str, Any], text_format: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": response_format}
    assert chat_to_responses(body)["text"] == {"format": text_format}


def test_reasoning_effort_and_token_limits() -> None:
    base = {"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]}
    out = chat_to_responses({**base, "reasoning_effort": "high", "max_tokens": 300})
    assert out["reasoning"] == {"effort": "high"}
    assert out["max_output_tokens"] == 300
    assert "max_tokens" not in out
    assert "reasoning_effort" not in out
    out = chat_to_responses({**base, "max_completion_tokens": 500, "max_tokens": 300})
    assert out["max_output_tokens"] == 500
    assert "max_completion_tokens" not in out
    assert "reasoning" not in chat_to_responses(base)


def test_fields_without_a_responses_counterpart_are_dropped() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "stop": ["\n"],
        "n": 1,
        "stream_options": {"include_usage": True},
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 3,
        "logit_bias": {"1": 2},
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
    }
    assert set(chat_to_responses(body)) == {"model", "input", "store"}


MALFORMED: list[tuple[Any, str]] = [
    ([], "request body"),
    ({"messages": [{"role": "user", "content": SECRET}]}, "model"),
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": SECRET}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [SECRET]}, "messages[0]"),
    ({"model": "m", "messages": [{"content": SECRET}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": SECRET, "content": SECRET}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "function", "content": SECRET}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio", "x": SECRET}]}]},
        "messages[0].content[0]",
    ),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
        "messages[0].content[0].text",
    ),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0].image_url.url",
    ),
    (
        {
            "model": "m",
            "messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": SECRET}}]}],
        },
        "messages[0].content[0]",
    ),
    ({"model": "m", "messages": [{"role": "assistant", "content": {"t": SECRET}}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "assistant", "tool_calls": SECRET}]}, "messages[0].tool_calls"),
    (
        {
            "model": "m",
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
                }
            ],
        },
        "messages[0].tool_calls[0].id",
    ),
    (
        {
            "model": "m",
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": SECRET}}}
                    ],
                }
            ],
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}]},
        "messages[0].tool_calls[0].function",
    ),
    (
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": [SECRET]}]}]},
        "messages[0].tool_calls[0].type",
    ),
    ({"model": "m", "messages": [{"role": "tool", "content": SECRET}]}, "messages[0].tool_call_id"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": {"a": SECRET}}, "tools"),
    (
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]},
        "tools[0].type",
    ),
    (
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"description": SECRET}}],
        },
        "tools[0].function.name",
    ),
    (
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}],
        },
        "tools[0].function.strict",
    ),
    (
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "custom", "custom": {"name": "p", "format": {"type": "grammar"}}}],
        },
        "tools[0].custom.format.grammar",
    ),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": SECRET}, "tool_choice"),
    (
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function"}},
        "tool_choice.function",
    ),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": True}, "n"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "100"}, "max_tokens"),
    (
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
        "max_completion_tokens",
    ),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": 3}, "reasoning_effort"),
    (
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": SECRET}},
        "response_format",
    ),
    (
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": {}}},
        },
        "response_format.json_schema.name",
    ),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "functions": [{"name": SECRET}]}, "functions"),
]


@pytest.mark.parametrize(("body", "field"), MALFORMED)
def test_malformed_request_names_the_field_and_never_its_content(body: Any, field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)) as caught:
        chat_to_responses(body)
    assert SECRET not in str(caught.value)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "text", "user", "tool", "function", SECRET]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "role",
                    "content",
                    "text",
                    "id",
                    "name",
                    "function",
                    "custom",
                    "arguments",
                    "input",
                    "tool_calls",
                    "tool_call_id",
                    "image_url",
                    "url",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=100, deadline=None)
@given(
    messages=_json,
    tools=_json,
    extra=st.dictionaries(st.sampled_from(["tool_choice", "response_format", "n", "max_tokens"]), _json),
)
def test_arbitrary_requests_convert_or_raise_value_error_without_content(messages: Any, tools: Any, extra: Any) -> None:
    body = {"model": "m", "messages": messages, "tools": tools, **extra}
    try:
        out = chat_to_responses(body)
    except ValueError as exc:
        refusal = str(exc)
    else:
        assert out["store"] is False
        assert isinstance(out["input"], list)
        return
    assert SECRET not in refusal


# ------------------------------------------------------------------------------------------ finished replies

COMPLETED = {
    "id": "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b",
    "object": "response",
    "created_at": 1741476542,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "model": "gpt-5-2025-08-07",
    "output": [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "In a peaceful grove, ", "annotations": []},
                {"type": "output_text", "text": "a unicorn slept.", "annotations": []},
            ],
        },
    ],
    "usage": {
        "input_tokens": 36,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 87,
        "output_tokens_details": {"reasoning_tokens": 20},
        "total_tokens": 123,
    },
}


def test_completed_text_reply() -> None:
    assert responses_to_chat(COMPLETED, model="worker-model") == {
        "id": COMPLETED["id"],
        "object": "chat.completion",
        "created": 1741476542,
        "model": "worker-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "In a peaceful grove, a unicorn slept.", "refusal": None},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 36,
            "completion_tokens": 87,
            "total_tokens": 123,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 20},
        },
    }


def test_completed_reply_with_function_and_custom_calls() -> None:
    data = {
        **COMPLETED,
        "output": [
            {"id": "rs_1", "type": "reasoning", "summary": []},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_A",
                "name": "weather",
                "arguments": '{"city":"Paris"}',
                "status": "completed",
            },
            {
                "type": "function_call",
                "id": "fc_2",
                "call_id": "call_B",
                "name": "weather",
                "arguments": '{"city":"Rome"}',
                "status": "completed",
            },
            {
                "type": "custom_tool_call",
                "id": "ctc_1",
                "call_id": "call_C",
                "name": "apply_patch",
                "input": "*** Begin",
            },
        ],
    }
    choice = responses_to_chat(data, model="m")["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [
        {"id": "call_A", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
        {"id": "call_B", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Rome"}'}},
        {"id": "call_C", "type": "custom", "custom": {"name": "apply_patch", "input": "*** Begin"}},
    ]


@pytest.mark.parametrize(
    ("reason", "finish"), [("max_output_tokens", "length"), ("content_filter", "content_filter"), (None, "stop")]
)
def test_incomplete_reply(reason: str | None, finish: str) -> None:
    data = {**COMPLETED, "status": "incomplete", "incomplete_details": {"reason": reason} if reason else None}
    out = responses_to_chat(data, model="m")
    assert out["choices"][0]["finish_reason"] == finish
    assert out["choices"][0]["message"]["content"] == "In a peaceful grove, a unicorn slept."


def test_incomplete_with_a_cut_call_says_length() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": '{"a": '}
    data = {
        **COMPLETED,
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [call],
    }
    assert responses_to_chat(data, model="m")["choices"][0]["finish_reason"] == "length"


def test_refusal_reply() -> None:
    message = {
        "type": "message",
        "id": "m",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "refusal", "refusal": "No."}],
    }
    out = responses_to_chat({**COMPLETED, "output": [message]}, model="m")
    assert out["choices"][0]["message"] == {"role": "assistant", "content": None, "refusal": "No."}


@pytest.mark.parametrize("status", ["failed", "in_progress", "queued", "cancelled", None, "done"])
def test_unfinished_reply_raises(status: str | None) -> None:
    data = {**COMPLETED, "status": status}
    with pytest.raises(ValueError, match="did not finish"):
        responses_to_chat(data, model="m")


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"object": "chat.completion", "choices": []},
        {**COMPLETED, "output": None},
        {**COMPLETED, "output": [{"type": "message", "content": "x"}]},
        {**COMPLETED, "output": [{"type": "function_call", "call_id": "c", "name": "f"}]},
        {**COMPLETED, "output": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
    ],
)
def test_not_a_responses_object_raises(data: Any) -> None:
    with pytest.raises(ValueError, match=r"upstream|output"):
        responses_to_chat(data, model="m")


# --------------------------------------------------------------------------------------------------- streams

CREATED_AT = 1741290958


def _response(status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": CREATED_AT,
        "status": status,
        "model": "gpt-5",
        "output": output,
        **extra,
    }


FC1 = {"id": "fc_1", "type": "function_call", "call_id": "call_A", "name": "weather", "arguments": ""}
FC2 = {"id": "fc_2", "type": "function_call", "call_id": "call_B", "name": "weather", "arguments": ""}
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
USAGE = {
    "input_tokens": 50,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 40,
    "output_tokens_details": {"reasoning_tokens": 12},
    "total_tokens": 90,
}
FINAL_OUTPUT = [
    {"id": "rs_1", "type": "reasoning", "summary": []},
    {
        **MESSAGE,
        "status": "completed",
        "content": [{"type": "output_text", "text": "Checking the weather.", "annotations": []}],
    },
    {**FC1, "arguments": '{"city":"Paris"}', "status": "completed"},
    {**FC2, "arguments": '{"city":"Rome"}', "status": "completed"},
]

EVENTS: list[dict[str, Any]] = [
    {"type": "response.created", "response": _response("in_progress", [])},
    {"type": "response.in_progress", "response": _response("in_progress", [])},
    {
        "type": "response.output_item.added",
        "output_index": 0,
        "item": {"id": "rs_1", "type": "reasoning", "summary": []},
    },
    {
        "type": "response.reasoning_summary_part.added",
        "item_id": "rs_1",
        "output_index": 0,
        "summary_index": 0,
        "part": {"type": "summary_text", "text": ""},
    },
    {
        "type": "response.reasoning_summary_text.delta",
        "item_id": "rs_1",
        "output_index": 0,
        "summary_index": 0,
        "delta": "Two cities",
    },
    {
        "type": "response.output_item.done",
        "output_index": 0,
        "item": {"id": "rs_1", "type": "reasoning", "summary": []},
    },
    {"type": "response.output_item.added", "output_index": 1, "item": MESSAGE},
    {
        "type": "response.content_part.added",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": []},
    },
    {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "Checking ",
        "logprobs": [],
    },
    {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "the weather — ",
        "logprobs": [],
    },
    {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "delta": "☀.",
        "logprobs": [],
    },
    {
        "type": "response.output_text.done",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "text": "Checking the weather — ☀.",
        "logprobs": [],
    },
    {
        "type": "response.content_part.done",
        "item_id": "msg_1",
        "output_index": 1,
        "content_index": 0,
        "part": {"type": "output_text", "text": "Checking the weather — ☀.", "annotations": []},
    },
    {"type": "response.output_item.done", "output_index": 1, "item": FINAL_OUTPUT[1]},
    {"type": "response.output_item.added", "output_index": 2, "item": FC1},
    {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": '{"city":'},
    {"type": "response.output_item.added", "output_index": 3, "item": FC2},
    {
        "type": "response.function_call_arguments.delta",
        "item_id": "fc_2",
        "output_index": 3,
        "delta": '{"city":"Rome"}',
    },
    {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 2, "delta": '"Paris"}'},
    {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_1",
        "output_index": 2,
        "arguments": '{"city":"Paris"}',
    },
    {"type": "response.output_item.done", "output_index": 2, "item": FINAL_OUTPUT[2]},
    {
        "type": "response.function_call_arguments.done",
        "item_id": "fc_2",
        "output_index": 3,
        "arguments": '{"city":"Rome"}',
    },
    {"type": "response.output_item.done", "output_index": 3, "item": FINAL_OUTPUT[3]},
    {"type": "response.completed", "response": _response("completed", FINAL_OUTPUT, usage=USAGE)},
]


def _sse(events: list[dict[str, Any]]) -> bytes:
    """The wire form OpenAI uses: an ``event:`` line naming the type, one ``data:`` line, a blank line."""
    out = bytearray()
    for seq, event in enumerate(events):
        out += f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': seq})}\n\n".encode()
    return bytes(out)


def _chunks(raw: bytes) -> list[Any]:
    """Each ``data:`` payload of the translated stream: a decoded chunk, or the string ``[DONE]``."""
    assert raw.endswith(b"\n\n") or not raw
    out: list[Any] = []
    for block in raw.decode().split("\n\n")[:-1]:
        assert block.startswith("data: ")
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _feed_all(translator: ResponsesStreamTranslator, raw: bytes, cuts: list[int]) -> bytes:
    out = bytearray()
    start = 0
    for cut in [*sorted(cuts), len(raw)]:
        out += translator.feed(raw[start:cut])
        start = cut
    return bytes(out)


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": CREATED_AT,
        "model": "worker-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


EXPECTED_CHUNKS: list[Any] = [
    _chunk({"role": "assistant"}),
    _chunk({"content": "Checking "}),
    _chunk({"content": "the weather — "}),
    _chunk({"content": "☀."}),
    _chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "call_A", "type": "function", "function": {"name": "weather", "arguments": ""}}
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
    _chunk(
        {
            "tool_calls": [
                {"index": 1, "id": "call_B", "type": "function", "function": {"name": "weather", "arguments": ""}}
            ]
        }
    ),
    _chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"city":"Rome"}'}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _chunk({}, "tool_calls"),
    {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": CREATED_AT,
        "model": "worker-model",
        "choices": [],
        "usage": {
            "prompt_tokens": 50,
            "completion_tokens": 40,
            "total_tokens": 90,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 12},
        },
    },
    "[DONE]",
]


def test_recorded_stream_translates_to_chat_chunks() -> None:
    translator = ResponsesStreamTranslator(model="worker-model", chunk_id="chatcmpl-1")
    out = translator.feed(_sse(EVENTS))
    assert _chunks(out) == EXPECTED_CHUNKS
    assert translator.completed
    assert translator.failure is None


@pytest.mark.parametrize("seed", range(25))
def test_any_split_gives_the_same_chunks(seed: int) -> None:
    raw = _sse(EVENTS)
    rng = random.Random(seed)
    cuts = rng.sample(range(1, len(raw)), rng.randint(1, 60))
    translator = ResponsesStreamTranslator(model="worker-model", chunk_id="chatcmpl-1")
    assert _chunks(_feed_all(translator, raw, cuts)) == EXPECTED_CHUNKS


def test_byte_by_byte_gives_the_same_chunks() -> None:
    raw = _sse(EVENTS)
    translator = ResponsesStreamTranslator(model="worker-model", chunk_id="chatcmpl-1")
    assert _chunks(_feed_all(translator, raw, list(range(1, len(raw))))) == EXPECTED_CHUNKS


def test_crlf_lines_and_multi_line_data_give_the_same_chunks() -> None:
    out = bytearray()
    for event in EVENTS:  # no event: line, the JSON spread over several data: lines, \r\n endings
        lines = json.dumps(event, indent=1).split("\n")
        out += ("".join(f"data: {line}\r\n" for line in lines) + "\r\n").encode()
    translator = ResponsesStreamTranslator(model="worker-model", chunk_id="chatcmpl-1")
    assert _chunks(translator.feed(bytes(out))) == EXPECTED_CHUNKS


def test_reassembled_chunks_give_the_text_and_arguments() -> None:
    translator = ResponsesStreamTranslator(model="worker-model")
    chunks = _chunks(translator.feed(_sse(EVENTS)))
    text = ""
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                entry = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                entry["id"] += call.get("id") or ""
                entry["name"] += call["function"].get("name") or ""
                entry["arguments"] += call["function"].get("arguments") or ""
    assert text == "Checking the weather — ☀."
    assert calls == {
        0: {"id": "call_A", "name": "weather", "arguments": '{"city":"Paris"}'},
        1: {"id": "call_B", "name": "weather", "arguments": '{"city":"Rome"}'},
    }
    assert chunks[-1] == "[DONE]"
    assert {chunk["id"] for chunk in chunks[:-1]} == {"resp_1"}  # without a chunk_id, the upstream response id


def test_done_only_after_completed() -> None:
    raw = _sse(EVENTS)
    completed_at = raw.index(b"event: response.completed")
    translator = ResponsesStreamTranslator(model="worker-model")
    before = translator.feed(raw[:completed_at])
    assert b"[DONE]" not in before
    assert b'finish_reason":"' not in before
    assert not translator.completed
    after = translator.feed(raw[completed_at:])
    assert after.endswith(b"data: [DONE]\n\n")
    assert translator.completed
    assert translator.feed(_sse(EVENTS[-1:])) == b""  # nothing after the end


def test_failed_stream_sets_failure_and_emits_no_done() -> None:
    failed = _response("failed", [], error={"code": "server_error", "message": "The model failed."})
    events = [*EVENTS[:10], {"type": "response.failed", "response": failed}]
    translator = ResponsesStreamTranslator(model="m")
    out = translator.feed(_sse(events))
    assert translator.failure == "server_error"
    assert not translator.completed
    assert b"[DONE]" not in out
    assert _chunks(out)[-1]["choices"][0]["delta"] == {"content": "the weather — "}
    assert translator.feed(_sse(EVENTS[-1:])) == b""
    assert not translator.completed


@pytest.mark.parametrize(
    ("event", "failure"),
    [
        (
            {"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": None},
            "rate_limit_exceeded",
        ),
        (
            {"type": "error", "error": {"type": "invalid_request_error", "code": None, "message": "bad"}},
            "invalid_request_error",
        ),
        ({"type": "error", "code": "bad code\n<script>" + "x" * 100, "message": "m"}, "badcodescript" + "x" * 51),
        ({"type": "error", "message": "no code"}, "upstream_error"),
        ({"type": "response.failed", "response": _response("failed", [], error=None)}, "upstream_error"),
    ],
)
def test_error_event_failure_code_is_safe(event: dict[str, Any], failure: str) -> None:
    translator = ResponsesStreamTranslator(model="m")
    out = translator.feed(_sse([EVENTS[0], event, *EVENTS[1:]]))
    assert translator.failure == failure
    assert len(failure) <= 64
    assert _chunks(out) == [
        {
            "id": "resp_1",
            "object": "chat.completion.chunk",
            "created": CREATED_AT,
            "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}],
        }
    ]


@pytest.mark.parametrize(("reason", "finish"), [("max_output_tokens", "length"), ("content_filter", "content_filter")])
def test_incomplete_stream_finishes_with_its_reason(reason: str, finish: str) -> None:
    incomplete = _response("incomplete", [], incomplete_details={"reason": reason}, usage=USAGE)
    events = [*EVENTS[:10], {"type": "response.incomplete", "response": incomplete}]
    translator = ResponsesStreamTranslator(model="m")
    chunks = _chunks(translator.feed(_sse(events)))
    assert translator.completed
    assert chunks[-3]["choices"] == [{"index": 0, "delta": {}, "finish_reason": finish}]
    assert chunks[-2]["choices"] == []
    assert chunks[-2]["usage"]["total_tokens"] == 90
    assert chunks[-1] == "[DONE]"


def test_text_only_stream_finishes_with_stop() -> None:
    done = _response("completed", FINAL_OUTPUT[:2], usage=USAGE)
    translator = ResponsesStreamTranslator(model="m")
    chunks = _chunks(translator.feed(_sse([*EVENTS[:14], {"type": "response.completed", "response": done}])))
    assert chunks[-3]["choices"][0]["finish_reason"] == "stop"


def test_custom_tool_call_stream() -> None:
    item = {"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_P", "name": "apply_patch", "input": ""}
    events = [
        EVENTS[0],
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1", "output_index": 0, "delta": "*** Begin"},
        {"type": "response.custom_tool_call_input.delta", "item_id": "ctc_1", "output_index": 0, "delta": " Patch"},
        {
            "type": "response.custom_tool_call_input.done",
            "item_id": "ctc_1",
            "output_index": 0,
            "input": "*** Begin Patch",
        },
        {"type": "response.output_item.done", "output_index": 0, "item": {**item, "input": "*** Begin Patch"}},
        {"type": "response.completed", "response": _response("completed", [{**item, "input": "*** Begin Patch"}])},
    ]
    chunks = _chunks(ResponsesStreamTranslator(model="m").feed(_sse(events)))
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
    assert deltas == [
        {"role": "assistant"},
        {
            "tool_calls": [
                {"index": 0, "id": "call_P", "type": "custom", "custom": {"name": "apply_patch", "input": ""}}
            ]
        },
        {"tool_calls": [{"index": 0, "custom": {"input": "*** Begin"}}]},
        {"tool_calls": [{"index": 0, "custom": {"input": " Patch"}}]},
        {},
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1] == "[DONE]"  # no usage in the response, so no usage chunk


def test_call_without_argument_deltas_gets_its_arguments_from_the_done_item() -> None:
    events = [
        EVENTS[0],
        {"type": "response.output_item.added", "output_index": 0, "item": FC1},
        {"type": "response.output_item.done", "output_index": 0, "item": FINAL_OUTPUT[2]},
        {"type": "response.completed", "response": _response("completed", [FINAL_OUTPUT[2]])},
    ]
    chunks = _chunks(ResponsesStreamTranslator(model="m").feed(_sse(events)))
    assert chunks[2]["choices"][0]["delta"] == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Paris"}'}}]
    }


@pytest.mark.parametrize(
    "raw",
    [
        b"data: {not json\n\n",
        b"data: [1, 2]\n\n",
        b"data: \xff\xfe\n\n",
        _sse([{"type": "response.function_call_arguments.delta", "item_id": "fc_9", "output_index": 0, "delta": "{"}]),
        _sse([{"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "delta": 5}]),
        _sse(
            [{"type": "response.output_item.added", "output_index": 0, "item": {"type": "function_call", "id": "fc"}}]
        ),
    ],
)
def test_malformed_stream_raises_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match=r"Responses|delta|item"):
        ResponsesStreamTranslator(model="m").feed(raw)


@settings(max_examples=40, deadline=None)
@given(
    events=st.lists(
        st.fixed_dictionaries(
            {
                "type": st.sampled_from(
                    [e["type"] for e in EVENTS] + ["error", "response.failed", "response.incomplete"]
                )
            },
            optional={
                "item": _json,
                "item_id": _json,
                "delta": _json,
                "response": _json,
                "error": _json,
                "code": _json,
            },
        ),
        max_size=8,
    )
)
def test_arbitrary_events_translate_or_raise_value_error(events: list[dict[str, Any]]) -> None:
    translator = ResponsesStreamTranslator(model="m")
    try:
        out = translator.feed(_sse(events))
    except ValueError:
        return
    assert b"[DONE]" not in out or translator.completed


# ------------------------------------------------------------------------------------------ upstream refusals


def _error(message: str, param: str | None, code: str | None) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    ).encode()


OPENAI_MAX_TOKENS = _error(
    "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
    "max_tokens",
    "unsupported_parameter",
)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, OPENAI_MAX_TOKENS, True),
        (400, _error("bad", "max_tokens", "unsupported_parameter"), True),
        (400, _error("Unsupported parameter: 'max_tokens' is not supported with this model.", None, None), True),
        (400, _error("max_tokens is too large: 9999999.", "max_tokens", "invalid_value"), False),
        (
            400,
            _error(
                "Unsupported parameter: 'max_completion_tokens' is not supported.",
                "max_completion_tokens",
                "unsupported_parameter",
            ),
            False,
        ),
        (500, OPENAI_MAX_TOKENS, False),
        (400, b"not json", False),
        (400, b"\xff", False),
        (400, b'{"error": "max_tokens unsupported"}', False),
        (400, b"[" * 100_000, False),
    ],
)
def test_rejects_max_tokens(status: int, body: bytes, expected: bool) -> None:
    assert rejects_max_tokens(status, body) is expected


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            400,
            _error(
                "Unsupported value: 'temperature' does not support 0.2 with this model. Only the default (1) value is supported.",
                "temperature",
                "unsupported_value",
            ),
            "temperature",
        ),
        (
            400,
            _error(
                "Unsupported parameter: 'top_p' is not supported with this model.", "top_p", "unsupported_parameter"
            ),
            "top_p",
        ),
        (400, _error("bad", "temperature", "invalid_value"), None),
        (400, _error("bad", "seed", "unsupported_parameter"), None),
        (400, OPENAI_MAX_TOKENS, None),
        (429, _error("x", "temperature", "unsupported_value"), None),
        (400, b"{}", None),
        (400, b"", None),
    ],
)
def test_rejected_sampling_parameter(status: int, body: bytes, expected: str | None) -> None:
    assert rejected_sampling_parameter(status, body) == expected

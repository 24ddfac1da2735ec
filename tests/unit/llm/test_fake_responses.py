"""The fake's answers in OpenAI's shapes: conversation reading, content choice, usage, chunks, error bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.llm.fake import DEFAULT_ANSWER, Behaviour, FakeToolCall
from clawstack.llm.fake.responses import (
    ARGUMENT_FRAGMENT_CHARS,
    Answer,
    Conversation,
    answer_for,
    completion_body,
    failure_body,
    message_text,
    read_conversation,
    split_text,
    stream_chunks,
    usage_for,
)


def test_read_conversation_finds_the_last_user_message_and_tool_results() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "ok"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "second"}, {"type": "image_url"}, {"type": "text", "text": "part"}],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "result one"},
        {"role": "tool", "content": "result two"},
    ]
    conversation = read_conversation(messages)
    assert conversation == Conversation(
        last_user_text="second\npart", tool_results=2, prompt_words=11, user_texts=("first question", "second\npart")
    )


def test_read_conversation_without_a_user_message() -> None:
    assert read_conversation([{"role": "system", "content": "a b"}]) == Conversation("", 0, 2)


@pytest.mark.parametrize(("content", "text"), [("x", "x"), (None, ""), (5, ""), ([{"type": "text", "text": 1}], "")])
def test_message_text(content: Any, text: str) -> None:
    assert message_text(content) == text


@pytest.mark.parametrize(
    ("behaviour", "content"),
    [
        (Behaviour(), DEFAULT_ANSWER),
        (Behaviour(reply="hi"), "hi"),
        (Behaviour(echo=True), "what was said"),
        (Behaviour(empty=True), ""),
        (Behaviour(tool_calls=(FakeToolCall("f", "{}"),)), None),
    ],
)
def test_answer_content(behaviour: Behaviour, content: str | None) -> None:
    conversation = Conversation("what was said\n@fake echo", 0, 4)
    assert answer_for(behaviour, conversation).content == content


def test_default_answer_says_it_is_not_a_language_model() -> None:
    assert "not a language model" in DEFAULT_ANSWER


def test_usage_counts_words() -> None:
    answer = Answer(content="three word answer", tool_calls=(FakeToolCall("f", '{"a":1}'),))
    assert usage_for(Conversation("", 0, 7), answer) == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


@given(st.text(max_size=80))
def test_split_text_joins_back(text: str) -> None:
    pieces = split_text(text)
    assert "".join(pieces) == text
    assert all(pieces)


def test_split_text_gives_one_piece_per_word() -> None:
    assert split_text("Streaming works  too") == ["Streaming ", "works  ", "too"]


def test_completion_body_shape() -> None:
    answer = Answer(content=None, tool_calls=(FakeToolCall("f", '{"a":1}'),))
    body = completion_body(number=7, created=1, model="m", answer=answer, usage={"prompt_tokens": 1})
    assert body["id"] == "chatcmpl-fake-7"
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_fake_7_0", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
    }


def test_stream_chunks_shape() -> None:
    arguments = json.dumps({"key": "v" * 40})
    answer = Answer(content="two words", tool_calls=(FakeToolCall("f", arguments),))
    chunks = stream_chunks(number=1, created=2, model="m", answer=answer, usage={"total_tokens": 3})
    deltas = [chunk["choices"][0]["delta"] if chunk["choices"] else None for chunk in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1:3] == [{"content": "two "}, {"content": "words"}]
    assert deltas[3] == {
        "tool_calls": [
            {"index": 0, "id": "call_fake_1_0", "type": "function", "function": {"name": "f", "arguments": ""}}
        ]
    }
    fragments = [delta["tool_calls"][0]["function"]["arguments"] for delta in deltas[4:-2] if delta]
    assert "".join(fragments) == arguments
    assert all(len(fragment) <= ARGUMENT_FRAGMENT_CHARS for fragment in fragments)
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1] == {
        "id": "chatcmpl-fake-1",
        "object": "chat.completion.chunk",
        "created": 2,
        "model": "m",
        "choices": [],
        "usage": {"total_tokens": 3},
    }


def test_stream_chunks_without_usage() -> None:
    chunks = stream_chunks(number=1, created=2, model="m", answer=Answer("x", ()), usage=None)
    assert all(chunk["choices"] for chunk in chunks)


@pytest.mark.parametrize(
    ("status", "error_type", "code"),
    [
        (400, "invalid_request_error", "fake_bad_request"),
        (401, "invalid_request_error", "invalid_api_key"),
        (403, "permission_denied", "permission_denied"),
        (429, "rate_limit_error", "rate_limit_exceeded"),
        (500, "server_error", "internal_server_error"),
        (503, "server_error", "service_unavailable"),
        (418, "invalid_request_error", "http_418"),
        (502, "server_error", "http_502"),
    ],
)
def test_failure_bodies(status: int, error_type: str, code: str) -> None:
    error = failure_body(status)["error"]
    assert (error["type"], error["code"], error["param"]) == (error_type, code, None)
    assert str(status) in error["message"]

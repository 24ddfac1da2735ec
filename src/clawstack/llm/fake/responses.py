"""The scripted fake model's answers in OpenAI's shapes: completion bodies, stream chunks, error bodies, usage.

Token usage is deterministic: one token per whitespace-separated word. ``prompt_tokens`` counts the words in
the text of every request message; ``completion_tokens`` counts the words of the answer's content and of each
tool call's name and arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clawstack.llm.fake.behaviour import DEFAULT_ANSWER, Behaviour, FakeToolCall
from clawstack.llm.fake.directives import strip_directives

ARGUMENT_FRAGMENT_CHARS = 16

_FAILURES: Mapping[int, tuple[str, str]] = {
    400: ("invalid_request_error", "fake_bad_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_denied", "permission_denied"),
    404: ("invalid_request_error", "not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "internal_server_error"),
    503: ("server_error", "service_unavailable"),
}


@dataclass(frozen=True)
class Conversation:
    """What the fake reads from a request's ``messages``."""

    last_user_text: str
    tool_results: int
    prompt_words: int
    user_texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Answer:
    """The content (``None``: no text) and tool calls of one answer."""

    content: str | None
    tool_calls: tuple[FakeToolCall, ...]


def message_text(content: Any) -> str:
    """The text of a message ``content``: a string, or the ``text`` parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        )
    return ""


def count_words(text: str) -> int:
    """The fake's token count for ``text``."""
    return len(text.split())


def read_conversation(messages: Sequence[Mapping[str, Any]]) -> Conversation:
    """The last user message's text, the tool results after it, and the prompt's word count."""
    last_user = -1
    for index, message in enumerate(messages):
        if message.get("role") == "user":
            last_user = index
    tool_results = sum(1 for message in messages[last_user + 1 :] if message.get("role") == "tool")
    return Conversation(
        last_user_text=message_text(messages[last_user].get("content")) if last_user >= 0 else "",
        user_texts=tuple(message_text(m.get("content")) for m in messages if m.get("role") == "user"),
        tool_results=tool_results if last_user >= 0 else 0,
        prompt_words=sum(count_words(message_text(message.get("content"))) for message in messages),
    )


def answer_for(behaviour: Behaviour, conversation: Conversation) -> Answer:
    """The content and tool calls ``behaviour`` gives for ``conversation``."""
    if behaviour.reply is not None:
        content: str | None = behaviour.reply
    elif behaviour.echo:
        content = strip_directives(conversation.last_user_text)
    elif behaviour.empty:
        content = ""
    elif behaviour.tool_calls:
        content = None
    else:
        content = DEFAULT_ANSWER
    return Answer(content=content, tool_calls=behaviour.tool_calls)


def usage_for(conversation: Conversation, answer: Answer) -> dict[str, int]:
    """The ``usage`` object for ``answer``."""
    completion = count_words(answer.content or "") + sum(
        count_words(call.name) + count_words(call.arguments) for call in answer.tool_calls
    )
    return {
        "prompt_tokens": conversation.prompt_words,
        "completion_tokens": completion,
        "total_tokens": conversation.prompt_words + completion,
    }


def _call_id(number: int, index: int) -> str:
    return f"call_fake_{number}_{index}"


def completion_body(
    *, number: int, created: int, model: str, answer: Answer, usage: Mapping[str, int]
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` body for the ``number``-th answer."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": _call_id(number, index),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(answer.tool_calls)
        ]
    return {
        "id": f"chatcmpl-fake-{number}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(answer)}],
        "usage": dict(usage),
    }


def split_text(text: str) -> list[str]:
    """Content pieces for streaming: each word with the whitespace before it; they join back to ``text``."""
    return [piece for piece in re.split(r"(?<=\s)(?=\S)", text) if piece]


def stream_chunks(
    *, number: int, created: int, model: str, answer: Answer, usage: Mapping[str, int] | None
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` payloads of a streamed answer, in order (without ``[DONE]``).

    A role chunk, one chunk per word of content, per tool call a chunk with its id and name followed by its
    arguments in fragments of :data:`ARGUMENT_FRAGMENT_CHARS` characters, a chunk with the finish reason, and,
    when ``usage`` is given, a final chunk with no choices and the usage.
    """
    head = {"id": f"chatcmpl-fake-{number}", "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    first_content = "" if answer.content is not None else None
    chunks = [chunk({"role": "assistant", "content": first_content})]
    chunks += [chunk({"content": piece}) for piece in split_text(answer.content or "")]
    for index, call in enumerate(answer.tool_calls):
        opening = {"index": index, "id": _call_id(number, index), "type": "function"}
        chunks.append(chunk({"tool_calls": [{**opening, "function": {"name": call.name, "arguments": ""}}]}))
        for start in range(0, len(call.arguments), ARGUMENT_FRAGMENT_CHARS):
            fragment = call.arguments[start : start + ARGUMENT_FRAGMENT_CHARS]
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}))
    chunks.append(chunk({}, _finish_reason(answer)))
    if usage is not None:
        chunks.append({**head, "choices": [], "usage": dict(usage)})
    return chunks


def _finish_reason(answer: Answer) -> str:
    return "tool_calls" if answer.tool_calls else "stop"


def error_body(message: str, error_type: str, code: str | None) -> dict[str, Any]:
    """An OpenAI error envelope."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def failure_body(status: int) -> dict[str, Any]:
    """The error body for ``@fake fail: STATUS``."""
    error_type, code = _FAILURES.get(status, ("invalid_request_error" if status < 500 else "server_error", ""))
    return error_body(
        f"The scripted fake model was told to fail with HTTP {status}.", error_type, code or f"http_{status}"
    )

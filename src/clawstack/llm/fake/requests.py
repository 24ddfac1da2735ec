"""The request side of the scripted fake model: validating a chat completion request, and the request log."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

HIDDEN_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})
"""Headers never recorded: they carry credentials."""


@dataclass(frozen=True)
class RecordedRequest:
    """A request the fake received: ``headers`` (lower-case names) without credentials, ``body`` as JSON
    (``None`` if it was empty or not JSON)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any

    @classmethod
    def build(cls, method: str, path: str, headers: Iterable[tuple[str, str]], raw_body: bytes) -> RecordedRequest:
        """Record a request, dropping :data:`HIDDEN_HEADERS` and joining repeated headers with ``", "``."""
        kept: dict[str, str] = {}
        for name, value in headers:
            key = name.lower()
            if key not in HIDDEN_HEADERS:
                kept[key] = f"{kept[key]}, {value}" if key in kept else value
        try:
            body = json.loads(raw_body) if raw_body else None
        except (ValueError, RecursionError):
            body = None
        return cls(method=method, path=path, headers=kept, body=body)

    def to_dict(self) -> dict[str, Any]:
        """The form ``GET /_fake/requests`` returns."""
        return {"method": self.method, "path": self.path, "headers": dict(self.headers), "body": self.body}


class BadChatRequest(Exception):
    """A request the fake refuses with 400; ``code`` goes in the OpenAI error body."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True)
class ChatRequest:
    """The parts of a chat completion request the fake uses."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool


def read_chat_request(raw: bytes) -> ChatRequest:
    """Validate a chat completion request body, or raise :class:`BadChatRequest` naming the field."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadChatRequest("The request body is not valid JSON.", "invalid_json") from exc
    if not isinstance(body, dict):
        raise BadChatRequest("The request body must be a JSON object.", "invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadChatRequest("'model' is required and must be a non-empty string.", "invalid_model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadChatRequest("'messages' is required and must be a non-empty array.", "invalid_messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadChatRequest(f"'messages[{index}]' must be an object with a string 'role'.", "invalid_messages")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadChatRequest("'stream' must be a boolean.", "invalid_stream")
    options = body.get("stream_options")
    if options is None:
        options = {}
    include_usage = options.get("include_usage", False) if isinstance(options, dict) else None
    if not isinstance(include_usage, bool):
        raise BadChatRequest("'stream_options' must be an object with a boolean 'include_usage'.", "invalid_stream")
    return ChatRequest(model=model, messages=messages, stream=stream, include_usage=include_usage)

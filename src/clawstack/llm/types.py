"""The values :mod:`clawstack.llm` hands back: completions, stream chunks, tool calls, usage, models.

All are frozen dataclasses. Request-side values (messages, tools) stay plain JSON mappings, because the client
passes them through to the endpoint as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

ReasoningEffort: TypeAlias = Literal["none", "minimal", "low", "medium", "high"]
"""The values OpenAI-compatible endpoints accept for ``reasoning_effort``."""

REASONING_EFFORTS: frozenset[str] = frozenset({"none", "minimal", "low", "medium", "high"})

Message: TypeAlias = Mapping[str, Any]
"""One chat message as the endpoint expects it, e.g. ``{"role": "user", "content": "Hello"}``."""

Messages: TypeAlias = Sequence[Message]


@dataclass(frozen=True)
class Usage:
    """Token counts the endpoint reported for one completion."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class ToolCall:
    """A function call the model asked for. ``arguments`` is the JSON text exactly as the model produced it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatCompletion:
    """A finished chat completion (choice 0), from a plain response or assembled from a stream.

    ``content`` is ``None`` when the model sent no text (typically an answer made only of tool calls).
    ``raw`` is the response body as received, or for a stream, the equivalent body assembled from it.
    """

    id: str
    model: str
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of a tool call in a stream. Fragments with the same ``index`` belong to one call:
    the first usually carries ``id`` and ``name``, the rest carry pieces of ``arguments``."""

    index: int
    id: str | None
    name: str | None
    arguments: str | None


@dataclass(frozen=True)
class ChatCompletionChunk:
    """One event of a streamed chat completion (choice 0).

    ``content`` is the text added by this chunk (``None`` if none). The last chunks carry ``finish_reason`` and,
    when usage was requested, ``usage`` (in a chunk with no choices).
    """

    id: str
    model: str
    role: str | None
    content: str | None
    tool_calls: tuple[ToolCallDelta, ...]
    finish_reason: str | None
    usage: Usage | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class ModelInfo:
    """One entry of ``GET /models``."""

    id: str
    owned_by: str | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

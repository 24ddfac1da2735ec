"""Assemble a :class:`ChatCompletion` from the chunks of a stream.

Content deltas are concatenated in order. Tool-call deltas are grouped by their ``index``: the first fragment
of an index gives the call its ``id`` and ``name`` (later non-empty values replace them, as some providers
repeat them), and every fragment's ``arguments`` piece is appended. The result's ``raw`` is the body a
non-streaming call would have returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clawstack.llm.types import ChatCompletion, ChatCompletionChunk, ToolCall, Usage


@dataclass
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class CompletionAccumulator:
    """Feed chunks with :meth:`add`; read the assembled completion with :meth:`completion` at any point."""

    def __init__(self) -> None:
        self._id = ""
        self._model = ""
        self._content: list[str] | None = None
        self._tool_calls: dict[int, _ToolCallParts] = {}
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._created: Any = None

    def add(self, chunk: ChatCompletionChunk) -> None:
        """Fold one chunk into the completion."""
        self._id = self._id or chunk.id
        self._model = self._model or chunk.model
        if self._created is None:
            self._created = chunk.raw.get("created")
        if chunk.content is not None:
            if self._content is None:
                self._content = []
            self._content.append(chunk.content)
        for delta in chunk.tool_calls:
            parts = self._tool_calls.setdefault(delta.index, _ToolCallParts())
            if delta.id:
                parts.id = delta.id
            if delta.name:
                parts.name = delta.name
            if delta.arguments:
                parts.arguments.append(delta.arguments)
        if chunk.finish_reason is not None:
            self._finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage

    def completion(self) -> ChatCompletion:
        """The completion assembled from every chunk added so far."""
        content = None if self._content is None else "".join(self._content)
        calls = tuple(
            ToolCall(id=parts.id, name=parts.name, arguments="".join(parts.arguments))
            for _, parts in sorted(self._tool_calls.items())
        )
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in calls
            ]
        raw: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish_reason}],
        }
        if self._usage is not None:
            raw["usage"] = {
                "prompt_tokens": self._usage.prompt_tokens,
                "completion_tokens": self._usage.completion_tokens,
                "total_tokens": self._usage.total_tokens,
            }
        return ChatCompletion(
            id=self._id,
            model=self._model,
            content=content,
            tool_calls=calls,
            finish_reason=self._finish_reason,
            usage=self._usage,
            raw=raw,
        )

"""Assembling a completion from stream chunks: content joined, tool-call fragments joined by index."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from clawstack.llm import ChatCompletionChunk, CompletionAccumulator, ToolCall, ToolCallDelta, Usage


def _chunk(
    content: str | None = None,
    tool_calls: tuple[ToolCallDelta, ...] = (),
    finish_reason: str | None = None,
    usage: Usage | None = None,
) -> ChatCompletionChunk:
    raw: dict[str, Any] = {"id": "c1", "model": "m", "created": 12}
    return ChatCompletionChunk("c1", "m", None, content, tool_calls, finish_reason, usage, raw)


def test_interleaved_tool_calls_are_joined_by_index() -> None:
    accumulator = CompletionAccumulator()
    for chunk in [
        _chunk(content=""),
        _chunk(tool_calls=(ToolCallDelta(1, "b", "second", ""),)),
        _chunk(tool_calls=(ToolCallDelta(0, "a", "first", '{"x"'),)),
        _chunk(tool_calls=(ToolCallDelta(1, None, None, '{"y": 2}'), ToolCallDelta(0, None, None, ": 1}"))),
        _chunk(finish_reason="tool_calls"),
        _chunk(usage=Usage(4, 5, 9)),
    ]:
        accumulator.add(chunk)
    completion = accumulator.completion()
    assert completion.tool_calls == (
        ToolCall("a", "first", '{"x": 1}'),
        ToolCall("b", "second", '{"y": 2}'),
    )
    assert completion.content == ""
    assert completion.finish_reason == "tool_calls"
    assert completion.usage == Usage(4, 5, 9)
    message = completion.raw["choices"][0]["message"]
    assert message["tool_calls"][1] == {
        "id": "b",
        "type": "function",
        "function": {"name": "second", "arguments": '{"y": 2}'},
    }
    assert completion.raw["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    assert completion.raw["created"] == 12


def test_no_content_deltas_means_null_content() -> None:
    accumulator = CompletionAccumulator()
    accumulator.add(_chunk(finish_reason="stop"))
    completion = accumulator.completion()
    assert completion.content is None
    assert completion.tool_calls == ()
    assert completion.usage is None
    assert "usage" not in completion.raw


def _pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(cut, len(text)) for cut in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@given(
    content=st.text(max_size=50),
    arguments=st.dictionaries(st.text(max_size=5), st.integers(), max_size=4),
    cuts=st.lists(st.integers(0, 60), max_size=8),
)
def test_any_fragmentation_reassembles(content: str, arguments: dict[str, int], cuts: list[int]) -> None:
    text = json.dumps(arguments)
    accumulator = CompletionAccumulator()
    for piece in _pieces(content, cuts):
        accumulator.add(_chunk(content=piece))
    accumulator.add(_chunk(tool_calls=(ToolCallDelta(0, "id0", "tool", None),)))
    for piece in _pieces(text, cuts):
        accumulator.add(_chunk(tool_calls=(ToolCallDelta(0, None, None, piece),)))
    completion = accumulator.completion()
    assert completion.content == content
    assert completion.tool_calls == (ToolCall("id0", "tool", text),)
    assert json.loads(completion.tool_calls[0].arguments) == arguments

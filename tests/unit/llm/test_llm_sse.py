"""The SSE decoder: framing, comments, multi-line data, arbitrary splits, and its size bound."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.llm import LLMProtocolError
from clawstack.llm.sse import ServerSentEvent, SSEDecoder


def _decode_all(data: bytes, **kwargs: int) -> list[ServerSentEvent]:
    return SSEDecoder(**kwargs).feed(data)


def test_data_events_and_done() -> None:
    events = _decode_all(b'data: {"a": 1}\n\ndata: [DONE]\n\n')
    assert events == [ServerSentEvent("message", '{"a": 1}'), ServerSentEvent("message", "[DONE]")]


def test_crlf_comments_fields_and_multiline_data() -> None:
    stream = b": keep-alive\r\nevent: delta\r\nid: 7\r\nretry: 100\r\ndata: one\r\ndata:two\r\ndata\r\n\r\n"
    assert _decode_all(stream) == [ServerSentEvent("delta", "one\ntwo\n")]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    assert _decode_all(b"\n\n: comment\n\n") == []


def test_an_unfinished_event_stays_pending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: partial") == []
    assert decoder.pending
    assert decoder.feed(b"\n\n") == [ServerSentEvent("message", "partial")]
    assert not decoder.pending


def test_invalid_utf8_is_a_protocol_error() -> None:
    with pytest.raises(LLMProtocolError):
        _decode_all(b"data: \xff\xfe\n\n")


@pytest.mark.parametrize("stream", [b"data: " + b"x" * 200 + b"\n\n", b"data: " + b"x" * 200, b"data: x\n" * 40])
def test_events_larger_than_the_bound_are_refused(stream: bytes) -> None:
    with pytest.raises(LLMProtocolError, match="exceeds 100 bytes"):
        _decode_all(stream, max_event_bytes=100)


_data = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=30)


@given(events=st.lists(st.lists(_data, min_size=1, max_size=3), max_size=6), cuts=st.lists(st.integers(0, 400)))
def test_any_split_of_the_stream_gives_the_same_events(events: list[list[str]], cuts: list[int]) -> None:
    wire = b"".join(b"".join(f"data: {line}\n".encode() for line in event) + b"\n" for event in events)
    decoder = SSEDecoder()
    decoded: list[ServerSentEvent] = []
    start = 0
    for cut in [*sorted({min(cut, len(wire)) for cut in cuts}), len(wire)]:
        decoded += decoder.feed(wire[start:cut])
        start = cut
    assert decoded == [ServerSentEvent("message", "\n".join(event)) for event in events]
    assert not decoder.pending

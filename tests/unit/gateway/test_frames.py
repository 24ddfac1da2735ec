"""Frame parsing and the pre-handshake budget: the limits at the gateway's front door."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.gateway.frames import MAX_FRAME_OVERHEAD, PreHandshakeBudget
from clawstack.gateway.protocol import (
    DEFAULT_MAX_PAYLOAD,
    MAX_FRAME_DEPTH,
    PREAUTH_MAX_PAYLOAD,
    FrameError,
    parse_request_frame,
)


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def request(params: Any) -> str:
    return json.dumps({"type": "req", "id": "r1", "method": "chat.send", "params": params})


# -- parse_request_frame ---------------------------------------------------------------------------------------------

REFUSED: list[tuple[str, str | bytes, str, str | None]] = [
    ("not json", "{nope", "not JSON", None),
    ("empty", "", "not JSON", None),
    ("bad utf-8", b'{"type": "req", "id": "\xff"}', "not JSON", None),
    ("array", "[1]", "must be object", None),
    ("string", '"req"', "must be object", None),
    ("null", "null", "must be object", None),
    ("number", "7", "must be object", None),
    ("duplicate key", '{"type": "req", "id": "a", "id": "b", "method": "m"}', 'duplicate object key "id"', None),
    ("NaN", '{"type": "req", "id": "a", "method": "m", "params": {"n": NaN}}', "NaN is not JSON", None),
    ("big integer", '{"type": "req", "id": "a", "method": "m", "params": {"n": 9007199254740993}}', "2^53", None),
    ("lone surrogate", '{"type": "req", "id": "a", "method": "m", "params": {"s": "\\ud800"}}', "surrogate", None),
    ("one level too deep", request(nested(MAX_FRAME_DEPTH)), f"nested deeper than {MAX_FRAME_DEPTH} levels", None),
    ("very deep", "[" * 100_000 + "]" * 100_000, f"nested deeper than {MAX_FRAME_DEPTH} levels", None),
    ("event", '{"type": "event", "id": "e1", "event": "x"}', 'at /type: must be equal to "req"', "e1"),
]


@pytest.mark.parametrize(("text", "problem", "frame_id"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_refused_frames(text: str | bytes, problem: str, frame_id: str | None) -> None:
    with pytest.raises(FrameError) as caught:
        parse_request_frame(text)
    assert caught.value.wire_code == "INVALID_REQUEST"
    assert caught.value.message.startswith("invalid request frame: ")
    assert problem in caught.value.message
    assert caught.value.frame_id == frame_id


def test_duplicate_keys_inside_params_are_refused() -> None:
    with pytest.raises(FrameError, match="duplicate object key"):
        parse_request_frame('{"type": "req", "id": "a", "method": "m", "params": {"x": 1, "x": 2}}')


def test_depth_is_bounded_at_max_frame_depth() -> None:
    # The frame object is level 1, so params may hold MAX_FRAME_DEPTH - 1 levels of arrays and objects.
    frame = parse_request_frame(request(nested(MAX_FRAME_DEPTH - 1)))
    assert frame.params == nested(MAX_FRAME_DEPTH - 1)
    with pytest.raises(FrameError, match="nested deeper"):
        parse_request_frame(request(nested(MAX_FRAME_DEPTH)))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    frame = parse_request_frame(request({"message": "[" * 10_000 + "{" * 10_000}))
    assert isinstance(frame.params, dict)


def test_size_is_bounded_by_max_bytes() -> None:
    base = len(request(""))
    fits = request("x" * (PREAUTH_MAX_PAYLOAD - base))
    assert len(fits) == PREAUTH_MAX_PAYLOAD
    assert parse_request_frame(fits, max_bytes=PREAUTH_MAX_PAYLOAD).method == "chat.send"
    with pytest.raises(FrameError) as caught:
        parse_request_frame(request("x" * (PREAUTH_MAX_PAYLOAD - base + 1)), max_bytes=PREAUTH_MAX_PAYLOAD)
    assert caught.value.message == f"invalid request frame: larger than {PREAUTH_MAX_PAYLOAD} bytes"
    # Bytes, not characters: a multi-byte character counts for its UTF-8 length.
    with pytest.raises(FrameError, match="larger than"):
        parse_request_frame(request("é" * (PREAUTH_MAX_PAYLOAD // 2)), max_bytes=PREAUTH_MAX_PAYLOAD)
    # The default bound is policy.maxPayload.
    assert parse_request_frame(request("x" * (PREAUTH_MAX_PAYLOAD * 2))).id == "r1"
    assert DEFAULT_MAX_PAYLOAD > PREAUTH_MAX_PAYLOAD


def test_errors_do_not_quote_values() -> None:
    with pytest.raises(FrameError) as caught:
        parse_request_frame('{"type": "req", "id": "a", "method": "m", "params": {"token": "sk-secret", "n": NaN}}')
    assert "sk-secret" not in caught.value.message


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=3000), st.sampled_from(["[", '{"k":']))
def test_no_nesting_raises_anything_but_a_frame_error(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    text = '{"type": "req", "id": "a", "method": "m", "params": ' + opener * depth + "1" + closer * depth + "}"
    if depth + 1 > MAX_FRAME_DEPTH:
        with pytest.raises(FrameError, match=f"^invalid request frame: nested deeper than {MAX_FRAME_DEPTH} levels$"):
            parse_request_frame(text)
    else:
        assert parse_request_frame(text).id == "a"


# -- PreHandshakeBudget --------------------------------------------------------------------------------------------


class _Inner(asyncio.Protocol):
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.lost: list[Exception | None] = []
        self.eof = 0
        self.writing: list[str] = []

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool | None:
        self.eof += 1
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)

    def pause_writing(self) -> None:
        self.writing.append("pause")

    def resume_writing(self) -> None:
        self.writing.append("resume")


class _Transport(asyncio.Transport):
    def __init__(self, protocol: asyncio.BaseProtocol) -> None:
        super().__init__()
        self.protocol = protocol
        self.paused = False

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.paused = True


async def test_the_budget_forwards_until_spent_then_withholds_and_stops_reading() -> None:
    inner = _Inner()
    transport = _Transport(inner)
    budget = PreHandshakeBudget.install(transport, 10)
    assert transport.protocol is budget
    budget.data_received(b"12345")
    budget.data_received(b"67890")
    assert inner.data == [b"12345", b"67890"]
    assert not budget.exceeded.is_set()
    budget.data_received(b"x")
    assert budget.exceeded.is_set()
    assert transport.paused
    budget.data_received(b"more")
    assert inner.data == [b"12345", b"67890"]  # nothing past the budget reaches the protocol
    assert budget.release() is False
    assert transport.protocol is budget  # a stream with withheld bytes is never handed back


async def test_release_hands_the_transport_back_and_callbacks_are_forwarded() -> None:
    inner = _Inner()
    transport = _Transport(inner)
    budget = PreHandshakeBudget.install(transport, PREAUTH_MAX_PAYLOAD + MAX_FRAME_OVERHEAD)
    budget.pause_writing()
    budget.resume_writing()
    budget.eof_received()
    budget.data_received(b"a" * (PREAUTH_MAX_PAYLOAD + MAX_FRAME_OVERHEAD))
    assert not budget.exceeded.is_set()
    assert budget.release() is True
    assert transport.protocol is inner
    assert budget.release() is True  # idempotent
    budget.connection_lost(None)
    assert (inner.writing, inner.eof, inner.lost) == (["pause", "resume"], 1, [None])


def test_a_budget_is_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PreHandshakeBudget(_Transport(_Inner()), 0)

"""Markers and directive blocks: every malformed shape is stripped and ignored, only the first block counts, a
block wins over a marker, and nothing of either reaches the agent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.connect.agent_session import parse_context
from clawstack.connect.agent_session.directives import (
    BLOCK_CLOSE,
    BLOCK_OPEN,
    MARKER_CLOSE,
    MARKER_OPEN,
    is_session_segment,
)

DELIMITERS = (BLOCK_OPEN, BLOCK_CLOSE, MARKER_OPEN, MARKER_CLOSE)


def marker(body: Any) -> str:
    return MARKER_OPEN + (body if isinstance(body, str) else json.dumps(body)) + MARKER_CLOSE


def block(body: Any) -> str:
    return BLOCK_OPEN + (body if isinstance(body, str) else json.dumps(body)) + BLOCK_CLOSE


ATTACH = {"runtime": "fake", "sessionId": "s-1"}

MALFORMED_MARKERS: list[Any] = [
    "{not json",
    "[]",
    '"a string"',
    "null",
    '{"runtime": "fake", "runtime": "fake", "sessionId": "s"}',
    '{"runtime": "fake", "sessionId": "s", "n": NaN}',
    {"sessionId": "s"},
    {"runtime": "fake"},
    {"runtime": "", "sessionId": "s"},
    {"runtime": "-bad", "sessionId": "s"},
    {"runtime": "a" * 65, "sessionId": "s"},
    {"runtime": "a/b", "sessionId": "s"},
    {"runtime": 5, "sessionId": "s"},
    {"runtime": "fake", "sessionId": "../../etc/passwd"},
    {"runtime": "fake", "sessionId": "a/b"},
    {"runtime": "fake", "sessionId": "a\\b"},
    {"runtime": "fake", "sessionId": ".."},
    {"runtime": "fake", "sessionId": "."},
    {"runtime": "fake", "sessionId": ""},
    {"runtime": "fake", "sessionId": "a\nb"},
    {"runtime": "fake", "sessionId": "a\x00b"},
    {"runtime": "fake", "sessionId": " padded"},
    {"runtime": "fake", "sessionId": 12},
    {"runtime": "fake", "sessionId": "x" * 257},
    {**ATTACH, "state": "done"},
    {**ATTACH, "metadata": {"n": 1}},
    {**ATTACH, "metadata": ["a"]},
    {**ATTACH, "metadata": {"a": None}},
    {**ATTACH, "provider": 3},
    {**ATTACH, "provider": ""},
    {**ATTACH, "host": "a\tb"},
    {**ATTACH, "remoteUrl": "javascript:alert(1)"},
    {**ATTACH, "remoteUrl": "file:///etc/passwd"},
    {**ATTACH, "providerSessionId": ["x"]},
    {**ATTACH, "surprise": 1},
    {**ATTACH, "op": "detach", "reason": "r"},
    {**ATTACH, "stopRuntime": True},
]

MALFORMED_BLOCKS: list[Any] = [
    ATTACH,  # no action
    {**ATTACH, "op": "spawn"},
    {**ATTACH, "op": "list"},
    {**ATTACH, "op": "ATTACH"},
    {**ATTACH, "op": "replace"},  # no reason
    {"op": "detach"},  # no reason
    {"op": "detach", "reason": ""},
    {"op": "detach", "reason": "r", "stopRuntime": "yes"},
    {"op": "detach", "reason": "r", "stopRuntime": 1},
    {"op": "detach", "reason": "r", "stopRuntime": None},
    {"op": "inspect", "stopRuntime": True},
    {"op": "continue", "prompt": 5},
    {"op": "attach", "prompt": "x", **ATTACH},
    {"op": "continue", "runtime": "fake"},  # names a runtime without a session
    {"op": "continue", "sessionId": "../x", "runtime": "fake"},
]


@pytest.mark.parametrize("body", MALFORMED_MARKERS)
def test_a_malformed_marker_is_stripped_and_ignored(body: Any) -> None:
    parsed = parse_context(f"before {marker(body)} after")
    assert parsed.directive is None
    assert parsed.problem is not None
    assert parsed.text == "before  after"
    assert "/etc/passwd" not in (parsed.problem or "")


@pytest.mark.parametrize("body", MALFORMED_BLOCKS)
def test_a_malformed_block_is_stripped_and_ignored(body: Any) -> None:
    parsed = parse_context(f"{block(body)}keep")
    assert parsed.directive is None
    assert parsed.problem is not None
    assert parsed.text == "keep"


def test_a_marker_always_means_attach() -> None:
    body = {**ATTACH, "provider": "p", "providerSessionId": "thread-9", "host": "box-1", "state": "running"}
    body |= {"remoteUrl": "https://example.org/s/1", "metadata": {"k": "v"}}
    parsed = parse_context(marker(body))
    assert parsed.text is None
    directive = parsed.directive
    assert directive is not None
    assert (directive.action, directive.from_marker, directive.runtime, directive.session_id) == (
        "attach",
        True,
        "fake",
        "s-1",
    )
    assert (directive.provider_session_id, directive.host, directive.state) == ("thread-9", "box-1", "running")
    assert dict(directive.metadata) == {"k": "v"}


@pytest.mark.parametrize("action", ["attach", "continue", "replace", "detach", "inspect"])
def test_every_action(action: str) -> None:
    body: dict[str, Any] = {"op": action}
    if action in ("attach", "replace"):
        body |= ATTACH
    if action in ("replace", "detach"):
        body["reason"] = "why"
    parsed = parse_context(block(body))
    assert parsed.directive is not None
    assert parsed.directive.action == action


def test_stop_runtime_only_when_exactly_true() -> None:
    for value, expected in ((True, True), (False, False)):
        parsed = parse_context(block({"op": "detach", "reason": "r", "stopRuntime": value}))
        assert parsed.directive is not None
        assert parsed.directive.stop_runtime is expected
    parsed = parse_context(block({"op": "detach", "reason": "r"}))
    assert parsed.directive is not None
    assert parsed.directive.stop_runtime is False


def test_only_the_first_block_counts_and_a_block_wins_over_a_marker() -> None:
    first = block({"op": "inspect"})
    second = block({"op": "detach", "reason": "r", "stopRuntime": True})
    parsed = parse_context(f"{marker(ATTACH)} a {first} b {second} c")
    assert parsed.directive is not None
    assert parsed.directive.action == "inspect"
    assert parsed.text == "a  b  c"
    broken_first = parse_context(f"{block('{oops')} {second} {marker(ATTACH)}")
    assert broken_first.directive is None  # the first block counts, even broken; no fallback
    two_markers = parse_context(marker(ATTACH) + marker({"runtime": "other", "sessionId": "s-2"}))
    assert two_markers.directive is not None
    assert two_markers.directive.runtime == "fake"


def test_unclosed_and_stray_delimiters_are_stripped() -> None:
    assert parse_context(f"keep {MARKER_OPEN}" + '{"runtime": "fake"').text == "keep"
    assert parse_context(f"keep {BLOCK_CLOSE} this").text == "keep  this"
    assert parse_context(f"a {BLOCK_OPEN} secret").directive is None


def test_a_context_without_delimiters_is_untouched() -> None:
    text = "  plain <b>context</b> [[not:ours]] "
    parsed = parse_context(text)
    assert (parsed.text, parsed.directive, parsed.found) == (text, None, False)
    assert parse_context(None).text is None


@given(st.text(max_size=80), st.text(max_size=80), st.sampled_from(DELIMITERS), st.text(max_size=80))
def test_no_delimiter_survives_parsing(before: str, inner: str, delimiter: str, after: str) -> None:
    for text in (before + marker(inner) + after, before + block(inner) + after, before + delimiter + inner + after):
        parsed = parse_context(text)
        assert not any(d in (parsed.text or "") for d in DELIMITERS)


SEGMENT_JUNK = st.one_of(
    st.just(".."),
    st.just("."),
    st.text(min_size=0, max_size=8).map(lambda s: s + "/" + s),
    st.text(min_size=0, max_size=8).map(lambda s: "..\\" + s),
    st.characters(whitelist_categories=["Cc"]).map(lambda c: "a" + c),
    st.text(min_size=257, max_size=300),
)


@given(SEGMENT_JUNK, st.dictionaries(st.text(max_size=5), st.integers(), min_size=0, max_size=2))
def test_nothing_malformed_is_accepted(session_id: str, extra: dict[str, int]) -> None:
    assert not is_session_segment(session_id)
    assert parse_context(marker({"runtime": "fake", "sessionId": session_id})).directive is None
    if extra:
        assert parse_context(marker({**ATTACH, "metadata": extra})).directive is None


@given(
    st.dictionaries(
        st.sampled_from(["runtime", "sessionId", "op", "reason", "stopRuntime", "state"]),
        st.text(max_size=12) | st.booleans() | st.integers(),
    )
)
def test_any_accepted_directive_obeys_the_field_rules(body: dict[str, Any]) -> None:
    for text in (marker(body), block(body)):
        directive = parse_context(text).directive
        if directive is None:
            continue
        if directive.action in ("attach", "replace"):
            assert is_session_segment(directive.session_id)
        if directive.action in ("replace", "detach"):
            assert directive.reason
        assert directive.stop_runtime is (body.get("stopRuntime") is True)


def test_the_transition_is_keyed_op_as_the_reference_sends_it() -> None:
    parsed = parse_context(block({"op": "continue", "prompt": "go on"}))
    assert parsed.directive is not None
    assert (parsed.directive.action, parsed.directive.prompt) == ("continue", "go on")
    legacy = parse_context("text " + block({"action": "continue", "prompt": "go on"}))
    assert legacy.directive is None  # not silently accepted: malformed, and the warning names the key
    assert legacy.problem == "action: is not a directive field"
    assert legacy.text == "text"

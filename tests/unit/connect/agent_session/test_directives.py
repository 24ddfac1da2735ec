"""Markers and directive blocks: every malformed shape is stripped and ignored, only the first block counts, a
block wins over a marker, and nothing of either reaches the agent. The rules for ``sessionId``, ``metadata`` and
``stopRuntime`` are those of the reference ClawConnect, so that hosts written for it work unchanged."""

from __future__ import annotations

import json
import math
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
    js_number_text,
    validate,
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
    {"runtime": "fake", "sessionId": "a b"},
    {"runtime": "fake", "sessionId": "a\n"},
    {"runtime": "fake", "sessionId": "-a"},
    {"runtime": "fake", "sessionId": ".a"},
    {"runtime": "fake", "sessionId": "_a"},
    {"runtime": "fake", "sessionId": "a:b"},
    {"runtime": "fake", "sessionId": "é"},
    {"runtime": "fake", "sessionId": 12},
    {"runtime": "fake", "sessionId": None},
    {"runtime": "fake", "sessionId": "x" * 129},
    {**ATTACH, "state": "done"},
    {**ATTACH, "provider": 3},
    {**ATTACH, "provider": ""},
    {**ATTACH, "host": "a\tb"},
    {**ATTACH, "remoteUrl": "javascript:alert(1)"},
    {**ATTACH, "remoteUrl": "file:///etc/passwd"},
    {**ATTACH, "providerSessionId": ["x"]},
    {**ATTACH, "surprise": 1},
    {**ATTACH, "op": "detach", "reason": "r"},
]

MALFORMED_BLOCKS: list[Any] = [
    ATTACH,  # no action
    {**ATTACH, "op": "spawn"},
    {**ATTACH, "op": "list"},
    {**ATTACH, "op": "ATTACH"},
    {**ATTACH, "op": "replace"},  # no reason
    {"op": "detach"},  # no reason
    {"op": "detach", "reason": ""},
    {"op": "detach", "reason": "r", "stopRuntime": True, "surprise": 1},
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


NO_STOP = object()


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), (NO_STOP, False), ("true", False), (1, False), (None, False), ("yes", False)],
    ids=repr,
)
def test_a_detach_stops_the_runtime_only_on_the_literal_true(value: Any, expected: bool) -> None:
    body: dict[str, Any] = {"op": "detach", "reason": "r"}
    if value is not NO_STOP:
        body["stopRuntime"] = value
    parsed = parse_context(block(body))
    assert parsed.problem is None
    assert parsed.directive is not None  # any other value is a detach that leaves the runtime alone, not malformed
    assert parsed.directive.action == "detach"
    assert parsed.directive.stop_runtime is expected


@pytest.mark.parametrize("value", [True, False, "true", 1, None])
@pytest.mark.parametrize("op", ["attach", "continue", "replace", "inspect", "marker"])
def test_stop_runtime_is_ignored_on_every_other_operation(op: str, value: Any) -> None:
    body: dict[str, Any] = {"stopRuntime": value}
    if op in ("attach", "replace", "marker"):
        body |= ATTACH
    if op == "replace":
        body["reason"] = "r"
    parsed = parse_context(marker(body) if op == "marker" else block({"op": op, **body}))
    assert parsed.problem is None
    assert parsed.directive is not None
    assert parsed.directive.action == ("attach" if op == "marker" else op)
    assert parsed.directive.stop_runtime is False


# --- sessionId --------------------------------------------------------------------------------------------------

VALID_SESSION_IDS = ["a", "Z", "7", "s-1", "A.b-c_d", "a..b", "a.", "1.2.3", "x" * 128, "abc_"]


@pytest.mark.parametrize("session_id", VALID_SESSION_IDS)
def test_a_session_id_matching_the_reference_pattern_is_accepted(session_id: str) -> None:
    parsed = parse_context(marker({"runtime": "fake", "sessionId": session_id}))
    assert parsed.directive is not None
    assert parsed.directive.session_id == session_id
    assert is_session_segment(session_id)


@given(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z"))
def test_every_session_id_of_the_pattern_is_accepted(session_id: str) -> None:
    assert parse_context(marker({"runtime": "fake", "sessionId": session_id})).directive is not None


# --- metadata ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("v", "v"),
        ("", ""),
        (1, "1"),
        (1.0, "1"),
        (-0.0, "0"),
        (0, "0"),
        (1.5, "1.5"),
        (-2.5, "-2.5"),
        (0.1, "0.1"),
        (0.1 + 0.2, "0.30000000000000004"),
        (123.456, "123.456"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.25e21, "1.25e+21"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (-1.5e-7, "-1.5e-7"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (2**53 + 1, "9007199254740992"),  # read as a double, as JavaScript reads it
        (12345678901234567890, "12345678901234567000"),
        (True, "true"),
        (False, "false"),
    ],
    ids=repr,
)
def test_a_metadata_number_or_boolean_becomes_the_text_javascript_prints(value: Any, text: str) -> None:
    parsed = parse_context(marker({**ATTACH, "metadata": {"k": value, "s": "kept"}}))
    assert parsed.directive is not None
    assert dict(parsed.directive.metadata) == {"k": text, "s": "kept"}


def test_metadata_numbers_are_read_from_the_json_text_as_javascript_reads_them() -> None:
    body = '{"runtime": "fake", "sessionId": "s-1", "metadata": {"a": 1.0, "b": 1e400, "c": -0, "d": 10E-1}}'
    parsed = parse_context(MARKER_OPEN + body + MARKER_CLOSE)
    assert parsed.directive is not None
    assert dict(parsed.directive.metadata) == {"a": "1", "c": "0", "d": "1"}  # 1e400 is Infinity there: dropped


@pytest.mark.parametrize("value", [None, {}, {"a": "b"}, [], ["a"], float("inf"), float("-inf"), float("nan"), 10**400])
def test_a_metadata_value_that_is_not_a_string_number_or_boolean_is_dropped(value: Any) -> None:
    directive = validate({**ATTACH, "metadata": {"k": value, "s": "kept"}}, from_marker=True)
    assert dict(directive.metadata) == {"s": "kept"}


@pytest.mark.parametrize("metadata", [None, [], ["a"], "a string", 5, True])
def test_a_metadata_that_is_not_an_object_is_dropped_whole(metadata: Any) -> None:
    parsed = parse_context(marker({**ATTACH, "metadata": metadata}))
    assert parsed.directive is not None
    assert dict(parsed.directive.metadata) == {}


def test_metadata_entries_over_the_bounds_are_dropped_not_refused() -> None:
    metadata = {"long-value": "v" * 4097, "k" * 129: "long key", "": "empty key", "edge": "v" * 4096, "k" * 128: "ok"}
    parsed = parse_context(marker({**ATTACH, "metadata": metadata}))
    assert parsed.directive is not None
    assert dict(parsed.directive.metadata) == {"edge": "v" * 4096, "k" * 128: "ok"}

    many = {f"n{i}": i for i in range(100)}
    directive = parse_context(marker({**ATTACH, "metadata": {"drop": None, **many}})).directive
    assert directive is not None
    assert dict(directive.metadata) == {f"n{i}": str(i) for i in range(64)}  # the first 64 kept, in order


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=140), JSON_VALUES, max_size=80))
def test_metadata_values_never_make_a_marker_malformed(metadata: dict[str, Any]) -> None:
    for text in (marker({**ATTACH, "metadata": metadata}), block({"op": "attach", **ATTACH, "metadata": metadata})):
        parsed = parse_context(text)
        assert parsed.problem is None
        assert parsed.directive is not None
        kept = dict(parsed.directive.metadata)
        assert len(kept) <= 64
        assert all(isinstance(key, str) and isinstance(value, str) for key, value in kept.items())
        for key, value in kept.items():
            original = metadata[key]
            if isinstance(original, str):
                assert value == original
            elif isinstance(original, bool):
                assert value == ("true" if original else "false")
            else:
                assert isinstance(original, int | float)
                assert float(value) == float(original)  # the text reads back as the same double


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
    st.text(min_size=0, max_size=8).map(lambda s: "a " + s),
    st.text(alphabet="._-", min_size=1, max_size=8),
    st.text(min_size=129, max_size=300),
)


@given(SEGMENT_JUNK)
def test_nothing_malformed_is_accepted(session_id: str) -> None:
    assert not is_session_segment(session_id)
    assert parse_context(marker({"runtime": "fake", "sessionId": session_id})).directive is None


@given(st.text(max_size=140))
def test_a_session_id_is_accepted_exactly_when_it_matches_the_pattern(session_id: str) -> None:
    expected = (
        0 < len(session_id) <= 128
        and session_id[0].isascii()
        and session_id[0].isalnum()
        and all(ch.isascii() and (ch.isalnum() or ch in "._-") for ch in session_id)
    )
    assert is_session_segment(session_id) is expected
    accepted = parse_context(marker({"runtime": "fake", "sessionId": session_id})).directive is not None
    assert accepted is expected


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
        assert directive.stop_runtime is (directive.action == "detach" and body.get("stopRuntime") is True)


def test_the_transition_is_keyed_op_as_the_reference_sends_it() -> None:
    parsed = parse_context(block({"op": "continue", "prompt": "go on"}))
    assert parsed.directive is not None
    assert (parsed.directive.action, parsed.directive.prompt) == ("continue", "go on")
    legacy = parse_context("text " + block({"action": "continue", "prompt": "go on"}))
    assert legacy.directive is None  # not silently accepted: malformed, and the warning names the key
    assert legacy.problem == "action: is not a directive field"
    assert legacy.text == "text"


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_js_number_text_reads_back_as_the_same_double(value: float) -> None:
    text = js_number_text(value)
    assert text is not None
    assert float(text) == value
    assert text == "0" or not text.startswith(("-0", "0")) or text.startswith(("0.", "-0."))
    if value == int(value) and abs(value) < 1e21:
        assert text.lstrip("-").isdigit()  # an integral double below 10^21 prints without a point or an exponent
        if abs(value) <= 2**53:
            assert text == str(int(value))
    else:
        assert "." in text or "e" in text


def test_js_number_text_has_no_text_for_what_is_not_finite() -> None:
    assert js_number_text(math.inf) is None
    assert js_number_text(-math.inf) is None
    assert js_number_text(math.nan) is None

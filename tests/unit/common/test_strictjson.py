"""The strict parser: every rejection with its code, the spec subset, limits, and a property that nothing
malformed slips through."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.common.strictjson import (
    MAX_SAFE_INTEGER,
    StrictJSONError,
    check_spec,
    loads,
    loads_spec,
)

REJECTED = [
    # (input bytes, code)
    (b'{"a": "\xff"}', "json_invalid_utf8"),
    (b'{"a": "\xc3\x28"}', "json_invalid_utf8"),
    (b'"\xed\xa0\x80"', "json_invalid_utf8"),  # a surrogate encoded directly as UTF-8 (CESU-8)
    (b'\xef\xbb\xbf{"a": 1}', "json_syntax"),  # a UTF-8 byte-order mark
    (b'{"a": 1, "a": 2}', "json_duplicate_key"),
    (b'{"a": {"b": [{"c": 1, "c": 1}]}}', "json_duplicate_key"),
    (b'{"\\u0061": 1, "a": 2}', "json_duplicate_key"),  # the same key, one escaped
    (b'"\\ud800"', "json_lone_surrogate"),
    (b'"\\udc00"', "json_lone_surrogate"),
    (b'"\\ud800\\u0041"', "json_lone_surrogate"),
    (b'["ok", {"k": "\\udfff"}]', "json_lone_surrogate"),
    (b'{"\\ud800": 1}', "json_lone_surrogate"),
    (b"9007199254740992", "json_integer_range"),
    (b"-9007199254740992", "json_integer_range"),
    (b"1" + b"0" * 5000, "json_integer_range"),
    (b"NaN", "json_non_finite"),
    (b"[Infinity]", "json_non_finite"),
    (b"-Infinity", "json_non_finite"),
    (b"1e400", "json_non_finite"),
    (b"", "json_syntax"),
    (b"{", "json_syntax"),
    (b'{"a": 1,}', "json_syntax"),
    (b"[1 2]", "json_syntax"),
    (b"{'a': 1}", "json_syntax"),
    (b'"a\tb"', "json_syntax"),  # a raw control character inside a string
    (b"01", "json_syntax"),
    (b'{"a": 1} {"b": 2}', "json_syntax"),
    (b"[" * 33 + b"]" * 33, "json_too_deep"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, "json_too_deep"),
]


@pytest.mark.parametrize(("data", "code"), REJECTED)
def test_rejects_with_precise_code(data: bytes, code: str) -> None:
    with pytest.raises(StrictJSONError) as info:
        loads(data)
    assert info.value.code == code


def test_error_names_byte_offset_of_syntax_and_utf8_errors() -> None:
    with pytest.raises(StrictJSONError) as info:
        loads(b'{"a": "\xc3\xa9\xff"}')
    assert info.value.offset == 9
    assert "byte 9" in info.value.message
    with pytest.raises(StrictJSONError) as info:
        loads('{"é": x}'.encode())
    assert info.value.offset == len('{"é": '.encode())


def test_errors_never_quote_string_values() -> None:
    secret = "sk-live-" + "q" * 20
    cases = [
        json.dumps({"task": secret, "task2": secret}).replace("task2", "task").encode(),
        ('{"x": "' + secret + '", "y": "\\ud800"}').encode(),
        ('{"x": "' + secret + '" ').encode(),
    ]
    for data in cases:
        with pytest.raises(StrictJSONError) as info:
            loads(data)
        assert secret not in str(info.value)


def test_accepts_what_is_valid() -> None:
    assert loads(b' {"a": [1, -2, "x", null, true, false, 1.5, {"b": {}}]} ') == {
        "a": [1, -2, "x", None, True, False, 1.5, {"b": {}}]
    }
    assert loads(str(MAX_SAFE_INTEGER).encode()) == MAX_SAFE_INTEGER
    assert loads(str(-MAX_SAFE_INTEGER).encode()) == -MAX_SAFE_INTEGER
    assert loads(b'"\\ud83d\\ude00"') == "😀"  # a paired escape is one astral character
    assert loads('"😀 ok"'.encode()) == "😀 ok"
    assert loads(b'"[[[[{{{{"') == "[[[[{{{{"  # brackets in strings do not count as depth
    assert loads(b"[" * 32 + b"]" * 32) is not None


def test_size_limit() -> None:
    body = json.dumps({"a": "x" * 100}).encode()
    assert loads(body, max_bytes=len(body)) == {"a": "x" * 100}
    with pytest.raises(StrictJSONError) as info:
        loads(body, max_bytes=len(body) - 1)
    assert info.value.code == "json_too_large"


def test_depth_limit_is_configurable() -> None:
    assert loads(b"[[[1]]]", max_depth=3) == [[[1]]]
    with pytest.raises(StrictJSONError) as info:
        loads(b"[[[1]]]", max_depth=2)
    assert info.value.code == "json_too_deep"


def test_hostile_nesting_never_reaches_the_recursive_decoder() -> None:
    with pytest.raises(StrictJSONError) as info:
        loads(b"[" * 60000, max_bytes=100000)
    assert info.value.code == "json_too_deep"


def test_rejects_non_bytes() -> None:
    with pytest.raises(TypeError):
        loads('{"a": 1}')  # type: ignore[arg-type]


SPEC_REJECTED = [
    (b'["a"]', "json_type_not_allowed"),
    (b'"a"', "json_type_not_allowed"),
    (b'{"a": null}', "json_type_not_allowed"),
    (b'{"a": true}', "json_type_not_allowed"),
    (b'{"a": 1.5}', "json_type_not_allowed"),
    (b'{"a": 1.0}', "json_type_not_allowed"),
    (b'{"a": 1e2}', "json_type_not_allowed"),
    (b'{"a": {}}', "json_type_not_allowed"),
    (b'{"a": [1]}', "json_type_not_allowed"),
    (b'{"a": ["x", null]}', "json_type_not_allowed"),
    (b'{"a": [["x"]]}', "json_too_deep"),
    (b'{"a": 9007199254740992}', "json_integer_range"),
    (b'{"a": "x", "a": "y"}', "json_duplicate_key"),
    (b'{"a": "\\ud800"}', "json_lone_surrogate"),
    (b'{"a": ["\\udc00"]}', "json_lone_surrogate"),
    (b'{"a": "\xff"}', "json_invalid_utf8"),
]


@pytest.mark.parametrize(("data", "code"), SPEC_REJECTED)
def test_spec_subset_rejections(data: bytes, code: str) -> None:
    with pytest.raises(StrictJSONError) as info:
        loads_spec(data)
    assert info.value.code == code


def test_spec_subset_accepts_the_spec_example() -> None:
    data = (
        b'{"template":"worker","task":"Summarize ticket 42",'
        b'"tools":["ticket-api.get_ticket"],"max_runtime_seconds":900}'
    )
    assert loads_spec(data) == {
        "template": "worker",
        "task": "Summarize ticket 42",
        "tools": ["ticket-api.get_ticket"],
        "max_runtime_seconds": 900,
    }
    assert loads_spec(b'{"tools": [], "n": -3}') == {"tools": [], "n": -3}


def test_check_spec_on_python_values() -> None:
    for bad in ({"a": True}, {"a": 2**53}, {"a": ["\ud800"]}, {1: "x"}, {"a": ("x",)}, ["x"]):
        with pytest.raises(StrictJSONError):
            check_spec(bad)


# ----------------------------------------------------------------------------------------------- properties

spec_values = st.one_of(
    st.text(),
    st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER),
    st.lists(st.text(), max_size=5),
)
specs = st.dictionaries(st.text(max_size=20), spec_values, max_size=8)


@given(specs)
def test_valid_specs_round_trip(spec: dict[str, object]) -> None:
    assert loads_spec(json.dumps(spec).encode()) == spec
    assert loads_spec(json.dumps(spec, ensure_ascii=False).encode()) == spec


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_are_either_strict_json_or_refused(data: bytes) -> None:
    try:
        value = loads(data)
    except StrictJSONError:
        return
    # Whatever was accepted is valid UTF-8, was accepted by the standard parser too, and re-encodes.
    assert json.loads(data.decode("utf-8")) == value or value != value
    json.dumps(value, allow_nan=False).encode("utf-8")


@given(st.dictionaries(st.text(max_size=5), st.integers(), min_size=1, max_size=5), st.data())
def test_a_duplicated_key_is_always_refused(obj: dict[str, int], data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(sorted(obj)))
    body = json.dumps(obj)[:-1] + ", " + json.dumps(key) + ": 0}"
    with pytest.raises(StrictJSONError) as info:
        loads(body.encode())
    assert info.value.code in ("json_duplicate_key", "json_integer_range")


@given(
    st.one_of(
        st.integers(min_value=MAX_SAFE_INTEGER + 1, max_value=10**300),
        st.integers(min_value=-(10**300), max_value=-MAX_SAFE_INTEGER - 1),
    )
)
def test_out_of_range_integers_are_always_refused(n: int) -> None:
    with pytest.raises(StrictJSONError) as info:
        loads_spec(json.dumps({"n": n}).encode())
    assert info.value.code == "json_integer_range"


@given(st.integers(min_value=0xD800, max_value=0xDFFF), st.text(max_size=5))
def test_lone_surrogate_escapes_are_always_refused(code_point: int, prefix: str) -> None:
    body = json.dumps({"a": prefix})[:-2] + f"\\u{code_point:04x}" + '"}'
    with pytest.raises(StrictJSONError) as info:
        loads_spec(body.encode())
    assert info.value.code == "json_lone_surrogate"

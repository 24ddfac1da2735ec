"""The spec digest on RFC 8785 vectors, the spec's own example, and properties of stability."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.common.digest import DigestError, canonical_json, sha256_digest, spec_digest
from clawstack.common.strictjson import MAX_SAFE_INTEGER, loads, loads_spec

SPEC_EXAMPLE = (
    b'{"template":"worker","task":"Summarize ticket 42","tools":["ticket-api.get_ticket"],"max_runtime_seconds":900}'
)


def test_spec_example_digest() -> None:
    spec = loads_spec(SPEC_EXAMPLE)
    expected_bytes = (
        b'{"max_runtime_seconds":900,"task":"Summarize ticket 42","template":"worker",'
        b'"tools":["ticket-api.get_ticket"]}'
    )
    assert canonical_json(spec) == expected_bytes
    assert spec_digest(spec) == "sha256:" + hashlib.sha256(expected_bytes).hexdigest()
    assert spec_digest(spec) == "sha256:413d54082664f3353918c21cf4ec12d6c41e1ef1c9f9f01dc300635f365f2bcd"


def test_rfc8785_sorting_vector() -> None:
    # RFC 8785 section 3.2.3: keys sort by UTF-16 code units, so U+1F600 (a surrogate pair) sorts before U+FB33.
    data = (
        b'{"\\u20ac": "Euro Sign", "\\r": "Carriage Return", "\\ufb33": "Hebrew Letter Dalet With Dagesh",'
        b' "1": "One", "\\ud83d\\ude00": "Emoji: Grinning Face", "\\u0080": "Control",'
        b' "\\u00f6": "Latin Small Letter O With Diaeresis"}'
    )
    expected = (
        '{"\\r":"Carriage Return","1":"One","\u0080":"Control","ö":"Latin Small Letter O With Diaeresis",'
        '"€":"Euro Sign","😀":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}'
    ).encode()
    assert canonical_json(loads(data)) == expected


def test_rfc8785_main_example() -> None:
    # RFC 8785 section 3.2.2 (numbers, the string escaping rules, literals).
    data = (
        b'{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],'
        b' "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",'
        b' "literals": [null, true, false]}'
    )
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    ).encode()
    assert canonical_json(loads(data)) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("\u2028\u2029", '"\u2028\u2029"'.encode()),  # literal, unlike ECMAScript's JSON.stringify history
        ("\x00\x01\x1f", b'"\\u0000\\u0001\\u001f"'),  # control characters: lowercase \u00xx
        ("\b\f\n\r\t", b'"\\b\\f\\n\\r\\t"'),  # the short escapes
        ('"\\', b'"\\"\\\\"'),
        ("\x7f/é", '"\x7f/é"'.encode()),  # DEL, solidus and non-ASCII are literal
        ("𝄞", '"𝄞"'.encode()),  # outside the BMP: literal UTF-8
    ],
)
def test_rfc8785_string_vectors(value: str, expected: bytes) -> None:
    assert canonical_json(value) == expected


def test_keys_outside_the_bmp_sort_by_utf16() -> None:
    # U+10000 is D800 DC00 in UTF-16, so it sorts before U+E000 even though its code point is larger.
    assert canonical_json({"\ue000": 1, "\U00010000": 2}) == '{"\U00010000":2,"\ue000":1}'.encode()


@pytest.mark.parametrize("bad", ["\ud800", {"a": 2**53}, {"a": float("nan")}, {"a": object()}, {1: "x"}])
def test_unrepresentable_values(bad: object) -> None:
    with pytest.raises(DigestError) as info:
        spec_digest(bad)
    assert info.value.code == "digest_unrepresentable"


def test_sha256_digest_of_bytes() -> None:
    assert sha256_digest(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


spec_values = st.one_of(
    st.text(),
    st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER),
    st.lists(st.text(), max_size=4),
)
specs = st.dictionaries(st.text(max_size=12), spec_values, max_size=8)


@given(specs, st.randoms(use_true_random=False), st.sampled_from([None, 0, 2]), st.booleans())
def test_digest_is_stable_under_key_order_and_whitespace(
    spec: dict[str, object], rnd: object, indent: int | None, ascii_only: bool
) -> None:
    items = list(spec.items())
    rnd.shuffle(items)  # type: ignore[attr-defined]
    body = json.dumps(dict(items), indent=indent, ensure_ascii=ascii_only).encode()
    assert spec_digest(loads_spec(body)) == spec_digest(spec)


@given(specs)
def test_canonical_bytes_parse_back_to_the_same_value(spec: dict[str, object]) -> None:
    canonical = canonical_json(spec)
    assert loads_spec(canonical) == spec
    assert canonical_json(loads_spec(canonical)) == canonical

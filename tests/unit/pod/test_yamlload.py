"""The strict pod-file YAML loader: what it accepts (YAML 1.1, anchors, merge keys), what it refuses with which
code and text, and that no refusal quotes the file."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawstack.pod.errors import PodFileError
from clawstack.pod.yamlload import MAX_ALIASES, MAX_DEPTH, MAX_YAML_BYTES, load_yaml


def _load(text: str | bytes) -> dict[str, object]:
    return load_yaml(text.encode() if isinstance(text, str) else text, source="claw-pod.yml")


def _refusal(text: str | bytes) -> PodFileError:
    with pytest.raises(PodFileError) as caught:
        _load(text)
    assert caught.value.where == "claw-pod.yml"
    return caught.value


# -- accepted ---------------------------------------------------------------------------------------------------


def test_plain_mapping() -> None:
    assert _load("services:\n  worker:\n    image: clawstack/oneshot\n    command: [a, 'b']\n") == {
        "services": {"worker": {"image": "clawstack/oneshot", "command": ["a", "b"]}}
    }


def test_yaml_1_1_scalars() -> None:
    assert _load("a: yes\nb: off\nc: 0o17\nd: 017\ne: 1_000\nf: ~\ng: '${VAR}'\n") == {
        "a": True,
        "b": False,
        "c": "0o17",  # YAML 1.2 octal is a string in 1.1
        "d": 15,
        "e": 1000,
        "f": None,
        "g": "${VAR}",
    }


def test_merge_keys_as_compose_extension_fields_use_them() -> None:
    document = _load(
        "x-common: &common\n"
        "  image: base\n"
        "  labels: {team: a}\n"
        "x-limits: &limits\n"
        "  memory: 1g\n"
        "services:\n"
        "  worker:\n"
        "    image: mine\n"  # written before the merge, still wins over it
        "    <<: [*common, *limits]\n"
        "  other:\n"
        "    <<: *common\n"
    )
    assert document["services"] == {
        "worker": {"image": "mine", "labels": {"team": "a"}, "memory": "1g"},
        "other": {"image": "base", "labels": {"team": "a"}},
    }
    assert document["x-common"] == {"image": "base", "labels": {"team": "a"}}


def test_merge_chains_override_without_being_duplicates() -> None:
    document = _load("x-a: &a\n  k: 1\n  j: 1\nx-b: &b\n  <<: *a\n  k: 2\ns:\n  <<: *b\n  k: 3\n")
    assert document == {"x-a": {"k": 1, "j": 1}, "x-b": {"k": 2, "j": 1}, "s": {"k": 3, "j": 1}}


def test_aliases_up_to_the_limit() -> None:
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * MAX_ALIASES) + "]\n"
    assert _load(text)["b"] == [1] * MAX_ALIASES


def test_byte_order_mark_and_document_markers() -> None:
    assert _load(b"\xef\xbb\xbf---\na: 1\n...\n") == {"a": 1}


def test_size_limit_is_inclusive() -> None:
    head = b"a: 1\n#"
    assert _load(head + b"x" * (MAX_YAML_BYTES - len(head))) == {"a": 1}


def test_nesting_up_to_the_limit() -> None:
    depth = MAX_DEPTH - 1  # the top-level mapping is one level
    assert _load("a: " + "[" * (depth - 1) + "]" * (depth - 1) + "\n")["a"] is not None


# -- refused ----------------------------------------------------------------------------------------------------

REFUSED = [
    # (name, text, code, str(error))
    ("duplicate at top", "a: 1\nb: 2\na: 3\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "a" at line 3, column 1 (first defined at line 1)'),
    ("duplicate at depth", "services:\n  worker:\n    x-claw:\n      run:\n        max-runtime: 1\n"
     "        max-runtime: 9\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "max-runtime" at line 6, column 9 (first defined at line 5)'),
    ("duplicate in a list item", "a:\n  - b: 1\n    b: 2\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "b" at line 3, column 5 (first defined at line 2)'),
    ("duplicate in flow", "a: {b: 1, c: 2, b: 3}\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "b" at line 1, column 17 (first defined at line 1)'),
    ("duplicate quoted and plain", "a: 1\n'a': 2\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "a" at line 2, column 1 (first defined at line 1)'),
    ("duplicate by YAML 1.1 value", "x:\n  yes: 1\n  true: 2\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "true" at line 3, column 3 (first defined at line 2)'),
    ("duplicate in an anchored mapping", "x-c: &c\n  a: 1\n  a: 2\ns:\n  <<: *c\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "a" at line 3, column 3 (first defined at line 2)'),
    ("duplicate merge key", "x: &x {a: 1}\ny:\n  <<: *x\n  <<: *x\n", "yaml_duplicate_key",
     'claw-pod.yml: duplicate key "<<" at line 4, column 3 (first defined at line 3)'),
    ("two documents", "a: 1\n---\nb: 2\n", "yaml_multiple_documents",
     "claw-pod.yml: a second YAML document at line 2, column 1; a pod file holds exactly one"),
    ("trailing empty document", "a: 1\n---\n", "yaml_multiple_documents",
     "claw-pod.yml: a second YAML document at line 2, column 1; a pod file holds exactly one"),
    ("list", "- a\n- b\n", "yaml_not_mapping", "claw-pod.yml: the top level must be a mapping, not a list"),
    ("scalar", "just text\n", "yaml_not_mapping", "claw-pod.yml: the top level must be a mapping, not a scalar"),
    ("empty", "", "yaml_not_mapping", "claw-pod.yml: the top level must be a mapping, not an empty document"),
    ("comments only", "# nothing\n", "yaml_not_mapping",
     "claw-pod.yml: the top level must be a mapping, not an empty document"),
    ("null document", "---\n", "yaml_not_mapping", "claw-pod.yml: the top level must be a mapping, not a null"),
    ("non-string top-level key", "1: a\n", "yaml_invalid", 'claw-pod.yml: top-level key "1" is not a string'),
    ("recursive alias", "a: &a [1, *a]\n", "yaml_too_complex",
     "claw-pod.yml: an alias refers to a node that contains it (the node at line 1, column 4)"),
    ("too many aliases", "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n", "yaml_too_complex",
     f"claw-pod.yml: more than {MAX_ALIASES} aliases (one more at line 2, column {5 + 4 * MAX_ALIASES})"),
    ("too deep", "a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n", "yaml_too_complex",
     f"claw-pod.yml: nested more than {MAX_DEPTH} levels deep at line 1, column {3 + MAX_DEPTH}"),
    ("too deep through aliases", "a: &a " + "[" * 40 + "]" * 40 + "\nb: &b [[[*a]]]\n"
     "c: &c [[[[[[[[[[[[[[[[[[[[[[[[[*b]]]]]]]]]]]]]]]]]]]]]]]]]\n", "yaml_too_complex",
     f"claw-pod.yml: aliases nest the document more than {MAX_DEPTH} levels deep (the node at line 3, column 10)"),
    ("invalid date", "a: 2024-13-45\n", "yaml_invalid",
     "claw-pod.yml: invalid value at line 1, column 4: it looks like a date or a number but is not one;"
     " quote it to keep it a string"),
    ("invalid UTF-8", b"a: 1\nb: \xff\n", "yaml_invalid", "claw-pod.yml: not valid UTF-8 at line 2"),
    ("control character", "a: 1\nb: x\x00y\n", "yaml_invalid",
     "claw-pod.yml: a character YAML does not allow (U+0000) at line 2, column 5"),
    ("too large", b"a: 1\n#" + b"x" * MAX_YAML_BYTES, "yaml_too_large",
     f"claw-pod.yml: the file is larger than {MAX_YAML_BYTES} bytes (1 MiB)"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "code", "message"), [case[1:] for case in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused(text: str | bytes, code: str, message: str) -> None:
    error = _refusal(text)
    assert error.code == code
    assert str(error) == message


def test_billion_laughs() -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for index in range(1, 9):
        name, previous = "abcdefghij"[index], "abcdefghij"[index - 1]
        levels.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 10) + "]")
    error = _refusal("\n".join(levels) + "\n")
    assert error.code == "yaml_too_complex"
    assert "aliases expand the document past 100000 nodes" in error.message


SYNTAX_ERRORS = [
    # (text, str(error)): line and column, PyYAML's description, nothing quoted from the file
    ("a: 1\nb: 'sk-live-0123456789\n",
     "claw-pod.yml: while scanning a quoted scalar at line 2, column 4: found unexpected end of stream"
     " at line 3, column 1"),
    ("a: 1\n  b: sk-live-0123456789\n", "claw-pod.yml: mapping values are not allowed here at line 2, column 4"),
    ("a:\n\t- sk-live-0123456789\n",
     "claw-pod.yml: found character '\\t' that cannot start any token at line 2, column 1"),
    ("a: !!python/object/apply:os.system ['sk-live-0123456789']\n",
     "claw-pod.yml: could not determine a constructor for the tag (…) at line 1, column 4"),
    ("a: *sk-live-0123456789\n", "claw-pod.yml: found undefined alias (…) at line 1, column 4"),
    ("a: [sk-live-0123456789\n", "claw-pod.yml: while parsing a flow sequence at line 1, column 4:"
     " expected ',' or ']', but got '<stream end>' at line 2, column 1"),
    ("a: \"sk-live-0123456789\\q\"\n",
     "claw-pod.yml: while scanning a double-quoted scalar at line 1, column 4: found unknown escape character"
     " 'q' at line 1, column 24"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), SYNTAX_ERRORS)
def test_syntax_errors_do_not_quote_the_file(text: str, message: str) -> None:
    error = _refusal(text)
    assert error.code == "yaml_invalid"
    assert str(error) == message
    assert "sk-live" not in str(error)


_SECRETS = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"), min_size=16)

BROKEN_WITH_A_SECRET = [
    "a: 1\nkey: '{s}\n",
    'a: 1\nkey: "{s}\n',
    "a: 1\n  key: {s}\n",
    "a: [{s}\n",
    "a: !custom-{s} x\n",
    "a: *{s}\n",
    "a: &{s} 1\nb: &{s} 2\n",
    "a:\n  b: {s}\n\tc: 1\n",
    "a: {s}\n---\n{s}: 1\n",
    "- {s}\n",
]


# Keys are names and are shown (a duplicate key is named); values, tags, anchors and broken text are not.


@settings(max_examples=300, deadline=None)
@given(secret=_SECRETS, template=st.sampled_from(BROKEN_WITH_A_SECRET))
def test_refusals_never_quote_the_file(secret: str, template: str) -> None:
    with pytest.raises(PodFileError) as caught:
        _load(template.format(s=secret))
    assert secret not in str(caught.value)
    assert secret[:8] not in str(caught.value)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_load_or_fail_cleanly(data: bytes) -> None:
    try:
        outcome: object = load_yaml(data, source="p")
    except PodFileError as exc:
        outcome = exc.code
    assert isinstance(outcome, dict) or (isinstance(outcome, str) and outcome.startswith("yaml_"))

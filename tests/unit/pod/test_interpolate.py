"""Compose interpolation of pod files and ``.env``: every form, every error with its text, and the rule that no
message ever shows a variable's value."""

from __future__ import annotations

import datetime
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from clawstack.pod.errors import InterpolationError, PodFileError
from clawstack.pod.interpolate import (
    MAX_DOTENV_BYTES,
    UnsetVariable,
    build_environment,
    interpolate,
    read_dotenv,
    referenced_variables,
)

ENV = {
    "FOO": "first",
    "BAR": "",  # set, but empty
    "NUM_1": "n1",
    "_U": "u",
    "lower": "l",
    "DOLLAR": "$FOO ${FOO} $$ ${",  # a value holding template syntax: never interpolated again
}

SUBSTITUTIONS = [
    # (template, expected with ENV)
    ("plain text", "plain text"),
    ("", ""),
    ("$FOO", "first"),
    ("${FOO}", "first"),
    ("a${FOO}b", "afirstb"),
    ("$FOO$FOO", "firstfirst"),
    ("$FOO.x", "first.x"),
    ("$FOO-x", "first-x"),
    ("$FOO:x", "first:x"),
    ("$FOO/x", "first/x"),
    ("${NUM_1}", "n1"),
    ("$NUM_1", "n1"),
    ("$_U", "u"),
    ("${lower}", "l"),
    ("$NUM_1x", ""),  # the unbraced name runs on: NUM_1x is unset
    # escapes and a $ that starts no variable (kept as written, as Compose does)
    ("$$", "$"),
    ("$$FOO", "$FOO"),
    ("$${FOO}", "${FOO}"),
    ("$$$FOO", "$first"),
    ("$$$$", "$$"),
    ("$", "$"),
    ("costs 5$", "costs 5$"),
    ("$1", "$1"),
    ("$ x", "$ x"),
    ("$}", "$}"),
    ("$-", "$-"),
    ("$.", "$."),
    ("é${FOO}é", "éfirsté"),
    ("one\n${FOO}\nthree", "one\nfirst\nthree"),
    # unset and empty without an operator
    ("${BAR}", ""),
    ("${UNSET}", ""),
    ("$UNSET", ""),
    ("[${UNSET}]", "[]"),
    # :- and -
    ("${UNSET:-def}", "def"),
    ("${BAR:-def}", "def"),
    ("${FOO:-def}", "first"),
    ("${UNSET-def}", "def"),
    ("${BAR-def}", ""),
    ("${FOO-def}", "first"),
    ("${UNSET:-}", ""),
    ("${UNSET:-/non:-alphanumeric}", "/non:-alphanumeric"),
    ("${UNSET-myerror?msg}", "myerror?msg"),
    ("${UNSET:-a b  c}", "a b  c"),
    # :? and ? with a value
    ("${FOO:?msg}", "first"),
    ("${FOO?msg}", "first"),
    ("${BAR?msg}", ""),
    ("${FOO?bar-baz}", "first"),
    # :+ and +
    ("${FOO:+rep}", "rep"),
    ("${BAR:+rep}", ""),
    ("${UNSET:+rep}", ""),
    ("${FOO+rep}", "rep"),
    ("${BAR+rep}", "rep"),
    ("${UNSET+rep}", ""),
    # nesting
    ("${UNSET:-${FOO}}", "first"),
    ("${UNSET:-$FOO}", "first"),
    ("${UNSET-${FOO} ${FOO}}", "first first"),
    ("${BAR:-${FOO}}", "first"),
    ("${UNSET:-${ALSO_UNSET:-deep}}", "deep"),
    ("${BAR:-${UNSET:-${FOO}}}", "first"),
    ("${FOO:+[${FOO}]}", "[first]"),
    ("${FOO?$FOO}x", "firstx"),
    ("${UNSET:-a}b${FOO}", "abfirst"),
    ("${UNSET:-$${FOO}}", "${FOO}"),
    ('${UNSET:-{"k": 1}}', '{"k": 1}'),  # braces in an argument nest
    ("${UNSET:-{x}", "{x"),  # an unbalanced brace: the last } on the line closes it, as in Compose
    # values are never interpolated again
    ("${DOLLAR}", "$FOO ${FOO} $$ ${"),
    ("$DOLLAR$FOO", "$FOO ${FOO} $$ ${first"),
    ("${UNSET:-$DOLLAR}", "$FOO ${FOO} $$ ${"),
]


@pytest.mark.parametrize(("template", "expected"), SUBSTITUTIONS)
def test_substitution(template: str, expected: str) -> None:
    assert interpolate(template, ENV) == expected


INVALID = [
    "${",
    "${}",
    "${ }",
    "${ FOO}",
    "${FOO }",
    "${FOO!}",
    "${1A}",
    "${A B}",
    "${A.B}",
    "${FOO",
    "a ${FOO",
    "${FOO:}",
    "${FOO:x}",
    "${FOO:-x",
    "${UNSET:-${FOO}",  # the nested expression is unterminated
    "${UNSET:-x\ny}",  # an argument never spans lines
    "${UNSET:-${}}",
    "${FOO/foo/bar}",  # shell features Compose does not support
    "${#FOO}",
    "${!FOO}",
    "ok $FOO but ${",
]


@pytest.mark.parametrize("template", INVALID)
def test_invalid_format(template: str) -> None:
    with pytest.raises(InterpolationError) as caught:
        interpolate({"services": {"worker": {"image": template}}}, ENV)
    assert caught.value.code == "interpolation_invalid"
    assert caught.value.where == "claw-pod.yml: services.worker.image"
    assert "invalid interpolation format" in caught.value.message
    assert caught.value.message.endswith("; you may need to escape any $ with another $")


def test_invalid_format_message_is_exact() -> None:
    with pytest.raises(InterpolationError) as caught:
        interpolate({"services": {"worker": {"image": "${FOO"}}}, ENV)
    assert str(caught.value) == (
        'claw-pod.yml: services.worker.image: invalid interpolation format "${FOO"; '
        "you may need to escape any $ with another $"
    )


def test_long_template_is_cut_to_80_characters() -> None:
    template = "x" * 79 + "ABCDEFGH${"
    with pytest.raises(InterpolationError) as caught:
        interpolate({"a": template}, ENV)
    assert '"' + "x" * 79 + 'A…"' in caught.value.message
    assert "ABCD" not in caught.value.message


REQUIRED = [
    # (template, message)
    ("${UNSET:?Mandatory Variable Unset}", "required variable UNSET is missing a value: Mandatory Variable Unset"),
    ("not ok ${BAR:?Mandatory Variable Empty}", "required variable BAR is missing a value: Mandatory Variable Empty"),
    ("${UNSET:?}", "required variable UNSET is missing a value"),
    ("${UNSET?Mandatory Variable Unset}", "required variable UNSET is missing a value: Mandatory Variable Unset"),
    ("${UNSET?}", "required variable UNSET is missing a value"),
    ("${UNSET?bar-baz}", "required variable UNSET is missing a value: bar-baz"),
    # the message is shown as written: its references are never substituted into an error
    ("${UNSET:?need ${FOO}}", "required variable UNSET is missing a value: need ${FOO}"),
    # arguments are interpolated even when unused, as Compose does, so this fails although FOO is set
    ("${FOO:-${UNSET:?inner}}", "required variable UNSET is missing a value: inner"),
    ("${UNSET:-x} ${UNSET2:?second}", "required variable UNSET2 is missing a value: second"),
]


@pytest.mark.parametrize(("template", "message"), REQUIRED)
def test_required_variable(template: str, message: str) -> None:
    with pytest.raises(InterpolationError) as caught:
        interpolate({"x": template}, ENV)
    assert caught.value.code == "interpolation_required"
    assert str(caught.value) == f"claw-pod.yml: x: {message}"


def test_required_message_is_cut_to_80_characters() -> None:
    with pytest.raises(InterpolationError) as caught:
        interpolate("${UNSET:?" + "m" * 100 + "}", ENV)
    assert str(caught.value) == "claw-pod.yml: required variable UNSET is missing a value: " + "m" * 80 + "…"


def test_error_path_names_the_value() -> None:
    document = {"services": {"worker": {"x-claw": {"models": {"primary": "${READER_MODEL:?set it in .env}"}}}}}
    with pytest.raises(InterpolationError) as caught:
        interpolate(document, {})
    assert caught.value.where == "claw-pod.yml: services.worker.x-claw.models.primary"
    assert str(caught.value) == (
        "claw-pod.yml: services.worker.x-claw.models.primary: "
        "required variable READER_MODEL is missing a value: set it in .env"
    )


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ({"services": {"worker": {"command": ["run", "${"]}}}, "pod.yml: services.worker.command[1]"),
        ({"a": [{"b": ["${"]}]}, "pod.yml: a[0].b[0]"),
        ({1: "${"}, "pod.yml: 1"),
        ("${", "pod.yml"),
        (["${"], "pod.yml: [0]"),
    ],
)
def test_error_paths(document: Any, where: str) -> None:
    with pytest.raises(InterpolationError) as caught:
        interpolate(document, {}, source="pod.yml")
    assert caught.value.where == where


def test_document_walk() -> None:
    when = datetime.date(2024, 1, 2)
    document = {
        "${FOO}": "${FOO}",  # keys are never interpolated
        "nested": {"list": ["$FOO", {"deeper": "${BAR:-d}"}, 3, None], "n": 1.5},
        "flags": [True, False],
        "when": when,
    }
    before = repr(document)
    result = interpolate(document, ENV)
    assert result == {
        "${FOO}": "first",
        "nested": {"list": ["first", {"deeper": "d"}, 3, None], "n": 1.5},
        "flags": [True, False],
        "when": when,
    }
    assert repr(document) == before  # the input is not changed
    assert result["nested"] is not document["nested"]


def test_unset_variables_are_reported() -> None:
    warnings: list[UnsetVariable] = []
    document = {"a": "$X ${Y} ${Z:-d} ${W:+r} ${V-d} ${BAR}", "b": ["${X}"], "c": "${FOO:-$EAGER}"}
    assert interpolate(document, ENV, warnings=warnings) == {"a": "  d  d ", "b": [""], "c": "first"}
    assert warnings == [
        UnsetVariable("X", "claw-pod.yml: a"),
        UnsetVariable("Y", "claw-pod.yml: a"),
        UnsetVariable("X", "claw-pod.yml: b[0]"),
        UnsetVariable("EAGER", "claw-pod.yml: c"),  # Compose warns for an unused default's references too
    ]
    assert str(warnings[0]) == 'claw-pod.yml: a: the "X" variable is not set; defaulting to a blank string'


def test_unset_variables_without_a_list() -> None:
    assert interpolate("${X}", {}) == ""


@pytest.mark.parametrize(
    ("document", "names"),
    [
        ("plain", set()),
        ("$A ${B} ${C:-$D} ${E:?${F}} ${G:+x} ${H-y}", {"A", "B", "C", "D", "E", "F", "G", "H"}),
        ("$$A $${B} $1", set()),
        ({"${KEY}": "x", "v": ["$A", {"w": "${B:-${C:-${D}}}"}], "n": 1}, {"A", "B", "C", "D"}),
    ],
)
def test_referenced_variables(document: Any, names: set[str]) -> None:
    assert referenced_variables(document) == names


def test_referenced_variables_refuses_invalid_templates() -> None:
    with pytest.raises(InterpolationError) as caught:
        referenced_variables({"a": {"b": "${"}}, source="p.yml")
    assert caught.value.where == "p.yml: a.b"
    assert caught.value.code == "interpolation_invalid"


def test_nesting_is_bounded() -> None:
    deep = "${A:-" * 40 + "x" + "}" * 40
    with pytest.raises(InterpolationError):
        interpolate(deep, {})
    shallow = "${A:-" * 20 + "x" + "}" * 20
    assert interpolate(shallow, {}) == "x"


# -- no value in any message --------------------------------------------------------------------------------

_SECRETS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=40)

FAILING_TEMPLATES = [
    "${SECRET} ${",
    "$SECRET${}",
    "${SECRET:-x} ${MISSING:?need it}",
    "${MISSING:?${SECRET}}",
    "${MISSING:?$SECRET}",
    "${SECRET:+${MISSING:?m}}",
    "${SECRET:-${MISSING?m}}",
    "${EMPTY:?${SECRET:-}}",
    "${SECRET}${SECRET:-${1}}",
]


def _outcome(document: Any, env: dict[str, str]) -> tuple[str, list[str]]:
    """What interpolating ``document`` shows a person: the error's text, if any, and the warnings."""
    warnings: list[UnsetVariable] = []
    try:
        interpolate(document, env, warnings=warnings)
    except InterpolationError as exc:
        return f"{exc} {exc!r} {exc.where}", [str(w) for w in warnings]
    return "", [str(w) for w in warnings]


# The messages are the same whatever the values are, so they cannot contain one; and, where the secret is
# not a fragment of the template or of the fixed wording, the secret is checked for directly as well.


@settings(max_examples=200, deadline=None)
@given(secret=_SECRETS, template=st.sampled_from(FAILING_TEMPLATES))
def test_no_value_in_interpolation_errors(secret: str, template: str) -> None:
    document = {"services": {"w": {"image": template}}}
    shown = _outcome(document, {"SECRET": secret, "EMPTY": ""})
    placeholder = _outcome(document, {"SECRET": "placeholder", "EMPTY": ""})
    assert shown[0]
    assert shown == placeholder
    assume(secret not in placeholder[0])
    assert secret not in shown[0]


_TEMPLATE_ATOMS = st.sampled_from(["$", "{", "}", ":", "-", "?", "+", "SECRET", "MISSING", "EMPTY", "x", " ", "1"])


@settings(max_examples=500, deadline=None)
@given(secret=_SECRETS, atoms=st.lists(_TEMPLATE_ATOMS, max_size=20))
def test_arbitrary_templates_fail_cleanly_and_never_leak(secret: str, atoms: list[str]) -> None:
    document = {"k": "".join(atoms)}
    assert _outcome(document, {"SECRET": secret, "EMPTY": ""}) == _outcome(
        document, {"SECRET": "placeholder", "EMPTY": ""}
    )


@settings(max_examples=200, deadline=None)
@given(value=st.text(max_size=40))
def test_environment_values_are_never_interpolated_again(value: str) -> None:
    assert interpolate(["${V}", "$V", "${U:-$V}", "${V:+$V}"], {"V": value}) == [value, value, value, value]


# -- .env ---------------------------------------------------------------------------------------------------


def _dotenv(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / ".env"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_dotenv_syntax(tmp_path: Path) -> None:
    path = _dotenv(
        tmp_path,
        "# a comment\n"
        "PLAIN=value\n"
        "export EXPORTED=yes\n"
        "\n"
        "SPACED = padded   \n"
        "INLINE=kept # dropped\n"
        "HASH=a#b\n"
        "EMPTY=\n"
        "COMMENT_ONLY= # nothing\n"
        "SINGLE='${PLAIN} $$ \\n'\n"
        'DOUBLE="${PLAIN} $$ a\\nb \\"q\\""\n'
        'MULTI="one\ntwo"\n'
        "REF=${PLAIN}-$PLAIN\n"
        "DEFAULTED=${NOPE:-fallback}\n"
        "1DIGIT=ignored\n"
        "DOTTED.KEY=kept\n"
        "TWICE=first\n"
        "TWICE=second\n",
    )
    assert read_dotenv(path, environ={}) == {
        "PLAIN": "value",
        "EXPORTED": "yes",
        "SPACED": "padded",
        "INLINE": "kept",
        "HASH": "a#b",
        "EMPTY": "",
        "COMMENT_ONLY": "",
        "SINGLE": "${PLAIN} $$ \\n",  # single quotes: no interpolation, as in Compose
        "DOUBLE": 'value $ a\nb "q"',
        "MULTI": "one\ntwo",
        "REF": "value-value",
        "DEFAULTED": "fallback",
        "DOTTED.KEY": "kept",
        "TWICE": "second",
    }


def test_dotenv_bare_key_is_unset(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "BARE\nUSES=[${BARE}]\n")
    assert read_dotenv(path, environ={}) == {"USES": "[]"}
    # A bare key names a variable to take from the environment.
    assert read_dotenv(path, environ={"BARE": "env"}) == {"USES": "[env]"}
    assert build_environment(read_dotenv(path, environ={"BARE": "env"}), {"BARE": "env"})["BARE"] == "env"


def test_dotenv_references_prefer_the_environment(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "A=file\nB=${A}\nC=${LATER}\nLATER=x\nD=$HOME_ONLY\n")
    warnings: list[UnsetVariable] = []
    values = read_dotenv(path, environ={"A": "env", "HOME_ONLY": "h"}, warnings=warnings)
    assert values == {"A": "file", "B": "env", "C": "", "LATER": "x", "D": "h"}
    assert warnings == [UnsetVariable("LATER", ".env: line 3")]


def test_dotenv_environment_defaults_to_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAW_TEST_FROM_PROCESS", "proc")
    path = _dotenv(tmp_path, "A=${CLAW_TEST_FROM_PROCESS}\n")
    assert read_dotenv(path) == {"A": "proc"}


def test_dotenv_values_are_not_interpolated_again(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "A='$$B ${C}'\nB=${A}\n")
    assert read_dotenv(path, environ={"C": "no"}) == {"A": "$$B ${C}", "B": "$$B ${C}"}


def test_dotenv_line_endings_and_bom(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, b"\xef\xbb\xbfA=1\r\nB=${A}2\r\n")
    assert read_dotenv(path, environ={}) == {"A": "1", "B": "12"}


def test_dotenv_missing_file(tmp_path: Path) -> None:
    assert read_dotenv(tmp_path / ".env", environ={}) == {}


def test_build_environment_precedence() -> None:
    assert build_environment({"A": "file", "B": "file"}, {"B": "env", "C": "env"}) == {
        "A": "file",
        "B": "env",
        "C": "env",
    }


DOTENV_ERRORS = [
    # (file text, error type, code, str(error))
    ('A=1\n\n\nB="sk-unterminated\n', PodFileError, "dotenv_invalid",
     ".env: line 4: cannot be parsed; check its quoting and its KEY=value form"),
    ("A=1\nsk-live-abc=1\n", PodFileError, "dotenv_invalid",
     ".env: line 2: a variable name may contain only letters, digits, '_' and '.'"),
    ("'A B'=1\n", PodFileError, "dotenv_invalid",
     ".env: line 1: a variable name may contain only letters, digits, '_' and '.'"),
    (b"A=1\nB=\xff\n", PodFileError, "dotenv_invalid", ".env: line 2: not valid UTF-8"),
    ("A=ok\nTOKEN=${NEEDED:?set NEEDED first}\n", InterpolationError, "interpolation_required",
     ".env: line 2: TOKEN: required variable NEEDED is missing a value: set NEEDED first"),
    ("A=ok\nTOKEN=sk-secret-${\n", InterpolationError, "interpolation_invalid",
     ".env: line 2: TOKEN: invalid interpolation format; you may need to escape any $ with another $"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "error", "code", "message"), DOTENV_ERRORS)
def test_dotenv_errors(tmp_path: Path, text: str | bytes, error: type[Exception], code: str, message: str) -> None:
    with pytest.raises(error) as caught:
        read_dotenv(_dotenv(tmp_path, text), environ={})
    assert isinstance(caught.value, PodFileError | InterpolationError)
    assert caught.value.code == code
    assert str(caught.value) == message
    assert "sk-" not in str(caught.value)


def test_dotenv_too_large(tmp_path: Path) -> None:
    path = _dotenv(tmp_path, "A=" + "x" * MAX_DOTENV_BYTES)
    with pytest.raises(PodFileError) as caught:
        read_dotenv(path, environ={})
    assert caught.value.code == "dotenv_invalid"


def test_dotenv_unreadable(tmp_path: Path) -> None:
    (tmp_path / ".env").mkdir()
    with pytest.raises(PodFileError) as caught:
        read_dotenv(tmp_path / ".env", environ={})
    assert caught.value.code == "dotenv_unreadable"


# What fits between single quotes on one line of a .env.
_DOTENV_SECRETS = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp"), exclude_characters="'\\"),
    min_size=1,
    max_size=40,
)

FAILING_DOTENV_LINES = [
    "BROKEN=${SECRET}${",
    "BROKEN=${MISSING:?${SECRET}}",
    'BROKEN="unterminated ${SECRET}',
    "BROKEN=${SECRET:+${MISSING:?m}}",
]


def _dotenv_error(text: str) -> str:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / ".env"
        path.write_text(text, encoding="utf-8")
        with pytest.raises((PodFileError, InterpolationError)) as caught:
            read_dotenv(path, environ={})
    return f"{caught.value} {caught.value!r}"


@settings(max_examples=100, deadline=None)
@given(secret=_DOTENV_SECRETS, line=st.sampled_from(FAILING_DOTENV_LINES))
def test_no_value_in_dotenv_errors(secret: str, line: str) -> None:
    template = "SECRET='{}'\nCOPY=${{SECRET}}\n{}\n"
    shown = _dotenv_error(template.format(secret, line))
    placeholder = _dotenv_error(template.format("placeholder", line))
    assert shown == placeholder
    assume(secret not in placeholder)
    assert secret not in shown

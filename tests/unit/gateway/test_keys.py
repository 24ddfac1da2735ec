"""The session-key grammar and agent-id normalisation."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawstack.gateway.keys import (
    AgentIdError,
    SessionKey,
    SessionKeyError,
    channel_key,
    hook_key,
    main_key,
    normalize_agent_id,
    normalize_session_key,
    parse_session_key,
    subagent_key,
    thread_key,
)

UUID4 = "8451abfc-b6f5-4fac-8882-96cd5fbdeda5"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("main", "main"),
        ("Main", "main"),
        ("MAIL-bot_2", "mail-bot_2"),
        ("0", "0"),
        ("a" * 64, "a" * 64),
        ("9lives", "9lives"),
    ],
)
def test_normalize_agent_id_accepts(raw: str, expected: str) -> None:
    assert normalize_agent_id(raw) == expected


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("", "must not be empty"),
        ("a" * 65, "at most 64 characters, not 65"),
        ("-main", "must start with a letter or digit"),
        ("_main", "must start with a letter or digit"),
        (" main", "must start with a letter or digit"),
        ("main ", "character 4 (U+0020) is not allowed"),
        ("ma.in", "character 2 (U+002E) is not allowed"),
        ("ma:in", "character 2 (U+003A) is not allowed"),
        ("\u212a", "character 0 (U+212A) is not ASCII"),  # the Kelvin sign lower-cases to "k"; refused, not folded
        ("mäin", "character 1 (U+00E4) is not ASCII"),
        (None, "must be a string, not NoneType"),
        (7, "must be a string, not int"),
    ],
)
def test_normalize_agent_id_refuses(raw: object, fragment: str) -> None:
    with pytest.raises(AgentIdError) as info:
        normalize_agent_id(raw)
    assert fragment in info.value.message
    assert info.value.code == "agent_id_invalid"


VALID_KEYS = [
    ("agent:main:main", SessionKey("main", "main", "main"), "agent:main:main"),
    ("agent:Main:main", SessionKey("main", "main", "main"), "agent:main:main"),
    (f"agent:main:subagent:{UUID4}", SessionKey("subagent", "main", f"subagent:{UUID4}"), None),
    ("agent:main:subagent:search-helper", SessionKey("subagent", "main", "subagent:search-helper"), None),
    ("agent:a:channel:webhook:alice", SessionKey("channel", "a", "channel:webhook:alice"), None),
    (
        "agent:a:channel:webhook:alice@example.com",
        SessionKey("channel", "a", "channel:webhook:alice@example.com"),
        None,
    ),
    ("agent:main:main:thread:42", SessionKey("thread", "main", "main:thread:42"), None),
    ("agent:m:subagent:x:thread:1712345678.123", SessionKey("thread", "m", "subagent:x:thread:1712345678.123"), None),
    ("agent:a:channel:c:p:thread:T", SessionKey("thread", "a", "channel:c:p:thread:T"), None),
    ("hook:imap:account:123:456", SessionKey("hook", None, "imap:account:123:456"), None),
    ("hook:x", SessionKey("hook", None, "x"), None),
    ("hook:Ünïcode/ok", SessionKey("hook", None, "Ünïcode/ok"), None),
    ("hook:" + "a" * 251, SessionKey("hook", None, "a" * 251), None),
]


@pytest.mark.parametrize(("key", "parsed", "normalised"), VALID_KEYS)
def test_parse_valid_keys(key: str, parsed: SessionKey, normalised: str | None) -> None:
    assert parse_session_key(key) == parsed
    assert str(parsed) == (normalised or key)
    assert normalize_session_key(key) == (normalised or key)


INVALID_KEYS = [
    ("", SessionKeyError, "must not be empty"),
    ("main", SessionKeyError, "starts with 'agent:' or 'hook:'"),
    ("Agent:main:main", SessionKeyError, "starts with 'agent:' or 'hook:'"),
    ("HOOK:x", SessionKeyError, "starts with 'agent:' or 'hook:'"),
    ("hook:", SessionKeyError, "needs a name"),
    ("hook:a b", SessionKeyError, "character 6 (U+0020) is whitespace"),
    ("hook:a\tb", SessionKeyError, "character 6 (U+0009)"),
    ("hook:a\x00", SessionKeyError, "character 6 (U+0000)"),
    ("hook:a\u200bb", SessionKeyError, "character 6 (U+200B)"),  # zero-width space: a format character
    ("hook:a\u00a0b", SessionKeyError, "character 6 (U+00A0)"),  # no-break space
    ("hook:\ud800", SessionKeyError, "character 5 (U+D800)"),  # lone surrogate
    ("hook:" + "a" * 252, SessionKeyError, "at most 256 characters, not 257"),
    ("agent:main", SessionKeyError, "followed by main, subagent or channel"),
    ("agent:main:", SessionKeyError, "continues with 'main'"),
    ("agent::main", AgentIdError, "must not be empty"),
    ("agent:-x:main", AgentIdError, "must start with a letter or digit"),
    ("agent:main:MAIN", SessionKeyError, "continues with 'main'"),
    ("agent:main:other", SessionKeyError, "continues with 'main'"),
    ("agent:main:main:extra", SessionKeyError, "followed only by ':thread:<thread-id>'"),
    ("agent:main:subagent", SessionKeyError, "missing its id"),
    ("agent:main:subagent:", SessionKeyError, "subagent id must not be empty"),
    ("agent:main:subagent:-x", SessionKeyError, "must start with an ASCII letter or digit"),
    ("agent:main:subagent:a/b", SessionKeyError, "subagent id character 1 (U+002F)"),
    ("agent:main:subagent:é", SessionKeyError, "must start with an ASCII letter or digit"),
    ("agent:main:subagent:" + "a" * 129, SessionKeyError, "at most 128 characters, not 129"),
    ("agent:main:channel:webhook", SessionKeyError, "missing its peer"),
    ("agent:main:channel::alice", SessionKeyError, "channel name must not be empty"),
    ("agent:main:main:thread", SessionKeyError, "exactly one ':thread:<thread-id>'"),
    ("agent:main:main:thread:", SessionKeyError, "thread id must not be empty"),
    ("agent:main:main:thread:1:thread:2", SessionKeyError, "exactly one ':thread:<thread-id>'"),
    ("agent:main:thread:1", SessionKeyError, "continues with 'main'"),
    ("agent:main:main ", SessionKeyError, "character 15 (U+0020)"),
    (None, SessionKeyError, "must be a string, not NoneType"),
    (b"agent:main:main", SessionKeyError, "must be a string, not bytes"),
]


@pytest.mark.parametrize(("key", "error", "fragment"), INVALID_KEYS)
def test_parse_invalid_keys(key: object, error: type[SessionKeyError], fragment: str) -> None:
    with pytest.raises(error) as info:
        parse_session_key(key)
    assert type(info.value) is error
    assert fragment in info.value.message
    assert info.value.code == ("agent_id_invalid" if error is AgentIdError else "session_key_invalid")


def test_error_messages_never_quote_the_key() -> None:
    with pytest.raises(SessionKeyError) as info:
        parse_session_key("hook:secret-account-4711 x")
    assert "secret" not in info.value.message
    assert "4711" not in info.value.message


def test_builders() -> None:
    assert main_key("Main") == "agent:main:main"
    assert subagent_key("Research", UUID4) == f"agent:research:subagent:{UUID4}"
    assert subagent_key("r", uuid.UUID(UUID4.upper())) == f"agent:r:subagent:{UUID4}"
    minted = parse_session_key(subagent_key("r"))
    assert minted.kind == "subagent"
    assert uuid.UUID(minted.rest.split(":")[1]).version == 4
    assert channel_key("a", "webhook", "alice") == "agent:a:channel:webhook:alice"
    assert thread_key("agent:Main:main", "42") == "agent:main:main:thread:42"
    assert thread_key(parse_session_key("agent:a:channel:c:p"), "t") == "agent:a:channel:c:p:thread:t"
    assert hook_key("imap:account:123:456") == "hook:imap:account:123:456"


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: main_key("no spaces"), "not allowed"),
        (lambda: subagent_key("a", "not-a-uuid"), "needs a UUID"),
        (lambda: subagent_key("a", str(uuid.uuid1())), "version-4 UUID, not version 1"),
        (lambda: channel_key("a", "web:hook", "p"), "channel name character 3 (U+003A)"),
        (lambda: channel_key("a", "webhook", ""), "channel peer must not be empty"),
        (lambda: thread_key("hook:x", "1"), "cannot have threads"),
        (lambda: thread_key("agent:a:main:thread:1", "2"), "threads do not nest"),
        (lambda: thread_key("agent:a:main", "a:b"), "thread id character 1"),
        (lambda: thread_key("agent:" + "a" * 64 + ":subagent:" + "s" * 128, "t" * 100), "at most 256"),
        (lambda: hook_key(""), "needs a name"),
        (lambda: hook_key("a\nb"), "character 6 (U+000A)"),
        (lambda: hook_key("x" * 252), "at most 256 characters, not 257"),
    ],
)
def test_builders_refuse(call: object, fragment: str) -> None:
    assert callable(call)
    with pytest.raises(SessionKeyError) as info:
        call()
    assert fragment in info.value.message


def test_thread_accessors() -> None:
    key = parse_session_key("agent:m:subagent:x:thread:9")
    assert key.thread_id == "9"
    assert key.base == parse_session_key("agent:m:subagent:x")
    main = parse_session_key("agent:m:main")
    assert main.thread_id is None
    assert main.base is main
    assert parse_session_key("agent:m:main:thread:1").base == main
    assert parse_session_key("agent:m:channel:c:p:thread:1").base == parse_session_key("agent:m:channel:c:p")


# -- properties ---------------------------------------------------------------------------------------------------

agent_ids = st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}", fullmatch=True)
segments = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,40}", fullmatch=True)
hook_names = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp")), min_size=1, max_size=200
).filter(lambda s: not any(ch.isspace() for ch in s))


@st.composite
def built_keys(draw: st.DrawFn) -> str:
    agent = draw(agent_ids)
    form = draw(st.sampled_from(["main", "subagent", "channel", "hook"]))
    if form == "hook":
        return hook_key(draw(hook_names))
    if form == "main":
        base = main_key(agent)
    elif form == "subagent":
        base = subagent_key(agent, uuid.UUID(int=draw(st.integers(0, 2**128 - 1)), version=4))
    else:
        base = channel_key(agent, draw(segments), draw(segments))
    if draw(st.booleans()):
        return thread_key(base, draw(segments))
    return base


@given(built_keys())
def test_built_keys_round_trip(key: str) -> None:
    parsed = parse_session_key(key)
    assert str(parsed) == key
    assert parse_session_key(str(parsed)) == parsed
    if parsed.kind == "thread":
        assert thread_key(parsed.base, parsed.thread_id or "") == key


@given(agent_ids)
def test_agent_id_normalisation_is_idempotent(raw: str) -> None:
    once = normalize_agent_id(raw)
    assert once == raw.lower()
    assert normalize_agent_id(once) == once


@given(st.one_of(st.text(max_size=300), st.from_regex(r"(agent|hook):.{0,80}", fullmatch=True)))
def test_arbitrary_strings_parse_or_raise_the_module_error(text: str) -> None:
    try:
        parsed = parse_session_key(text)
    except SessionKeyError:
        return
    # Whatever parses is a fixed point of normalisation, which changes only the agent id's case.
    assert normalize_session_key(str(parsed)) == str(parsed)
    if parsed.kind == "hook":
        assert str(parsed) == text
    else:
        prefix, agent, rest = text.split(":", 2)
        assert str(parsed) == f"{prefix}:{agent.lower()}:{rest}"

"""Session keys and agent ids: the grammar, parsing, normalisation and the builders.

A session key names one conversation on the gateway. Every key is one of::

    session-key  = agent-key / hook-key                       ; at most 256 characters in all
    agent-key    = base-key [ ":thread:" segment ]
    base-key     = "agent:" agent-id ":" ( "main"
                                         / "subagent:" segment
                                         / "channel:" segment ":" segment )
    hook-key     = "hook:" hook-name
    agent-id     = [a-z0-9] [a-z0-9_-]{0,63}                  ; see normalize_agent_id
    segment      = [A-Za-z0-9] [A-Za-z0-9._@+-]{0,127}        ; no ":" so a key splits unambiguously
    hook-name    = 1*( any character but whitespace, control, format, surrogate, private-use or unassigned )

Examples: ``agent:main:main`` (an agent's main session), ``agent:main:subagent:<uuid4>`` (a background child;
:func:`subagent_key` always mints a UUID4, but plugins may name their own, as in ``agent:main:subagent:search-helper``),
``agent:main:channel:webhook:alice`` (a channel peer), ``agent:main:main:thread:42`` (a thread under any base key;
threads do not nest) and ``hook:imap:account:123:456`` (a hook-dispatched session; its agent is chosen by the caller,
not by the key).

Normalisation: the agent id inside a key is lower-cased (``agent:Main:main`` becomes ``agent:main:main``); the
literal words (``agent``, ``main``, ``subagent``, ``channel``, ``thread``, ``hook``) must already be lower case, and
segments and hook names keep their case. ``str(parse_session_key(k))`` is the normalised key.

Errors::

    GatewayError                  (clawstack.gateway.errors)
     └── SessionKeyError          code "session_key_invalid"
          └── AgentIdError        code "agent_id_invalid"

Messages name the rule that failed and the position of an offending character (as a code point), never the key's
text, since hook names may carry account identifiers.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final, Literal
from uuid import UUID, uuid4

from clawstack.gateway.errors import GatewayError

SessionKind = Literal["main", "subagent", "channel", "thread", "hook"]
"""What a session key names; ``thread`` keys also have a base key (:attr:`SessionKey.base`)."""

MAX_SESSION_KEY_LENGTH: Final = 256
MAX_AGENT_ID_LENGTH: Final = 64
MAX_SEGMENT_LENGTH: Final = 128

_SEGMENT_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}")
_BASE_ARITY: Final = {"main": 1, "subagent": 2, "channel": 3}
_FORBIDDEN_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})


class SessionKeyError(GatewayError):
    """A session key does not follow the grammar in this module's docstring."""

    code = "session_key_invalid"


class AgentIdError(SessionKeyError):
    """An agent id is not ``[a-z0-9][a-z0-9_-]{0,63}`` after lower-casing."""

    code = "agent_id_invalid"


@dataclass(frozen=True, slots=True)
class SessionKey:
    """A parsed, normalised session key.

    ``kind`` says what it names; ``agent_id`` is the key's agent (``None`` for hook keys); ``rest`` is everything
    after ``agent:<id>:`` (for agent keys) or after ``hook:`` (the hook name). ``str(key)`` is the key's text.
    """

    kind: SessionKind
    agent_id: str | None
    rest: str

    def __str__(self) -> str:
        if self.agent_id is None:
            return f"hook:{self.rest}"
        return f"agent:{self.agent_id}:{self.rest}"

    @property
    def text(self) -> str:
        """The normalised key as a string (the same as ``str(self)``)."""
        return str(self)

    @property
    def thread_id(self) -> str | None:
        """The thread id of a ``thread`` key, else ``None``."""
        if self.kind != "thread":
            return None
        return self.rest.rsplit(":", 1)[1]

    @property
    def base(self) -> SessionKey:
        """The key a thread hangs from; any other key is its own base."""
        if self.kind != "thread":
            return self
        base_rest = self.rest.rsplit(":", 2)[0]
        kind = base_rest.split(":", 1)[0]
        if kind == "main":
            return SessionKey("main", self.agent_id, base_rest)
        if kind == "subagent":
            return SessionKey("subagent", self.agent_id, base_rest)
        return SessionKey("channel", self.agent_id, base_rest)


def _describe(ch: str) -> str:
    return f"U+{ord(ch):04X}"


def normalize_agent_id(raw: object) -> str:
    """Lower-case ``raw`` and check it is ``[a-z0-9][a-z0-9_-]{0,63}``; raise :class:`AgentIdError` otherwise.

    Only ASCII is lower-cased: a non-ASCII character is refused rather than folded (``"\\u212a"``, the Kelvin sign,
    would otherwise become ``"k"``). Surrounding whitespace is refused, not trimmed.
    """
    if not isinstance(raw, str):
        raise AgentIdError(f"an agent id must be a string, not {type(raw).__name__}")
    if not raw:
        raise AgentIdError("an agent id must not be empty")
    if len(raw) > MAX_AGENT_ID_LENGTH:
        raise AgentIdError(f"an agent id has at most {MAX_AGENT_ID_LENGTH} characters, not {len(raw)}")
    for index, ch in enumerate(raw):
        if not ch.isascii():
            raise AgentIdError(f"agent id character {index} ({_describe(ch)}) is not ASCII")
    value = raw.lower()
    if not ("a" <= value[0] <= "z" or "0" <= value[0] <= "9"):
        raise AgentIdError(f"an agent id must start with a letter or digit, not {_describe(value[0])}")
    for index, ch in enumerate(value):
        if not ("a" <= ch <= "z" or "0" <= ch <= "9" or ch in "_-"):
            raise AgentIdError(
                f"agent id character {index} ({_describe(ch)}) is not allowed: use letters, digits, '_' and '-'"
            )
    return value


def _check_segment(value: str, what: str) -> str:
    if not value:
        raise SessionKeyError(f"a {what} must not be empty")
    if len(value) > MAX_SEGMENT_LENGTH:
        raise SessionKeyError(f"a {what} has at most {MAX_SEGMENT_LENGTH} characters, not {len(value)}")
    if _SEGMENT_RE.fullmatch(value) is None:
        for index, ch in enumerate(value):
            if index == 0 and not (ch.isascii() and ch.isalnum()):
                raise SessionKeyError(f"a {what} must start with an ASCII letter or digit, not {_describe(ch)}")
            if not (ch.isascii() and (ch.isalnum() or ch in "._@+-")):
                raise SessionKeyError(
                    f"{what} character {index} ({_describe(ch)}) is not allowed: use ASCII letters, digits and ._@+-"
                )
    return value


def _check_text(key: object) -> str:
    if not isinstance(key, str):
        raise SessionKeyError(f"a session key must be a string, not {type(key).__name__}")
    if not key:
        raise SessionKeyError("a session key must not be empty")
    if len(key) > MAX_SESSION_KEY_LENGTH:
        raise SessionKeyError(f"a session key has at most {MAX_SESSION_KEY_LENGTH} characters, not {len(key)}")
    for index, ch in enumerate(key):
        if ch.isspace() or unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise SessionKeyError(
                f"session key character {index} ({_describe(ch)}) is whitespace or a control, format, surrogate, "
                "private-use or unassigned character"
            )
    return key


def _parse_agent_key(key: str) -> SessionKey:
    parts = key.split(":")
    if len(parts) < 3:
        raise SessionKeyError("an agent session key is 'agent:<agent-id>:' followed by main, subagent or channel")
    agent_id = normalize_agent_id(parts[1])
    tail = parts[2:]
    word = tail[0]
    arity = _BASE_ARITY.get(word)
    if arity is None:
        raise SessionKeyError(
            "after 'agent:<agent-id>:' a session key continues with 'main', 'subagent:<id>' or "
            "'channel:<channel>:<peer>'"
        )
    if len(tail) < arity:
        raise SessionKeyError(f"a {word} session key is missing its {'id' if word == 'subagent' else 'peer'}")
    if word == "subagent":
        _check_segment(tail[1], "subagent id")
    elif word == "channel":
        _check_segment(tail[1], "channel name")
        _check_segment(tail[2], "channel peer")
    extra = tail[arity:]
    kind: SessionKind = "main" if word == "main" else "subagent" if word == "subagent" else "channel"
    if extra:
        if extra[0] != "thread":
            raise SessionKeyError(f"a {word} session key may be followed only by ':thread:<thread-id>'")
        if len(extra) != 2:
            raise SessionKeyError("a thread session key ends with exactly one ':thread:<thread-id>'")
        _check_segment(extra[1], "thread id")
        kind = "thread"
    return SessionKey(kind, agent_id, ":".join(tail))


def parse_session_key(key: object) -> SessionKey:
    """Parse and normalise a session key; raise :class:`SessionKeyError` (or :class:`AgentIdError`) if invalid.

    ``key`` may be any value (it often comes from a request); anything but a valid key string is refused.
    """
    key = _check_text(key)
    if key.startswith("hook:"):
        if len(key) == len("hook:"):
            raise SessionKeyError("a hook session key needs a name after 'hook:'")
        return SessionKey("hook", None, key[len("hook:") :])
    if key.startswith("agent:"):
        return _parse_agent_key(key)
    raise SessionKeyError("a session key starts with 'agent:' or 'hook:'")


def normalize_session_key(key: object) -> str:
    """The normalised text of ``key`` (its agent id lower-cased); raise :class:`SessionKeyError` if invalid."""
    return str(parse_session_key(key))


def main_key(agent_id: str) -> str:
    """``agent:<id>:main``, the agent's main session."""
    return f"agent:{normalize_agent_id(agent_id)}:main"


def subagent_key(agent_id: str, uuid: UUID | str | None = None) -> str:
    """``agent:<id>:subagent:<uuid4>``; a fresh UUID4 when ``uuid`` is ``None``.

    A given ``uuid`` must be a version-4 UUID; it is written in canonical lower-case form.
    """
    agent = normalize_agent_id(agent_id)
    if uuid is None:
        value = uuid4()
    elif isinstance(uuid, UUID):
        value = uuid
    else:
        try:
            value = UUID(uuid)
        except (ValueError, TypeError, AttributeError) as exc:
            raise SessionKeyError("a subagent key needs a UUID") from exc
    if value.version != 4:
        raise SessionKeyError(f"a subagent key needs a version-4 UUID, not version {value.version}")
    return f"agent:{agent}:subagent:{value}"


def channel_key(agent_id: str, channel: str, peer: str) -> str:
    """``agent:<id>:channel:<channel>:<peer>``, the session of one peer on one channel."""
    agent = normalize_agent_id(agent_id)
    return f"agent:{agent}:channel:{_check_segment(channel, 'channel name')}:{_check_segment(peer, 'channel peer')}"


def thread_key(base: str | SessionKey, thread_id: str) -> str:
    """``<base>:thread:<thread-id>`` for an agent key ``base`` that is not itself a thread key."""
    parsed = base if isinstance(base, SessionKey) else parse_session_key(base)
    if parsed.kind == "hook":
        raise SessionKeyError("a hook session key cannot have threads")
    if parsed.kind == "thread":
        raise SessionKeyError("threads do not nest: the base key is already a thread key")
    return _check_text(f"{parsed}:thread:{_check_segment(thread_id, 'thread id')}")


def hook_key(name: str) -> str:
    """``hook:<name>``; ``name`` has no whitespace or control characters and the key at most 256 characters."""
    if not name:
        raise SessionKeyError("a hook session key needs a name after 'hook:'")
    return _check_text(f"hook:{name}")


__all__ = [
    "MAX_AGENT_ID_LENGTH",
    "MAX_SEGMENT_LENGTH",
    "MAX_SESSION_KEY_LENGTH",
    "AgentIdError",
    "SessionKey",
    "SessionKeyError",
    "SessionKind",
    "channel_key",
    "hook_key",
    "main_key",
    "normalize_agent_id",
    "normalize_session_key",
    "parse_session_key",
    "subagent_key",
    "thread_key",
]

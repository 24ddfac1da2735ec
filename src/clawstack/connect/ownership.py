"""Whose gateway session a ``run_task`` runs in, and who the agent is told is asking.

A ``sessionKey`` argument is one of three things (:func:`session_name`):

* absent: a **new** conversation, ``agent:<openclaw agent>:channel:clawconnect:<uuid>``;
* a **short name** (``[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}``), scoped to its caller
  (:func:`short_name_key`): the stdio operator's ``review`` is ``…:channel:clawconnect:review`` (as it always was),
  any other caller's is ``…:channel:clawconnect:review@<caller scope>``, so two callers' ``review`` are two gateway
  sessions and no short name reaches another caller's (a scope holds no ``@``, so the last one tells the name from
  the scope, and the whole stays one key segment of at most 128 characters);
* a full **key** (``agent:…``), which names a session only its owner may use (:func:`check_owner`).

Every session ClawConnect runs a job in has one owner, recorded by the job store with the session's first job.
The stdio operator (the gateway's own operator) may also start a job in a gateway session ClawConnect never
created, such as ``agent:main:main``, and then owns it here; no other caller may. A session owned by another
caller reads exactly as one that does not exist (``session_not_found``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final, Literal

from clawstack.common.ids import new_uuid
from clawstack.connect.agents import Agent
from clawstack.connect.callers import Caller
from clawstack.connect.errors import SessionOwnedError, ToolError
from clawstack.connect.jobs import SessionOwner

CHANNEL: Final = "clawconnect"
SHORT_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")
FULL_KEY_RE: Final = re.compile(r"agent:[^\s]{1,250}")
UNVERIFIED: Final = " (unverified)"
NOT_FOUND_MESSAGE: Final = "sessionKey: no session of this caller has this key"


def channel_prefix(agent: Agent) -> str:
    """``agent:<openclaw agent id>:channel:clawconnect:``, the start of every key ClawConnect makes."""
    return f"agent:{agent.openclaw_agent_id}:channel:{CHANNEL}:"


def caller_scope(caller: Caller) -> str | None:
    """The key segment that scopes a caller's short names (``None`` for the operator): a digest of a user's key,
    so a name never has to fit a key's alphabet, and ``public`` / ``anonymous`` for those callers."""
    if caller.is_operator:
        return None
    if caller.identified:
        return "u-" + hashlib.sha256(caller.key.encode()).hexdigest()[:20]
    return caller.kind


def short_name_key(agent: Agent, caller: Caller, name: str) -> str:
    """The gateway session key of ``caller``'s short name ``name`` (see the module docstring)."""
    scope = caller_scope(caller)
    return channel_prefix(agent) + (name if scope is None else f"{name}@{scope}")


@dataclass(frozen=True, slots=True)
class SessionName:
    """What a ``sessionKey`` argument names: its gateway key, and whether it was ``new``, a ``name`` or a ``key``."""

    key: str
    kind: Literal["new", "name", "key"]


def session_name(agent: Agent, caller: Caller, given: str | None) -> SessionName:
    """Resolve a ``sessionKey`` argument; ``invalid_arguments`` when it is neither a short name nor a key."""
    if given is None:
        return SessionName(channel_prefix(agent) + new_uuid().replace("-", ""), "new")
    if FULL_KEY_RE.fullmatch(given):
        return SessionName(given, "key")
    if SHORT_NAME_RE.fullmatch(given):
        return SessionName(short_name_key(agent, caller, given), "name")
    raise ToolError(
        "sessionKey: must be an agent:… session key or a name of letters, digits and ._@+- (up to 100)",
        field="sessionKey",
    )


def check_owner(name: SessionName, owner: SessionOwner | None, caller: Caller) -> None:
    """Refuse (``session_not_found``) a session ``caller`` may not run a job in: one another caller owns, and a
    full key ClawConnect never ran a job in, unless the caller is the stdio operator."""
    if owner is not None:
        if owner.owner != caller.key:
            raise SessionOwnedError(NOT_FOUND_MESSAGE)
        return
    if name.kind == "key" and not caller.is_operator:
        raise SessionOwnedError(NOT_FOUND_MESSAGE)


def may_read(owner: SessionOwner | None, caller: Caller) -> bool:
    """Whether ``caller`` may read the session ``owner`` describes: only its owner may."""
    return owner is not None and owner.owner == caller.key


def sender_name(caller: Caller, given: str | None) -> str | None:
    """Who the agent is told is asking: an identified caller's own name (whatever ``senderName`` says); for the
    shared pass and an open endpoint, ``senderName`` marked unverified; for the stdio operator, ``senderName``."""
    if caller.identified:
        return caller.name
    if given is None or caller.is_operator:
        return given
    return given + UNVERIFIED


__all__ = [
    "CHANNEL",
    "SessionName",
    "caller_scope",
    "channel_prefix",
    "check_owner",
    "may_read",
    "sender_name",
    "session_name",
    "short_name_key",
]

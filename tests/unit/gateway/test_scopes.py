"""The scope tables: which operator scope each method and each chat command needs, the rule of which scope grants
which, the refusal's shape, and the table in docs/gateway-protocol.md, which must say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from clawstack.gateway.commands import BUILTIN_COMMANDS, COMMAND_SCOPES, PLUGIN_COMMAND_SCOPES, RESERVED_COMMANDS
from clawstack.gateway.protocol import (
    METHOD_SCOPES,
    OPERATOR_SCOPES,
    MissingScopeError,
    OperatorScope,
    missing_scope,
    response_error,
    scope_satisfied,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "gateway-protocol.md"
ADMIN, WRITE, READ = "operator.admin", "operator.write", "operator.read"


def test_the_command_scopes() -> None:
    assert dict(COMMAND_SCOPES) == {
        "stop": WRITE,
        "reset": ADMIN,
        "new": ADMIN,
        "status": WRITE,
        "help": WRITE,
        "model": WRITE,
        "think": WRITE,
        "verbose": WRITE,
        "whoami": WRITE,
        "commands": WRITE,
    }
    assert dict(PLUGIN_COMMAND_SCOPES) == {True: ADMIN, False: WRITE}
    # Every reserved name has a scope, and nothing else does.
    assert set(COMMAND_SCOPES) == set(RESERVED_COMMANDS) >= set(BUILTIN_COMMANDS)


def test_the_method_scopes() -> None:
    assert dict(METHOD_SCOPES) == {
        "chat.send": WRITE,
        "chat.abort": WRITE,
        "chat.history": READ,
        "sessions.list": READ,
        "sessions.messages.subscribe": READ,
        "sessions.messages.unsubscribe": READ,
        "sessions.reset": ADMIN,
        "users.setRole": ADMIN,
        "users.linkChannelIdentity": ADMIN,
        "users.unlinkChannelIdentity": ADMIN,
        "users.listChannelIdentities": ADMIN,
    }


def test_which_scope_grants_which() -> None:
    granted = {
        (held, needed) for held in OPERATOR_SCOPES for needed in OPERATOR_SCOPES if scope_satisfied([held], needed)
    }
    assert granted == {(ADMIN, ADMIN), (ADMIN, WRITE), (ADMIN, READ), (WRITE, WRITE), (WRITE, READ), (READ, READ)}
    assert not scope_satisfied([], READ)
    assert not scope_satisfied(["operator.pairing", "admin"], READ)
    assert missing_scope("chat.send", (READ,)) == WRITE
    assert missing_scope("chat.send", (WRITE,)) is None
    assert missing_scope("sessions.reset", (READ, WRITE)) == ADMIN
    assert missing_scope("no.such.method", ()) is None


@given(st.sets(st.sampled_from([*OPERATOR_SCOPES, "operator.pairing", "x"])), st.sampled_from(OPERATOR_SCOPES))
def test_a_scope_is_granted_by_itself_or_a_stronger_one(held: set[str], needed: OperatorScope) -> None:
    strength = {ADMIN: 3, WRITE: 2, READ: 1}
    best = max((strength[s] for s in held if s in strength), default=0)
    assert scope_satisfied(held, needed) is (best >= strength[needed])


def test_the_refusal_shape() -> None:
    error = MissingScopeError(ADMIN)
    assert (error.wire_code, error.scope) == ("FORBIDDEN", ADMIN)
    assert response_error("7", error) == {
        "type": "res",
        "id": "7",
        "ok": False,
        "error": {
            "code": "FORBIDDEN",
            "message": "missing scope: operator.admin",
            "details": {"code": "MISSING_SCOPE", "missingScope": ADMIN, "requiredScopes": [ADMIN]},
        },
    }


def documented_scopes() -> tuple[dict[str, str], dict[str, str], dict[bool, str]]:
    """The docs' scope table as ``(methods, built-in commands, plugin commands by require_auth)``."""
    text = DOC.read_text()
    start = text.index("| method or `chat.send` message | scope |")
    rows = text[start:].split("\n\n", 1)[0].splitlines()[2:]
    methods: dict[str, str] = {}
    commands: dict[str, str] = {}
    plugins: dict[bool, str] = {}
    for row in rows:
        what, scope = (cell.strip() for cell in row.strip("|").rsplit("|", 1))
        scope = scope.strip("`")
        names = re.findall(r"`([^`]+)`", what)
        if what.startswith("`chat.send`:"):
            if "plain message" in what:
                methods["chat.send"] = scope
            for flag in (True, False):
                if f"require_auth={flag}" in what:
                    plugins[flag] = scope
            for name in names[1:]:
                if re.fullmatch(r"/[a-z]+", name):
                    commands[name[1:]] = scope
        else:
            methods.update((name, scope) for name in names)
    return methods, commands, plugins


def test_the_documented_table_is_the_code() -> None:
    methods, commands, plugins = documented_scopes()
    assert methods == dict(METHOD_SCOPES)
    assert commands == dict(COMMAND_SCOPES)
    assert plugins == dict(PLUGIN_COMMAND_SCOPES)

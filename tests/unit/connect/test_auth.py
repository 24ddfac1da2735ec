"""Token parsing and checking for ``claw connect http``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clawstack.connect import AuthConfigError, Caller, TokenAuth, parse_user_tokens


def test_parse_user_tokens() -> None:
    assert parse_user_tokens(" Alice:tok-a , Bob:tok:with:colons,") == {"Alice": "tok-a", "Bob": "tok:with:colons"}
    assert parse_user_tokens("") == {}


@pytest.mark.parametrize("text", ["Alice", "Alice:", ":tok", "A:x,A:y"])
def test_malformed_user_tokens(text: str) -> None:
    with pytest.raises(AuthConfigError) as info:
        parse_user_tokens(text)
    assert info.value.code == "auth_config_invalid"


def test_open_only_when_nothing_is_configured() -> None:
    assert TokenAuth().open
    assert TokenAuth().identify(None) == Caller(None, "open")
    assert "open" in TokenAuth().describe()
    assert not TokenAuth(public_pass="p").open


def test_identify() -> None:
    auth = TokenAuth(user_tokens={"Alice": "tok-a"}, public_pass="pass-xyz")
    assert auth.identify("tok-a") == Caller("Alice", "user")
    assert auth.identify("pass-xyz") == Caller("public", "public")
    assert auth.identify("tok-") is None
    assert auth.identify("") is None
    assert auth.identify(None) is None
    assert "tok-a" not in auth.describe()
    assert "pass-xyz" not in auth.describe()


def test_the_file_is_reloaded_on_change_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"Bob": "tok-b"}))
    auth = TokenAuth(tokens_file=path)
    assert auth.identify("tok-b") == Caller("Bob", "user")
    path.write_text(json.dumps({"Carol": "tok-c"}))
    os.utime(path, ns=(5, 5))
    assert auth.identify("tok-b") is None
    assert auth.identify("tok-c") == Caller("Carol", "user")
    path.write_text(json.dumps(["tok-c"]))
    assert auth.identify("tok-c") is None
    path.unlink()
    assert auth.identify("tok-c") is None
    assert not auth.open


def test_from_env() -> None:
    auth = TokenAuth.from_env({"MCP_USER_TOKENS": "A:t1", "PUBLIC_MCP_PASS": ""})
    assert auth.identify("t1") == Caller("A", "user")
    with pytest.raises(AuthConfigError):
        TokenAuth.from_env({"MCP_USER_TOKENS": "broken"})

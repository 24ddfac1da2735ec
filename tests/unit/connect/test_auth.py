"""Token parsing and checking for ``claw connect http``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clawstack.connect import ANONYMOUS, PUBLIC, AuthConfigError, Caller, TokenAuth, parse_user_tokens


def test_parse_user_tokens() -> None:
    assert parse_user_tokens(" Alice:tok-a , Bob:tok:with:colons,") == {"Alice": "tok-a", "Bob": "tok:with:colons"}
    assert parse_user_tokens("") == {}


@pytest.mark.parametrize("text", ["Alice", "Alice:", ":tok", "A:x,A:y", "public:tok", "Public:tok"])
def test_malformed_user_tokens(text: str) -> None:
    with pytest.raises(AuthConfigError) as info:
        parse_user_tokens(text)
    assert info.value.code == "auth_config_invalid"


def test_open_only_when_nothing_is_configured() -> None:
    assert TokenAuth().open
    assert TokenAuth().identify(None) == ANONYMOUS
    assert "open" in TokenAuth().describe()
    assert not TokenAuth(public_pass="p").open


def test_identify() -> None:
    auth = TokenAuth(user_tokens={"Alice": "tok-a"}, public_pass="pass-xyz")
    assert auth.identify("tok-a") == Caller.user("Alice")
    assert auth.identify("pass-xyz") == PUBLIC
    assert auth.identify("tok-") is None
    assert auth.identify("") is None
    assert auth.identify(None) is None
    assert "tok-a" not in auth.describe()
    assert "pass-xyz" not in auth.describe()


def test_the_file_is_reloaded_on_change_and_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"Bob": "tok-b"}))
    auth = TokenAuth(tokens_file=path)
    assert auth.identify("tok-b") == Caller.user("Bob")
    path.write_text(json.dumps({"Carol": "tok-c"}))
    os.utime(path, ns=(5, 5))
    assert auth.identify("tok-b") is None
    assert auth.identify("tok-c") == Caller.user("Carol")
    path.write_text(json.dumps(["tok-c"]))
    assert auth.identify("tok-c") is None
    path.unlink()
    assert auth.identify("tok-c") is None
    assert not auth.open


def test_from_env() -> None:
    auth = TokenAuth.from_env({"MCP_USER_TOKENS": "A:t1", "PUBLIC_MCP_PASS": ""})
    assert auth.identify("t1") == Caller.user("A")
    with pytest.raises(AuthConfigError):
        TokenAuth.from_env({"MCP_USER_TOKENS": "broken"})


def test_a_tokens_file_naming_public_admits_none_of_its_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"public": "tok-p", "Dana": "tok-d"}))
    auth = TokenAuth(tokens_file=path, public_pass="pass-xyz")
    assert auth.identify("tok-p") is None
    assert auth.identify("tok-d") is None
    assert auth.identify("pass-xyz") == PUBLIC
    path.write_text(json.dumps({"Dana": "tok-d"}))
    os.utime(path, ns=(7, 7))
    assert auth.identify("tok-d") == Caller.user("Dana")  # the positive control, once the file is fixed


def test_caller_keys_never_collide_across_kinds() -> None:
    assert Caller.user("anonymous").key != ANONYMOUS.key
    assert Caller.user("operator").key == "user:operator"
    assert PUBLIC.key == "public"
    assert Caller.user("Alice").identified
    assert not PUBLIC.identified
    assert not ANONYMOUS.identified
    with pytest.raises(ValueError, match="only a user caller"):
        Caller("user")
    with pytest.raises(ValueError, match="only a user caller"):
        Caller("public", "x")

"""agents.json loading and the OPENCLAW_* fallback: each load error has its own code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clawstack.connect import AgentsConfigError, load_agents, parse_agents

GOOD: dict[str, Any] = {
    "default": "b",
    "agents": [
        {"id": "a", "url": "ws://127.0.0.1:1", "password": "secret-pa-1", "description": "first"},
        {"id": "b", "url": "wss://gw.example:443/ws", "token": "secret-tb-2", "openclawAgentId": "research"},
    ],
    "groups": {"all": ["a", "b"]},
}


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "agents.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def test_a_good_file(tmp_path: Path) -> None:
    registry = load_agents(write(tmp_path, GOOD), environ={})
    assert registry.default.id == "b"
    assert registry.get("a").openclaw_agent_id == "main"
    assert (registry.get("a").auth_kind, registry.get("b").auth_kind) == ("password", "token")
    assert registry.get("b").secret == "secret-tb-2"
    assert registry.groups == {"all": ("a", "b")}
    public = registry.public()
    assert public[1] == {"id": "b", "openclawAgentId": "research", "description": None, "default": True}
    assert "secret-" not in repr(registry)


def test_the_first_agent_is_the_default_without_one() -> None:
    registry = parse_agents({"agents": GOOD["agents"]})
    assert registry.default_id == "a"


def with_agents(*agents: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"agents": list(agents), **top}


A = {"id": "a", "url": "ws://h:1", "password": "p"}


@pytest.mark.parametrize(
    ("document", "code"),
    [
        ("{not json", "agents_json_invalid"),
        ('{"agents": [], "agents": []}', "agents_json_invalid"),
        ("[]", "agents_schema_invalid"),
        ({}, "agents_schema_invalid"),
        ({"agents": "a"}, "agents_schema_invalid"),
        (with_agents(A, extra=1), "agents_schema_invalid"),
        (with_agents({**A, "surprise": 1}), "agents_schema_invalid"),
        (with_agents({**A, "url": "http://h:1"}), "agents_schema_invalid"),
        (with_agents({**A, "id": ""}), "agents_schema_invalid"),
        (with_agents({**A, "id": 5}), "agents_schema_invalid"),
        (with_agents({"id": "a", "url": "ws://h:1"}), "agents_schema_invalid"),
        (with_agents({**A, "openclawAgentId": "Main Agent"}), "agents_schema_invalid"),
        (with_agents(), "agents_empty"),
        (with_agents(A, A), "agents_duplicate_id"),
        (with_agents(A, default="b"), "agents_default_unknown"),
        (with_agents(A, groups={"g": ["a", "zz"]}), "agents_group_unknown"),
    ],
)
def test_each_load_error(tmp_path: Path, document: object, code: str) -> None:
    with pytest.raises(AgentsConfigError) as info:
        load_agents(write(tmp_path, document), environ={})
    assert info.value.code == code
    assert '"p"' not in info.value.message


def test_an_explicit_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AgentsConfigError) as info:
        load_agents(tmp_path / "nope.json", environ={"OPENCLAW_URL": "ws://h:1"})
    assert info.value.code == "agents_file_missing"


def test_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "agents.json"
    path.mkdir()
    with pytest.raises(AgentsConfigError) as info:
        load_agents(path, environ={})
    assert info.value.code == "agents_file_unreadable"


def test_a_file_too_large(tmp_path: Path) -> None:
    path = write(tmp_path, " " * (1024 * 1024 + 1))
    with pytest.raises(AgentsConfigError) as info:
        load_agents(path, environ={})
    assert info.value.code == "agents_file_unreadable"


def test_environment_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    env = {"OPENCLAW_URL": "ws://127.0.0.1:18789", "OPENCLAW_PASSWORD": "pw", "OPENCLAW_AGENT_ID": "ops"}
    registry = load_agents(environ=env)
    agent = registry.default
    assert (agent.id, agent.url, agent.secret, agent.openclaw_agent_id) == (
        "openclaw",
        env["OPENCLAW_URL"],
        "pw",
        "ops",
    )
    assert load_agents(environ={"OPENCLAW_URL": "ws://h:1"}).default.openclaw_agent_id == "main"


def test_the_default_file_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".clawconnect").mkdir()
    write(tmp_path / ".clawconnect", GOOD)
    assert load_agents(environ={"OPENCLAW_URL": "ws://h:1"}).default.id == "b"


def test_nothing_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(AgentsConfigError) as info:
        load_agents(environ={})
    assert info.value.code == "agents_not_configured"


def test_a_bad_environment_url_is_a_schema_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(AgentsConfigError) as info:
        load_agents(environ={"OPENCLAW_URL": "localhost:18789"})
    assert info.value.code == "agents_schema_invalid"
    assert "environment" in info.value.message


def test_a_file_others_can_read_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, GOOD)
    path.chmod(0o644)
    load_agents(path, environ={})
    assert "readable by other users" in caplog.text
    assert "secret-" not in caplog.text
    caplog.clear()
    path.chmod(0o600)
    load_agents(path, environ={})
    assert caplog.text == ""

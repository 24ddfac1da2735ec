"""Tests for clawstack.gateway.plugins: manifests, code identity, loading, reload/retirement and command rules.

Plugins are real directories written under ``tmp_path`` and loaded by a real :class:`PluginLoader`; nothing about
the loader is mocked. Completions themselves are tested against the fake model in
``tests/integration/gateway/test_subagent_complete.py``.
"""

from __future__ import annotations

import json
import logging
import re
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import clawstack.gateway.plugins
from clawstack.gateway.agent import AgentLoop
from clawstack.gateway.config import GatewayConfig, parse_config
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.plugins import (
    RESERVED_COMMAND_NAMES,
    CommandCapabilityError,
    CommandContext,
    CommandRegistrationError,
    LoadedPlugin,
    PluginApi,
    PluginLoader,
    PluginManifestError,
    PluginNotFoundError,
    PluginRetiredError,
    SubagentCompleter,
    SubagentUnavailableError,
    code_identity,
    read_manifest,
)
from clawstack.gateway.plugins.loader import BuildInfo, bundled_identity, process_build_info
from clawstack.gateway.sessions import SessionStore
from clawstack.gateway.tools import ToolRegistry

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "plugins"

REGISTER_HELLO = """
def register(api):
    async def handler(ctx):
        return "hi " + ctx.args
    api.register_command("hi", handler, description="Say hi", accepts_args=True)
"""


def make_config(tmp_path: Path, plugins: dict[str, Any] | None = None) -> GatewayConfig:
    document: dict[str, Any] = {
        "models": {"providers": {"fake": {"baseUrl": "http://127.0.0.1:9/v1", "models": [{"id": "primary"}]}}},
        "agents": {"defaults": {"model": {"primary": "fake/primary"}}},
        "gateway": {"port": 0, "auth": {"mode": "token", "token": "gateway-token"}},
        "plugins": plugins or {},
    }
    return parse_config(document, base_dir=tmp_path, environ={})


def write_plugin(
    root: Path,
    plugin_id: str,
    source: str = REGISTER_HELLO,
    *,
    manifest: dict[str, Any] | None = None,
    capabilities: tuple[str, ...] = (),
) -> Path:
    directory = root / plugin_id
    directory.mkdir(parents=True, exist_ok=True)
    document = manifest or {
        "id": plugin_id,
        "version": "1.0.0",
        "entry": "plugin.py",
        "contracts": {"subagentProfiles": [], "commandRuntimeCapabilities": list(capabilities)},
    }
    (directory / "claw.plugin.json").write_text(json.dumps(document))
    (directory / "plugin.py").write_text(textwrap.dedent(source))
    return directory


@pytest.fixture
def completer(tmp_path: Path) -> Iterator[SubagentCompleter]:
    config = make_config(tmp_path)
    with SessionStore(tmp_path / "sessions.sqlite3") as store:
        yield SubagentCompleter(config, AgentLoop(config, store, ToolRegistry([])))


def loaded(loader: PluginLoader, plugin_id: str) -> tuple[LoadedPlugin, PluginApi]:
    record = loader.get(plugin_id)
    assert record.state == "loaded", record.error
    assert record.api is not None
    return record, record.api


def test_exported_members() -> None:
    package = clawstack.gateway.plugins
    public = {
        name
        for name in dir(package)
        if not name.startswith("_") and not isinstance(getattr(package, name), types.ModuleType)
    }
    assert sorted(package.__all__) == sorted(public)


# --------------------------------------------------------------------------------------------------------------------
# Manifests

GOOD: dict[str, Any] = {
    "id": "demo",
    "version": "1.0.0",
    "entry": "plugin.py",
    "contracts": {"subagentProfiles": ["reviewer"], "commandRuntimeCapabilities": ["subagents"]},
}


def _without(key: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != key}


def _contracts(**contracts: Any) -> dict[str, Any]:
    return {**GOOD, "contracts": contracts}


BAD_MANIFESTS: list[tuple[str, bytes, list[str]]] = [
    ("not json", b"{id: 1}", ["not valid JSON (line 1, column 2)"]),
    ("not utf-8", b'{"id": "\xff"}', ["not valid UTF-8"]),
    ("array", b"[]", ["must be a JSON object"]),
    ("missing id", json.dumps(_without("id")).encode(), ["id: required"]),
    ("missing version", json.dumps(_without("version")).encode(), ["version: required"]),
    ("missing entry", json.dumps(_without("entry")).encode(), ["entry: required"]),
    ("unknown key", json.dumps({**GOOD, "main": "x.py"}).encode(), ["main: unknown key"]),
    (
        "bad id",
        json.dumps({**GOOD, "id": "Demo"}).encode(),
        ["id: not a valid plugin id (lower-case letters, digits, '.', '_' and '-')"],
    ),
    ("id not a string", json.dumps({**GOOD, "id": 7}).encode(), ["id: must be a string"]),
    (
        "empty version",
        json.dumps({**GOOD, "version": ""}).encode(),
        ["version: must be 1-64 letters, digits, '.', '+' or '-'"],
    ),
    ("version number", json.dumps({**GOOD, "version": 1}).encode(), ["version: must be a string"]),
    (
        "entry escapes",
        json.dumps({**GOOD, "entry": "../plugin.py"}).encode(),
        ['entry: must be a relative path to a ".py" file inside the plugin directory'],
    ),
    (
        "entry absolute",
        json.dumps({**GOOD, "entry": "/tmp/plugin.py"}).encode(),
        ['entry: must be a relative path to a ".py" file inside the plugin directory'],
    ),
    (
        "entry not python",
        json.dumps({**GOOD, "entry": "plugin.js"}).encode(),
        ['entry: must be a relative path to a ".py" file inside the plugin directory'],
    ),
    (
        "entry missing file",
        json.dumps({**GOOD, "entry": "other.py"}).encode(),
        ["entry: no such file in the plugin directory"],
    ),
    ("contracts not object", json.dumps({**GOOD, "contracts": []}).encode(), ["contracts: must be an object"]),
    (
        "profiles not list",
        json.dumps(_contracts(subagentProfiles="reviewer")).encode(),
        ["contracts.subagentProfiles: must be a list"],
    ),
    (
        "bad profile id",
        json.dumps(_contracts(subagentProfiles=["Reviewer"])).encode(),
        [
            "contracts.subagentProfiles[0]: must be a lower-case letter, then lower-case letters, digits, '_' or '-'"
            " (at most 64)"
        ],
    ),
    (
        "repeated profile",
        json.dumps(_contracts(subagentProfiles=["a", "a"])).encode(),
        ["contracts.subagentProfiles: must not repeat an entry"],
    ),
    (
        "capability not string",
        json.dumps(_contracts(commandRuntimeCapabilities=[1])).encode(),
        ["contracts.commandRuntimeCapabilities[0]: must be a string"],
    ),
    (
        "capability with space",
        json.dumps(_contracts(commandRuntimeCapabilities=["sub agents"])).encode(),
        ["contracts.commandRuntimeCapabilities[0]: must be a non-empty capability name without whitespace"],
    ),
    (
        "several problems",
        json.dumps({"id": "Demo", "extra": 1}).encode(),
        [
            "id: not a valid plugin id (lower-case letters, digits, '.', '_' and '-')",
            "version: required",
            "entry: required",
            "extra: unknown key",
        ],
    ),
]


@pytest.mark.parametrize(
    ("manifest", "expected"), [(m, e) for _, m, e in BAD_MANIFESTS], ids=[c[0] for c in BAD_MANIFESTS]
)
def test_bad_manifest_is_refused_precisely(tmp_path: Path, manifest: bytes, expected: list[str]) -> None:
    (tmp_path / "claw.plugin.json").write_bytes(manifest)
    (tmp_path / "plugin.py").write_text("def register(api):\n    pass\n")
    with pytest.raises(PluginManifestError) as caught:
        read_manifest(tmp_path)
    assert sorted(str(p) for p in caught.value.problems) == sorted(expected)
    assert caught.value.code == "plugin_manifest_invalid"
    assert caught.value.message.startswith("claw.plugin.json: ")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(["id", "entry"]),
    value=_JSON | st.sampled_from(["plugin.py", "./plugin.py", "demo", "other.py"]),
    extra=st.dictionaries(st.text(min_size=1, max_size=8), _JSON, max_size=2),
)
def test_no_malformed_manifest_is_accepted(tmp_path: Path, key: str, value: Any, extra: dict[str, Any]) -> None:
    """An arbitrary ``id`` or ``entry``, with or without unknown keys, is accepted exactly when it is valid."""
    unknown = {k: v for k, v in extra.items() if k not in GOOD}
    document = {**GOOD, key: value, **unknown}
    (tmp_path / "claw.plugin.json").write_text(json.dumps(document))
    (tmp_path / "plugin.py").write_text("")
    if key == "id":
        valid = isinstance(value, str) and re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", value) is not None
    else:
        valid = value in ("plugin.py", "./plugin.py")
    if valid and not unknown:
        manifest, _ = read_manifest(tmp_path)
        assert getattr(manifest, key) == value
    else:
        with pytest.raises(PluginManifestError) as caught:
            read_manifest(tmp_path)
        assert caught.value.problems


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PluginManifestError, match="cannot read"):
        read_manifest(tmp_path)


def test_entry_symlink_outside_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("def register(api):\n    pass\n")
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "claw.plugin.json").write_text(json.dumps({**GOOD, "entry": "link.py"}))
    (plugin / "link.py").symlink_to(outside)
    with pytest.raises(PluginManifestError, match="entry: resolves outside the plugin directory"):
        read_manifest(plugin)


def test_good_manifest(tmp_path: Path) -> None:
    raw = json.dumps(GOOD).encode()
    (tmp_path / "claw.plugin.json").write_bytes(raw)
    (tmp_path / "plugin.py").write_text("")
    manifest, data = read_manifest(tmp_path)
    assert (manifest.id, manifest.version, manifest.entry) == ("demo", "1.0.0", "plugin.py")
    assert manifest.contracts.subagent_profiles == ("reviewer",)
    assert manifest.contracts.command_runtime_capabilities == ("subagents",)
    assert manifest.contracts.unknown_keys == ()
    assert data == raw


def test_unknown_contract_keys_are_recorded_not_refused(tmp_path: Path) -> None:
    document = _contracts(sessionScheduledTurns=["requester-command"], commandRuntimeCapabilities=["subagents"])
    (tmp_path / "claw.plugin.json").write_text(json.dumps(document))
    (tmp_path / "plugin.py").write_text("")
    manifest, _ = read_manifest(tmp_path)
    assert manifest.contracts.unknown_keys == ("sessionScheduledTurns",)
    assert manifest.contracts.command_runtime_capabilities == ("subagents",)


# --------------------------------------------------------------------------------------------------------------------
# Code identity


def test_code_identity_is_stable_and_tracks_every_python_file(tmp_path: Path) -> None:
    directory = write_plugin(tmp_path, "demo")
    (directory / "lib").mkdir()
    (directory / "lib" / "helper.py").write_text("VALUE = 1\n")
    (directory / "README.txt").write_text("docs")
    manifest = (directory / "claw.plugin.json").read_bytes()

    first, sources = code_identity(directory, manifest)
    assert first.startswith("sha256:")
    assert len(first) == len("sha256:") + 64
    assert sorted(sources) == ["lib/helper.py", "plugin.py"]
    assert code_identity(directory, manifest)[0] == first

    (directory / "README.txt").write_text("other docs")  # not Python: no change
    assert code_identity(directory, manifest)[0] == first

    (directory / "lib" / "helper.py").write_text("VALUE = 2\n")
    second = code_identity(directory, manifest)[0]
    assert second != first

    (directory / "lib" / "helper.py").write_text("VALUE = 1\n")
    assert code_identity(directory, manifest)[0] == first  # same bytes, same identity

    (directory / "plugin.py").write_text(REGISTER_HELLO + "\n# changed\n")
    assert code_identity(directory, manifest)[0] != first
    (directory / "plugin.py").write_text(textwrap.dedent(REGISTER_HELLO))
    assert code_identity(directory, manifest)[0] == first

    assert code_identity(directory, manifest + b" ")[0] != first  # the manifest counts too

    (directory / "lib" / "helper.py").rename(directory / "lib" / "renamed.py")
    assert code_identity(directory, manifest)[0] != first  # names count, not only bytes


def test_loaded_plugin_records_its_code_identity(tmp_path: Path) -> None:
    directory = write_plugin(tmp_path, "demo")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    record, api = loaded(loader, "demo")
    expected = code_identity(directory, (directory / "claw.plugin.json").read_bytes())[0]
    assert record.code_identity == api.code_identity == expected


# --------------------------------------------------------------------------------------------------------------------
# Loading


def test_failing_plugins_are_reported_while_others_load(tmp_path: Path) -> None:
    write_plugin(tmp_path, "good")
    write_plugin(
        tmp_path,
        "raises",
        """
        def register(api):
            async def handler(ctx):
                return ""
            api.register_command("partial", handler, description="registered before the failure")
            raise RuntimeError("boom")
        """,
    )
    write_plugin(tmp_path, "broken", "def register(api:\n")
    write_plugin(tmp_path, "noregister", "VALUE = 1\n")
    write_plugin(tmp_path, "asyncreg", "async def register(api):\n    pass\n")
    bad = tmp_path / "badmanifest"
    bad.mkdir()
    (bad / "claw.plugin.json").write_text('{"id": "badmanifest"}')

    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    records = {r.id: r for r in loader.load()}

    assert records["good"].state == "loaded"
    assert loader.commands.get("hi") is not None
    assert records["raises"].state == "failed"
    assert records["raises"].error == {
        "code": "plugin_load_failed",
        "message": "register(api) raised RuntimeError: boom",
    }
    assert records["raises"].api is None
    assert records["raises"].code_identity is not None
    assert loader.commands.get("partial") is None  # a failed plugin contributes nothing
    assert records["broken"].error is not None
    assert records["broken"].error["code"] == "plugin_load_failed"
    assert records["broken"].error["message"].startswith("importing plugin.py failed: SyntaxError")
    assert records["noregister"].error == {
        "code": "plugin_load_failed",
        "message": "plugin.py defines no register(api) function",
    }
    assert records["asyncreg"].error is not None
    assert "not a coroutine function" in records["asyncreg"].error["message"]
    assert records["badmanifest"].state == "failed"
    assert records["badmanifest"].error is not None
    assert records["badmanifest"].error["code"] == "plugin_manifest_invalid"
    assert "version: required" in records["badmanifest"].error["message"]


def test_failed_plugin_exposes_no_api(tmp_path: Path) -> None:
    write_plugin(
        tmp_path,
        "keeper",
        """
        KEPT = []
        def register(api):
            KEPT.append(api)
            raise ValueError("no")
        """,
    )
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    assert loader.get("keeper").state == "failed"
    # The api it kept is unusable: the instance never became live.
    assert loader.get("keeper").api is None


def test_enabled_and_trust_come_from_config(tmp_path: Path) -> None:
    write_plugin(tmp_path, "off", "raise RuntimeError('must not be imported')\n")
    write_plugin(tmp_path, "trusted")
    config = make_config(
        tmp_path, {"entries": {"off": {"enabled": False}, "trusted": {"trust": "trusted"}}, "load": {"paths": []}}
    )
    loader = PluginLoader(config, search_paths=[tmp_path])
    records = {r.id: r for r in loader.load()}
    assert records["off"].state == "disabled"
    assert records["off"].api is None
    _, api = loaded(loader, "trusted")
    assert api.trust == "trusted"


def test_config_load_paths_and_single_plugin_directories(tmp_path: Path) -> None:
    first = write_plugin(tmp_path / "a", "one")
    write_plugin(tmp_path / "b", "two", REGISTER_HELLO.replace('"hi"', '"two"'))
    config = make_config(tmp_path, {"load": {"paths": ["a/one"]}})
    loader = PluginLoader(config, search_paths=[tmp_path / "b"])
    assert loader.discover() == [first, tmp_path / "b" / "two"]
    assert [r.id for r in loader.load()] == ["one", "two"]


def test_duplicate_plugin_id_keeps_the_first(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_plugin(tmp_path / "a", "same")
    write_plugin(tmp_path / "b", "same")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path / "a", tmp_path / "b"])
    with caplog.at_level(logging.WARNING, logger="clawstack.plugins"):
        records = loader.load()
    assert [(r.id, r.path) for r in records] == [("same", tmp_path / "a" / "same")]
    assert "is already taken by" in caplog.text


def test_entry_modules_get_their_own_names(tmp_path: Path) -> None:
    source = """
    COUNT = []
    def register(api):
        COUNT.append(__name__)
        api.logger.info("module %s count %d", __name__, len(COUNT))
    """
    write_plugin(tmp_path, "one", source)
    write_plugin(tmp_path, "two", source)
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    assert all(r.state == "loaded" for r in loader.load())


def test_api_basics(tmp_path: Path, completer: SubagentCompleter) -> None:
    write_plugin(tmp_path, "demo")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path], completer=completer)
    loader.load()
    _, api = loaded(loader, "demo")
    assert api.id == "demo"
    assert api.trust == "installed"
    assert api.logger.name == "clawstack.plugins.demo"
    assert api.runtime.capabilities == frozenset({"subagent.complete"})
    assert [c.name for c in api.commands] == ["hi"]
    assert not api.retired


def test_plugin_config_is_read_only_and_empty_when_absent(tmp_path: Path) -> None:
    write_plugin(tmp_path, "configured", "def register(api):\n    pass\n")
    write_plugin(tmp_path, "plain", "def register(api):\n    pass\n")
    settings = {"greeting": "hi", "limits": {"notes": 3}, "tags": ["a", "b"]}
    loader = PluginLoader(
        make_config(tmp_path, {"entries": {"configured": {"config": settings}}}), search_paths=[tmp_path]
    )
    loader.load()
    _, api = loaded(loader, "configured")
    config = api.plugin_config
    assert config == {"greeting": "hi", "limits": {"notes": 3}, "tags": ("a", "b")}
    with pytest.raises(TypeError):
        config["greeting"] = "changed"  # type: ignore[index]
    with pytest.raises(TypeError):
        config["limits"]["notes"] = 4
    settings["greeting"] = "changed later"
    assert api.plugin_config["greeting"] == "hi"  # captured at load
    assert dict(loaded(loader, "plain")[1].plugin_config) == {}
    loader.reload("configured")
    with pytest.raises(PluginRetiredError):
        _ = api.plugin_config


def test_capabilities_without_a_completer_are_empty(tmp_path: Path) -> None:
    write_plugin(tmp_path, "demo")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    _, api = loaded(loader, "demo")
    assert api.runtime.capabilities == frozenset()


async def test_complete_without_a_completer_is_unavailable(tmp_path: Path) -> None:
    write_plugin(tmp_path, "demo")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    _, api = loaded(loader, "demo")
    with pytest.raises(SubagentUnavailableError):
        await api.runtime.subagent.complete("main", "hello")


# --------------------------------------------------------------------------------------------------------------------
# Reload and retirement


async def test_reload_retires_the_old_api(tmp_path: Path, completer: SubagentCompleter) -> None:
    directory = write_plugin(tmp_path, "demo")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path], completer=completer)
    loader.load()
    old_record, old = loaded(loader, "demo")
    old_runtime = old.runtime
    old_subagent = old.runtime.subagent

    (directory / "plugin.py").write_text(textwrap.dedent(REGISTER_HELLO.replace('"hi"', '"hey"')))
    new_record = loader.reload("demo")
    assert new_record.state == "loaded"
    assert new_record.api is not None
    assert new_record.api is not old
    assert new_record.code_identity != old_record.code_identity

    assert old.retired
    assert old.id == "demo"  # identity stays readable
    for use in (
        lambda: old.runtime,
        lambda: old.logger,
        lambda: old.commands,
        lambda: old_runtime.capabilities,
        lambda: old_runtime.subagent,
        lambda: old.register_command("later", _noop, description="too late"),
    ):
        with pytest.raises(PluginRetiredError) as caught:
            use()
        assert caught.value.code == "plugin_retired"
    with pytest.raises(PluginRetiredError):
        await old_subagent.complete("main", "hello")

    assert loader.commands.get("hi") is None  # the old instance's commands went with it
    assert [c.name for c in new_record.api.commands] == ["hey"]


def test_reload_of_a_now_failing_plugin_reports_it_failed(tmp_path: Path) -> None:
    directory = write_plugin(tmp_path, "demo")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    _, old = loaded(loader, "demo")
    (directory / "plugin.py").write_text("def register(api):\n    raise KeyError('gone')\n")
    record = loader.reload("demo")
    assert record.state == "failed"
    assert old.retired
    assert loader.commands.all() == ()


def test_reload_unknown_plugin(tmp_path: Path) -> None:
    loader = PluginLoader(make_config(tmp_path))
    with pytest.raises(PluginNotFoundError) as caught:
        loader.reload("nothing")
    assert caught.value.code == "plugin_not_found"
    assert isinstance(caught.value, GatewayError)


def test_load_again_retires_everything(tmp_path: Path) -> None:
    write_plugin(tmp_path, "demo")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    _, first = loaded(loader, "demo")
    loader.load()
    _, second = loaded(loader, "demo")
    assert first.retired
    assert not second.retired
    assert [c.name for c in loader.commands.all()] == ["hi"]


# --------------------------------------------------------------------------------------------------------------------
# Commands


async def _noop(ctx: CommandContext) -> str:
    return ""


@pytest.fixture
def api(tmp_path: Path, completer: SubagentCompleter) -> PluginApi:
    write_plugin(
        tmp_path, "demo", "def register(api):\n    pass\n", capabilities=("subagents", "scheduledTurns", "subagent.run")
    )
    write_plugin(tmp_path, "other", REGISTER_HELLO)
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path], completer=completer)
    loader.load()
    return loaded(loader, "demo")[1]


@pytest.mark.parametrize(
    "name",
    ["", "Hello", "1hello", "-x", "_x", "hello world", "héllo", "a" * 33, "x/y", "x.y", "x\n"],
)
def test_bad_command_names(api: PluginApi, name: str) -> None:
    with pytest.raises(CommandRegistrationError, match="is not valid") as caught:
        api.register_command(name, _noop, description="d")
    assert caught.value.code == "plugin_command_invalid"


@pytest.mark.parametrize("name", sorted(RESERVED_COMMAND_NAMES))
def test_reserved_command_names(api: PluginApi, name: str) -> None:
    with pytest.raises(CommandRegistrationError, match="is reserved"):
        api.register_command(name, _noop, description="d")


def test_reserved_list_is_the_spec_list() -> None:
    assert (
        frozenset({"help", "status", "stop", "new", "reset", "model", "think", "verbose", "whoami", "commands"})
        == RESERVED_COMMAND_NAMES
    )


def test_good_command_names(api: PluginApi) -> None:
    for name in ("a", "a" * 32, "review-pr", "x_1"):
        api.register_command(name, _noop, description="d")
    assert sorted(c.name for c in api.commands) == sorted(["a", "a" * 32, "review-pr", "x_1"])


def test_duplicate_commands(api: PluginApi) -> None:
    api.register_command("mine", _noop, description="d")
    with pytest.raises(CommandRegistrationError, match="already registered by this plugin"):
        api.register_command("mine", _noop, description="d")
    with pytest.raises(CommandRegistrationError, match="already registered by plugin 'other'"):
        api.register_command("hi", _noop, description="d")


def test_duplicate_command_across_plugins_fails_the_second_plugin(tmp_path: Path) -> None:
    write_plugin(tmp_path, "a-first")
    write_plugin(tmp_path, "b-second")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    records = {r.id: r for r in loader.load()}
    assert records["a-first"].state == "loaded"
    assert records["b-second"].state == "failed"
    assert records["b-second"].error is not None
    assert records["b-second"].error["code"] == "plugin_command_invalid"
    command = loader.commands.get("hi")
    assert command is not None
    assert command.plugin_id == "a-first"


def test_command_fields_and_runtime_capabilities(api: PluginApi) -> None:
    command = api.register_command(
        "ask",
        _noop,
        description="Ask the model",
        require_auth=False,
        accepts_args=True,
        runtime_capabilities=["subagents"],
    )
    assert (command.plugin_id, command.require_auth, command.accepts_args) == ("demo", False, True)
    assert command.runtime_capabilities == frozenset({"subagents"})
    default = api.register_command("plain", _noop, description="Plain")
    assert (default.require_auth, default.accepts_args, default.runtime_capabilities) == (True, False, frozenset())


def test_runtime_capability_not_declared_in_manifest(tmp_path: Path) -> None:
    write_plugin(tmp_path, "bare", "def register(api):\n    pass\n")
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    _, bare = loaded(loader, "bare")
    for capability in ("subagents", "scheduledTurns"):
        with pytest.raises(CommandRegistrationError, match="not declared in the manifest") as caught:
            bare.register_command("x", _noop, description="d", runtime_capabilities=[capability])
        assert caught.value.code == "plugin_command_invalid"
    assert bare.commands == ()


def test_subagents_registers_on_a_host_without_native_children(api: PluginApi) -> None:
    """The spec: such a command still registers; at invocation ``ctx.runtime_context.subagents`` is absent."""
    command = api.register_command("review-pr", _noop, description="d", runtime_capabilities=["subagents"])
    assert command.runtime_capabilities == frozenset({"subagents"})
    assert not any(c.startswith("command-native-subagents") for c in api.runtime.capabilities)
    context = CommandContext("demo", "review-pr", "", authenticated=True)
    assert context.runtime_context.subagents is None
    assert context.runtime_context.scheduled_turns is None


def test_scheduled_turns_is_refused_at_registration_so_a_variant_can_register(api: PluginApi) -> None:
    with pytest.raises(CommandCapabilityError, match="not supported by this gateway") as caught:
        api.register_command("schedule", _noop, description="d", runtime_capabilities=["subagents", "scheduledTurns"])
    assert caught.value.code == "plugin_capability_unsupported"
    assert isinstance(caught.value, CommandRegistrationError)
    assert "scheduledTurns" in caught.value.message
    assert api.commands == ()
    variant = api.register_command("schedule", _noop, description="d", runtime_capabilities=["subagents"])
    assert variant.runtime_capabilities == frozenset({"subagents"})


@pytest.mark.parametrize("capability", ["subagent.run", "subagent.complete", "sessionScheduledTurns"])
def test_names_that_are_not_command_runtime_capabilities_are_refused(api: PluginApi, capability: str) -> None:
    with pytest.raises(CommandRegistrationError, match="not command runtime capabilities") as caught:
        api.register_command("x", _noop, description="d", runtime_capabilities=[capability])
    assert "'subagents', 'scheduledTurns'" in caught.value.message
    if capability.startswith("subagent."):
        assert "api.runtime.subagent needs no declaration" in caught.value.message
    assert api.commands == ()


def test_unsupported_contracts_do_not_fail_the_plugin(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Unknown contract keys and unknown capability names are refused alone, with a warning; declared subagent
    profiles on a loader without native children give no registration surface and no capability."""
    source = """
    from clawstack.gateway.plugins import CommandCapabilityError

    async def handler(ctx):
        return "ok"

    def register(api):
        try:
            api.register_command("resume", handler, description="d", runtime_capabilities=["subagents", "scheduledTurns"])
        except CommandCapabilityError:
            api.register_command("resume", handler, description="d", runtime_capabilities=["subagents"])
    """
    manifest = {
        "id": "sched",
        "version": "1.0.0",
        "entry": "plugin.py",
        "contracts": {
            "subagentProfiles": ["reviewer"],
            "commandRuntimeCapabilities": ["subagents", "scheduledTurns", "subagent.run"],
            "sessionScheduledTurns": ["requester-command"],
        },
    }
    write_plugin(tmp_path, "sched", source, manifest=manifest)
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    with caplog.at_level(logging.WARNING, logger="clawstack.plugins"):
        loader.load()
    record, api = loaded(loader, "sched")
    command = loader.commands.get("resume")
    assert command is not None
    assert command.runtime_capabilities == frozenset({"subagents"})
    assert len(record.warnings) == 2
    unknown_key, unknown_capability = record.warnings
    assert unknown_key.startswith("contracts.sessionScheduledTurns: not supported by this gateway")
    assert unknown_capability.startswith("contracts.commandRuntimeCapabilities: ['subagent.run'] are not command")
    assert not any("profile" in c for c in api.runtime.capabilities)
    assert api.agent is not None
    assert api.agent.register_subagent_profile is None  # no profile registration surface
    for warning in record.warnings:
        assert f"plugin sched: {warning}" in caplog.text


def test_a_declared_empty_profile_list_gives_no_warning(tmp_path: Path) -> None:
    write_plugin(tmp_path, "demo", capabilities=("subagents",))
    loader = PluginLoader(make_config(tmp_path), search_paths=[tmp_path])
    loader.load()
    assert loader.get("demo").warnings == ()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"description": ""}, "non-empty description"),
        ({"description": "   "}, "non-empty description"),
        ({"description": "d", "runtime_capabilities": "subagents"}, "must be a list"),
        ({"description": "d", "runtime_capabilities": [1]}, "must be a list"),
    ],
)
def test_other_command_refusals(api: PluginApi, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(CommandRegistrationError, match=message):
        api.register_command("x", _noop, **kwargs)


def test_handler_must_be_callable(api: PluginApi) -> None:
    with pytest.raises(CommandRegistrationError, match="must be callable"):
        api.register_command("x", "not a function", description="d")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------------------------
# The example plugin


def test_example_plugin_loads(tmp_path: Path, completer: SubagentCompleter) -> None:
    loader = PluginLoader(make_config(tmp_path), search_paths=[EXAMPLES], completer=completer)
    loader.load()
    _, _api = loaded(loader, "hello")
    command = loader.commands.get("hello")
    assert command is not None
    assert command.runtime_capabilities == frozenset()
    assert command.accepts_args


# -- bundled build identity ----------------------------------------------------------------------------------------


def write_build(package_root: Path, built_at: str = "2026-11-29T10:00:00Z") -> BuildInfo:
    package_root.mkdir(parents=True, exist_ok=True)
    record = {"buildId": "b-1", "version": "0.1.0", "commit": "abc123", "builtAt": built_at}
    (package_root / "build-info.json").write_text(json.dumps(record))
    build = BuildInfo.read(package_root)
    assert build is not None
    return build


def test_build_info_is_absent_or_malformed_in_a_source_run(tmp_path: Path) -> None:
    assert BuildInfo.read(tmp_path) is None
    for bad in ("not json", "[]", json.dumps({"buildId": "b", "version": "1", "commit": "c"})):
        (tmp_path / "build-info.json").write_text(bad)
        assert BuildInfo.read(tmp_path) is None
    build = write_build(tmp_path)
    assert (build.build_id, build.version, build.commit) == ("b-1", "0.1.0", "abc123")


def test_bundled_identity_names_the_exact_build_and_paths(tmp_path: Path) -> None:
    build = write_build(tmp_path / "pkg")
    inside = write_plugin(tmp_path / "pkg" / "bundled-plugins", "mail")
    outside = write_plugin(tmp_path / "override", "mail")
    first = bundled_identity(build, "mail", inside, "plugin.py")
    assert first is not None
    assert first.startswith("sha256:")
    assert bundled_identity(build, "mail", inside, "plugin.py") == first
    assert bundled_identity(None, "mail", inside, "plugin.py") is None
    assert bundled_identity(build, "mail", outside, "plugin.py") is None
    rebuilt = write_build(tmp_path / "pkg", built_at="2026-11-29T11:00:00Z")
    assert bundled_identity(rebuilt, "mail", inside, "plugin.py") != first
    # The identity is the build's, not the source's: editing the plugin does not change it.
    (inside / "plugin.py").write_text("def register(api):\n    pass\n")
    assert bundled_identity(build, "mail", inside, "plugin.py") == first


def test_loader_gives_bundled_plugins_the_build_identity(tmp_path: Path) -> None:
    build = write_build(tmp_path / "pkg")
    quiet = "def register(api):\n    pass\n"
    write_plugin(tmp_path / "pkg" / "bundled-plugins", "mail", quiet)
    write_plugin(tmp_path / "override", "other", quiet)
    write_plugin(tmp_path / "installed", "third", quiet)
    config = make_config(tmp_path, {"entries": {"mail": {"trust": "bundled"}, "other": {"trust": "bundled"}}})
    paths = [tmp_path / "pkg" / "bundled-plugins", tmp_path / "override", tmp_path / "installed"]
    loader = PluginLoader(config, search_paths=paths, build=build)
    plugins = {p.id: p for p in loader.load()}
    assert plugins["mail"].code_identity == bundled_identity(
        build, "mail", tmp_path / "pkg" / "bundled-plugins" / "mail", "plugin.py"
    )
    assert plugins["other"].state == "loaded"
    assert plugins["other"].code_identity is None
    third = plugins["third"].code_identity
    assert third is not None
    assert third.startswith("sha256:")
    assert process_build_info() is None  # this checkout is a source run

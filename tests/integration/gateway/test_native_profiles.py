"""Plugin-local subagent profiles (``native-subagent-profiles-v1``) and collector-enforced output schemas, through
``ctx.subagent.native`` in a real gateway with the scripted fake model."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.plugins.api import PluginRetiredError
from clawstack.gateway.plugins.profiles import PROFILES_CAPABILITY
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway.test_native_facade import (
    PLUGIN,
    Gateway,
    collect,
    make_config,
    spawn,
)
from tests.integration.gateway.test_ws_protocol import API_KEY, connected

SCHEMA = {
    "type": "object",
    "properties": {"findings": {"type": "array", "items": {"type": "string"}}},
    "required": ["findings"],
    "additionalProperties": False,
}

REGISTER = """

def register_profiles(api):
    profiles = captured.setdefault("register_errors", {})
    register = api.agent.register_subagent_profile
    captured["register"] = register
    if register is None:
        return
    register(
        id="reviewer",
        description="Review without editing",
        instructions_file="agents/reviewer.md",
        tools={"deny": ["read"]},
        output_schema=SCHEMA,
    )
    register(id="plain", description="Plain instructions", instructions_file="agents/plain.md")
    for name, kwargs in BAD.items():
        try:
            register(**kwargs)
            profiles[name] = "registered"
        except Exception as exc:
            profiles[name] = getattr(exc, "code", type(exc).__name__)
"""


def write_plugin(root: Path, plugin_id: str, prefix: str, *, profiles: list[str] | None) -> Path:
    directory = root / plugin_id
    (directory / "agents").mkdir(parents=True)
    manifest: dict[str, Any] = {"id": plugin_id, "version": "1.0.0", "entry": "plugin.py"}
    if profiles is not None:
        manifest["contracts"] = {"subagentProfiles": profiles}
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "agents" / "reviewer.md").write_text("You review changes. PROFILE-MARKER-ONE\n")
    (directory / "agents" / "plain.md").write_text("Plain profile words.\n")
    (directory / "agents" / "latin1.md").write_bytes("caf\xe9".encode("latin-1"))
    (directory / "agents" / "big.md").write_text("x" * (256 * 1024 + 1))
    (directory / "agents" / "linked.md").write_text("linked")
    os.link(directory / "agents" / "linked.md", root / f"{plugin_id}-hardlink.md")
    (root / f"{plugin_id}-outside.md").write_text("outside")
    (directory / "agents" / "escape.md").symlink_to(root / f"{plugin_id}-outside.md")
    base = "dict(description='d', instructions_file='agents/plain.md')"
    bad = {
        "undeclared": f"dict({base}, id='other')",
        "bad_id": f"dict({base}, id='Bad')",
        "no_description": "dict(id='spare', description=' ', instructions_file='agents/plain.md')",
        "missing_file": "dict(id='spare', description='d', instructions_file='agents/none.md')",
        "traversal": "dict(id='spare', description='d', instructions_file='../x.md')",
        "absolute": "dict(id='spare', description='d', instructions_file='/etc/passwd')",
        "symlink": "dict(id='spare', description='d', instructions_file='agents/escape.md')",
        "hard_link": "dict(id='spare', description='d', instructions_file='agents/linked.md')",
        "not_utf8": "dict(id='spare', description='d', instructions_file='agents/latin1.md')",
        "too_big": "dict(id='spare', description='d', instructions_file='agents/big.md')",
        "allow": f"dict({base}, id='spare', tools={{'allow': ['read']}})",
        "bad_schema": f"dict({base}, id='spare', output_schema={{'type': 42}})",
        "forged_model": f"dict({base}, id='spare', model='openai/gpt-5')",
        "forged_sandbox": f"dict({base}, id='spare', sandbox={{'mode': 'off'}})",
        "forged_credentials": f"dict({base}, id='spare', api_key='sk-forged')",
    }
    source = (
        f"PREFIX = {prefix!r}\nSCHEMA = {SCHEMA!r}\n"
        + textwrap.dedent(PLUGIN).replace(
            '    api.register_hook("reply_dispatch", reply)',
            '    api.register_hook("reply_dispatch", reply)\n    register_profiles(api)',
        )
        + REGISTER
        + "\nBAD = {"
        + ", ".join(f"{name!r}: {value}" for name, value in bad.items())
        + "}\n"
    )
    (directory / "plugin.py").write_text(source)
    return directory


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def gateway(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[Gateway]:
    root = tmp_path / "plugins"
    paths = [
        write_plugin(root, "profiled", "native", profiles=["reviewer", "plain", "spare"]),
        write_plugin(root, "other", "othernative", profiles=None),
    ]
    server = GatewayServer(make_config(tmp_path, fake.base_url), data_dir=tmp_path / "data", plugin_paths=paths)
    await server.start()
    http = aiohttp.ClientSession()
    client = await connected(http, server.port)
    try:
        yield Gateway(server, fake, client)
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()


def captured(prefix: str) -> dict[str, Any]:
    module = next(m for m in sys.modules.values() if getattr(m, "PREFIX", None) == prefix and hasattr(m, "BAD"))
    return module.captured  # type: ignore[no-any-return]


def child_requests(fake: FakeModelServer) -> list[Any]:
    return [r for r in fake.requests if r.path.endswith("/chat/completions")]


def tools_of(request: Any) -> list[str]:
    return [tool["function"]["name"] for tool in request.body.get("tools", [])]


async def test_registration_rules(gateway: Gateway) -> None:
    apis = {p.id: p.api for p in gateway.server.plugins}
    assert PROFILES_CAPABILITY in apis["profiled"].runtime.capabilities  # type: ignore[union-attr]
    assert PROFILES_CAPABILITY not in apis["other"].runtime.capabilities  # type: ignore[union-attr]
    assert captured("othernative")["register"] is None  # an undeclared plugin gets no registration method
    assert captured("native")["register_errors"] == {
        name: "subagent_profile_invalid"
        for name in (
            "undeclared",
            "bad_id",
            "no_description",
            "missing_file",
            "traversal",
            "absolute",
            "symlink",
            "hard_link",
            "not_utf8",
            "too_big",
            "allow",
            "bad_schema",
            "forged_model",
            "forged_sandbox",
            "forged_credentials",
        )
    }


async def test_a_profile_adds_instructions_removes_tools_and_its_schema_is_enforced(
    gateway: Gateway, tmp_path: Path
) -> None:
    # Edits on disk after registration change nothing: the instructions were captured.
    (tmp_path / "plugins" / "profiled" / "agents" / "reviewer.md").write_text("EDITED LATER\n")
    good, good_result, _bad, bad_result, _plain, plain_result = await gateway.steps(
        spawn('@fake reply: {"findings": ["a nit"]}', profile="reviewer"),
        collect("$0", await_results=True),
        spawn("@fake reply: looks fine to me", profile="reviewer"),
        collect("$2", await_results=True),
        spawn("@fake reply: plain answer"),
        collect("$4", await_results=True),
    )
    assert good["selection"]["requested"] == {"profile": "reviewer"}
    (done,) = good_result["results"]
    assert (done["status"], done["structured_output"], done["error"]) == ("done", {"findings": ["a nit"]}, None)
    (refused,) = bad_result["results"]
    assert refused["status"] == "failed"  # text alone is not a structured result
    assert refused["structured_output"] is None
    assert refused["result"] == "looks fine to me"
    assert "output schema" in refused["error"]
    assert plain_result["results"][0]["structured_output"] is None
    first, _, third = child_requests(gateway.fake)
    system = str(first.body["messages"][0]["content"])
    assert "PROFILE-MARKER-ONE" in system
    assert "EDITED LATER" not in system
    assert '"findings"' in system  # the child is told the schema
    assert "read" not in tools_of(first)
    assert "read" in tools_of(third)
    assert "PROFILE-MARKER-ONE" not in json.dumps(third.body["messages"])
    owner = gateway.server._children.plugin_owner(good["run_id"])
    assert owner is not None
    assert owner.profile is not None
    assert owner.profile["pluginId"] == "profiled"
    assert owner.profile["id"] == "reviewer"
    assert owner.profile["instructionsFile"] == "agents/reviewer.md"
    assert len(owner.profile["instructionsSha256"]) == 64


async def test_schemas_cannot_be_replaced_and_profiles_are_the_plugins_own(gateway: Gateway) -> None:
    replaced, unknown, _with_schema, result = await gateway.steps(
        spawn("x", profile="reviewer", output_schema={"type": "string"}),
        spawn("x", profile="nope"),
        spawn('@fake reply: ["one", "two"]', output_schema={"type": "array"}),
        collect("$2", await_results=True),
    )
    assert replaced == {"error": "native_invalid_argument"}
    assert unknown == {"error": "native_invalid_argument"}
    assert result["results"][0]["structured_output"] == ["one", "two"]  # a spawn's own schema works
    foreign = await gateway.steps(
        spawn("x", profile="reviewer"), spawn("x", profile="profiled:reviewer"), prefix="othernative"
    )
    assert foreign == [{"error": "native_invalid_argument"}, {"error": "native_invalid_argument"}]
    assert len(child_requests(gateway.fake)) == 1


async def test_a_reload_adopts_new_instructions_and_retires_the_old_registration(
    gateway: Gateway, tmp_path: Path
) -> None:
    old_register = captured("native")["register"]
    instructions = tmp_path / "plugins" / "profiled" / "agents" / "plain.md"
    instructions.write_text("SECOND EDITION\n")
    await gateway.steps(spawn("@fake reply: before", profile="plain"), collect("$0", await_results=True))
    gateway.server._plugins.reload("profiled")
    await gateway.steps(spawn("@fake reply: after", profile="plain"), collect("$0", await_results=True))
    before, after = (str(r.body["messages"][0]["content"]) for r in child_requests(gateway.fake))
    assert "Plain profile words." in before
    assert "SECOND EDITION" not in before  # captured at the first registration
    assert "SECOND EDITION" in after  # the reloaded instance captured the file anew
    with pytest.raises(PluginRetiredError):
        old_register(id="plain", description="d", instructions_file="agents/plain.md")

"""A plugin's native children are held to its model policy (``plugins.entries.<id>.subagent``), the same one
``complete`` and ``subagent.run`` apply: on the reply-dispatch facade, the command-scoped facade and with a
profile, an override outside the policy is refused (``subagent_model_refused``) before any child exists, never run
on the default model; one inside it runs on exactly that model, as the fake model server sees it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer
from tests.integration.gateway import test_command_natives, test_native_facade, test_native_profiles
from tests.integration.gateway.test_native_facade import Gateway, collect, make_config, spawn
from tests.integration.gateway.test_ws_protocol import API_KEY, connected

Steps = Callable[..., Awaitable[list[Any]]]

#: The native paths: how to open a gateway whose plugin ``plugin_id`` runs steps on it, and how to run them.
PATHS = ["reply_dispatch", "command", "profile"]
PLUGIN_IDS = {"reply_dispatch": "reviewer", "command": "commander", "profile": "profiled"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


def extra(base_url: str, path: str, policy: dict[str, Any] | None) -> dict[str, Any]:
    models = [{"id": "fake-model"}, {"id": "backup"}]
    document: dict[str, Any] = {
        "models": {"providers": {"fake": {"baseUrl": base_url, "apiKey": API_KEY, "models": models}}}
    }
    if policy is not None:
        document["plugins"] = {"entries": {PLUGIN_IDS[path]: {"subagent": policy}}}
    return document


async def open_path(
    tmp_path: Path, fake: FakeModelServer, path: str, policy: dict[str, Any] | None
) -> tuple[GatewayServer, Any, aiohttp.ClientSession, Steps]:
    config = extra(fake.base_url, path, policy)
    if path == "reply_dispatch":
        server, client, http = await test_native_facade.open_gateway(tmp_path, fake, **config)
        gateway = Gateway(server, fake, client)
        return server, client, http, gateway.steps
    if path == "command":
        server, client, http = await test_command_natives.open_gateway(tmp_path, fake, **config)
        gateway = Gateway(server, fake, client)

        async def command_steps(*items: dict[str, Any]) -> list[Any]:
            answers: list[Any] = json.loads(await gateway.say("/review " + json.dumps({"steps": items})))
            return answers

        return server, client, http, command_steps
    plugin = test_native_profiles.write_plugin(
        tmp_path / "plugins", "profiled", "native", profiles=["reviewer", "plain", "spare"]
    )
    server = GatewayServer(
        make_config(tmp_path, fake.base_url, **config), data_dir=tmp_path / "data", plugin_paths=[plugin]
    )
    await server.start()
    http = aiohttp.ClientSession()
    client = await connected(http, server.port)
    gateway = Gateway(server, fake, client)

    async def profile_steps(*items: dict[str, Any]) -> list[Any]:
        profiled = [
            dict(item, args={**item["args"], "profile": "plain"}) if item["op"] == "spawn" else item for item in items
        ]
        return await gateway.steps(*profiled)

    return server, client, http, profile_steps


@pytest.fixture
async def opened(
    tmp_path: Path, fake: FakeModelServer, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[[str, dict[str, Any] | None], Awaitable[Steps]]]:
    opened: list[tuple[GatewayServer, Any, aiohttp.ClientSession]] = []

    async def open_one(path: str, policy: dict[str, Any] | None) -> Steps:
        server, client, http, steps = await open_path(tmp_path, fake, path, policy)
        opened.append((server, client, http))
        return steps

    try:
        yield open_one
    finally:
        for server, client, http in opened:
            await client.ws.close()
            await http.close()
            await server.stop()


def models_called(fake: FakeModelServer) -> list[str]:
    return [str(r.body["model"]) for r in fake.requests if r.path.endswith("/chat/completions")]


REFUSALS: list[tuple[str, dict[str, Any] | None, str]] = [
    ("no policy", None, "fake/backup"),
    ("override not allowed", {"allowModelOverride": False, "allowedModels": ["*"]}, "fake/backup"),
    ("not in allowedModels", {"allowModelOverride": True, "allowedModels": ["fake/fake-model"]}, "fake/backup"),
    ("empty allowedModels", {"allowModelOverride": True}, "fake/backup"),
    ("unconfigured model", {"allowModelOverride": True, "allowedModels": ["*"]}, "fake/nope"),
    ("unknown provider", {"allowModelOverride": True, "allowedModels": ["*"]}, "other/backup"),
    ("not canonical", {"allowModelOverride": True, "allowedModels": ["*"]}, "backup"),
    ("case differs", {"allowModelOverride": True, "allowedModels": ["*"]}, "fake/Backup"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("policy", "model"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
async def test_a_model_outside_the_policy_is_refused_before_any_child(
    opened: Callable[[str, dict[str, Any] | None], Awaitable[Steps]],
    fake: FakeModelServer,
    path: str,
    policy: dict[str, Any] | None,
    model: str,
) -> None:
    steps = await opened(path, policy)
    refused, listed = await steps(spawn("@fake reply: should not run", model=model), {"op": "list", "args": {}})
    assert refused == {"error": "subagent_model_refused"}
    assert listed == []  # nothing was recorded in custody
    assert models_called(fake) == []  # no child ran, on the requested model or on the default


@pytest.mark.parametrize("path", PATHS)
async def test_without_a_model_the_child_runs_on_the_default(
    opened: Callable[[str, dict[str, Any] | None], Awaitable[Steps]], fake: FakeModelServer, path: str
) -> None:
    steps = await opened(path, None)
    accepted, collected = await steps(spawn("@fake reply: on the default"), collect("$0", await_results=True))
    assert accepted["selection"]["resolved"] == {"model": "fake/fake-model"}
    assert collected["results"][0]["status"] == "done"
    assert models_called(fake) == ["fake-model"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("allowed", [["fake/backup"], ["*"]])
async def test_an_allowed_override_runs_on_exactly_that_model(
    opened: Callable[[str, dict[str, Any] | None], Awaitable[Steps]],
    fake: FakeModelServer,
    path: str,
    allowed: list[str],
) -> None:
    steps = await opened(path, {"allowModelOverride": True, "allowedModels": allowed})
    accepted, collected = await steps(
        spawn("@fake reply: from backup", model="fake/backup"), collect("$0", await_results=True)
    )
    requested = {"model": "fake/backup", **({"profile": "plain"} if path == "profile" else {})}
    assert accepted["selection"] == {"requested": requested, "resolved": {"model": "fake/backup"}}
    (result,) = collected["results"]
    assert (result["status"], result["result"]) == ("done", "from backup")
    assert models_called(fake) == ["backup"]


async def test_the_policy_is_per_plugin(tmp_path: Path, fake: FakeModelServer) -> None:
    # The reviewer's policy allows the override; the other plugin on the same gateway has none of its own.
    policy = {"allowModelOverride": True, "allowedModels": ["*"]}
    server, client, http = await test_native_facade.open_gateway(
        tmp_path, fake, **extra(fake.base_url, "reply_dispatch", policy)
    )
    try:
        gateway = Gateway(server, fake, client)
        (refused,) = await gateway.steps(spawn("@fake reply: no", model="fake/backup"), prefix="othernative")
        assert refused == {"error": "subagent_model_refused"}
        _, collected = await gateway.steps(
            spawn("@fake reply: yes", model="fake/backup"), collect("$0", await_results=True)
        )
        assert collected["results"][0]["result"] == "yes"
    finally:
        await client.ws.close()
        await http.close()
        await server.stop()
    assert models_called(fake) == ["backup"]


@pytest.mark.parametrize(
    ("allowed", "outcome"), [(["fake/fake-model"], "refused"), (["fake/backup"], "backup")], ids=["refused", "allowed"]
)
async def test_a_model_a_tool_hook_sets_is_held_to_the_same_policy(
    opened: Callable[[str, dict[str, Any] | None], Awaitable[Steps]],
    fake: FakeModelServer,
    allowed: list[str],
    outcome: str,
) -> None:
    # The reviewer's before_tool_call hook sets model "fake/backup" on a spawn whose task says HOOK-MODEL.
    steps = await opened("reply_dispatch", {"allowModelOverride": True, "allowedModels": allowed})
    answers = await steps(spawn("HOOK-MODEL\n@fake reply: hooked"), {"op": "list", "args": {}})
    if outcome == "refused":
        assert answers == [{"error": "subagent_model_refused"}, []]
        assert models_called(fake) == []
    else:
        (accepted, listed) = answers
        assert [entry["run_id"] for entry in listed] == [accepted["run_id"]]
        (collected,) = await steps(collect(accepted["run_id"], await_results=True))
        assert collected["results"][0]["result"] == "hooked"
        assert models_called(fake) == ["backup"]

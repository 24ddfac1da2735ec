"""OpenClaw's multi-agent config, loaded unchanged into ``claw gateway serve`` and into the real OpenClaw gateway.

One ``agents.list`` fleet (three agents, ``alpha`` marked default, per-agent workspace and model, a
``subagents.allowAgents``) runs on both peers against one scripted fake model with three model ids; a chat on each
agent's session key must be answered by that agent's model on both, and the agent the config does not name must
be refused. The ``claw``-only tests below start ``claw gateway serve`` as a process: two configs in one folder get
two state directories, one config serves one gateway, ignored keys are named in one warning, and a key OpenClaw
has but clawstack does not implement stops start-up with its name.
"""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.gateway.peers import (
    MODEL,
    PROVIDER,
    START_TIMEOUT_S,
    FakeModel,
    Peer,
    PeerClient,
    _command,
    _listening,
    _stop_process,
    _tail,
    claw_executable,
    connect_params,
    free_port,
    offline_config,
    openclaw_marks,
    start_fake_model,
    wait_ready,
)

PEERS = [pytest.param("claw", id="claw"), pytest.param("openclaw", id="openclaw", marks=openclaw_marks())]

#: Each agent and the model id its chats must reach.
AGENT_MODELS = {"alpha": MODEL, "beta": "model-b", "gamma": "model-c"}


def fleet_config(port: int, fake_base_url: str, workdir: Path) -> dict[str, Any]:
    """The offline config with two more models and an ``agents.list`` fleet of three."""
    base = offline_config(port, fake_base_url, workdir)
    models = base["models"]
    provider = models["providers"][PROVIDER]
    extra_models = [{**provider["models"][0], "id": model, "name": f"Fake {model}"} for model in ("model-b", "model-c")]
    agents = {
        "defaults": base["agents"]["defaults"],
        "list": [
            {"id": "alpha", "default": True, "name": "Alpha", "subagents": {"allowAgents": ["beta", "gamma"]}},
            {"id": "beta", "model": f"{PROVIDER}/model-b", "workspace": str(workdir / "ws-beta")},
            {
                "id": "gamma",
                "model": {"primary": f"{PROVIDER}/model-c", "fallbacks": [f"{PROVIDER}/{MODEL}"]},
                "identity": {"name": "Gamma", "emoji": "🦀"},
            },
        ],
    }
    models = {**models, "providers": {PROVIDER: {**provider, "models": [*provider["models"], *extra_models]}}}
    return offline_config(port, fake_base_url, workdir, extra={"models": models, "agents": agents})


def start_fleet_peer(name: str, workdir: Path, fake_base_url: str) -> Peer:
    """Peer ``name`` on :func:`fleet_config`, returned once its port listens (as ``peers.start_peer`` does)."""
    port = free_port()
    (workdir / "workspace").mkdir(parents=True)
    config_path = workdir / ("home/.openclaw/openclaw.json" if name == "openclaw" else "gateway.json5")
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(fleet_config(port, fake_base_url, workdir), indent=2))
    argv, env = _command(name, workdir, config_path)
    log_path = workdir / f"{name}.log"
    with log_path.open("ab") as log:
        spawned_at = time.perf_counter()
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=workdir, start_new_session=True
        )
    while not _listening(port):
        if proc.poll() is not None or time.perf_counter() > spawned_at + START_TIMEOUT_S:
            _stop_process(proc)
            raise RuntimeError(f"{name} did not listen on {port}:\n{_tail(log_path)}")
        time.sleep(0.02)
    return Peer(name, proc, port, workdir, log_path, spawned_at, time.perf_counter())


@pytest.fixture(scope="module", params=PEERS)
def fleet(request: pytest.FixtureRequest) -> Iterator[tuple[Peer, FakeModel]]:
    """A peer on the fleet config, ready, with its own fake model; removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix=f"agents-{request.param}-", dir="/tmp"))
    try:
        fake = start_fake_model(workdir / "fake-llm.log")
        try:
            peer = start_fleet_peer(request.param, workdir, fake.base_url)
            try:
                asyncio.run(wait_ready(peer))
                yield peer, fake
            finally:
                peer.stop()
        finally:
            fake.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_hello_names_the_marked_agent_as_the_default(
    fleet: tuple[Peer, FakeModel], http: aiohttp.ClientSession
) -> None:
    peer, _ = fleet
    client = await PeerClient.open(http, peer.url)
    hello = await client.request("connect", _connect(peer))
    defaults = hello["payload"]["snapshot"]["sessionDefaults"]
    assert (defaults["defaultAgentId"], defaults["mainSessionKey"]) == ("alpha", "agent:alpha:main")
    await client.ws.close()


@pytest.mark.parametrize("agent", list(AGENT_MODELS))
async def test_each_agent_answers_from_its_own_model(
    fleet: tuple[Peer, FakeModel], http: aiohttp.ClientSession, agent: str
) -> None:
    peer, fake = fleet
    client = await PeerClient.open(http, peer.url)
    assert (await client.request("connect", _connect(peer)))["ok"]
    key, run_id = f"agent:{agent}:main", str(uuid.uuid4())
    marker = f"hello {agent} {run_id}"
    res = await client.request("chat.send", {"sessionKey": key, "message": marker, "idempotencyKey": run_id})
    assert res["payload"] == {"runId": run_id, "status": "started"}, res
    final = (await client.wait_for_chat(run_id, "final", "error", "aborted"))["payload"]
    assert (final["state"], final["sessionKey"], final["agentId"]) == ("final", key, agent)
    requests = [r for r in await asyncio.to_thread(fake.requests) if _mentions(r, marker)]
    assert [r["body"]["model"] for r in requests] == [AGENT_MODELS[agent]]
    lifecycle = [e["data"] for e in client.run_events("agent", run_id) if e["stream"] == "lifecycle"]
    assert next((d["provider"], d["model"]) for d in lifecycle if d["phase"] == "model") == (
        PROVIDER,
        AGENT_MODELS[agent],
    )
    history = (await client.request("chat.history", {"sessionKey": key, "limit": 10}))["payload"]
    answer = history["messages"][-1]
    assert (answer["role"], answer["provider"], answer["model"]) == ("assistant", PROVIDER, AGENT_MODELS[agent])
    await client.ws.close()


async def test_an_agent_the_config_does_not_name_is_refused(
    fleet: tuple[Peer, FakeModel], http: aiohttp.ClientSession
) -> None:
    peer, _ = fleet
    client = await PeerClient.open(http, peer.url)
    assert (await client.request("connect", _connect(peer)))["ok"]
    run_id = str(uuid.uuid4())
    # "main" exists only when the config names no agent.
    res = await client.request(
        "chat.send", {"sessionKey": "agent:main:main", "message": "hi", "idempotencyKey": run_id}
    )
    assert (res["ok"], res["error"]["code"]) == (False, "INVALID_REQUEST")
    await client.ws.close()


def _connect(peer: Peer) -> dict[str, Any]:
    return connect_params(auth=peer.credentials)


def _mentions(request: dict[str, Any], marker: str) -> bool:
    if request["path"] != "/v1/chat/completions":
        return False
    users = [m for m in request["body"].get("messages", []) if m.get("role") == "user"]
    return any(marker in json.dumps(m.get("content"), ensure_ascii=False) for m in users)


# -- claw gateway serve as a process -----------------------------------------------------------------------------

READY = "gateway listening on "


def _claw_config(directory: Path, name: str, **extra: Any) -> Path:
    """An offline config on port 0 (no model is called) written to ``directory/name``."""
    document = offline_config(0, "http://127.0.0.1:9/v1", directory, extra=extra)
    path = directory / name
    path.write_text(json.dumps(document))
    return path


def _serve(config: Path, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "CLAW_GATEWAY_HOME": str(home)}
    argv = [claw_executable(), "gateway", "serve", "--config", str(config), "--log-level", "warning"]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def _first_line(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> str:
    """The first stdout line, or ``""`` once the process exits without one; fails after ``timeout_s``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            pytest.fail(f"no line from claw gateway serve within {timeout_s:g} s")
    return proc.stdout.readline()


def _stop(proc: subprocess.Popen[str]) -> str:
    """Stop ``proc`` (if it still runs) and return its stderr."""
    if proc.poll() is None:
        proc.terminate()
    _, stderr = proc.communicate(timeout=30)
    return stderr


def test_two_configs_in_one_folder_get_two_state_directories(tmp_path: Path) -> None:
    folder, home = tmp_path / "configs", tmp_path / "home"
    folder.mkdir()
    first = _serve(_claw_config(folder, "a.json5"), home)
    second = _serve(_claw_config(folder, "b.json5"), home)
    again = None
    try:
        assert _first_line(first).startswith(READY)
        assert _first_line(second).startswith(READY)
        states = sorted(p.name for p in home.iterdir())
        assert len(states) == 2
        assert states[0].startswith("a-")
        assert states[1].startswith("b-")
        for state in states:
            assert (home / state / "sessions.sqlite3").is_file()
        # The same config file is the same gateway: a second process on it is refused by the store lock.
        again = _serve(folder / "a.json5", home)
        assert _first_line(again) == ""
        assert again.wait(timeout=30) != 0
        assert "another session store holds this database" in _stop(again)
    finally:
        stderr = [_stop(p) for p in (first, second)]
    warnings = [line for line in stderr[0].splitlines() if "config keys with no effect" in line]
    assert len(warnings) == 1
    named = warnings[0].split("docs/gateway-config.md): ", 1)[1].split(", ")
    assert named == [
        "update",
        "logging",
        "telemetry",
        "discovery",
        "gateway.tailscale",
        "models.mode",
        "models.catalogRefresh",
        f"models.providers.{PROVIDER}.models[0].reasoning",
        f"models.providers.{PROVIDER}.models[0].input",
        f"models.providers.{PROVIDER}.models[0].cost",
    ]


def test_an_openclaw_key_clawstack_does_not_implement_stops_start_up(tmp_path: Path) -> None:
    base = offline_config(0, "http://127.0.0.1:9/v1", tmp_path)
    agents = {**base["agents"], "defaults": {**base["agents"]["defaults"], "sandbox": {"mode": "all"}}}
    proc = _serve(_claw_config(tmp_path, "gateway.json5", agents=agents), tmp_path / "home")
    assert _first_line(proc) == ""
    assert proc.wait(timeout=30) == 1
    assert "agents.defaults.sandbox: not supported by claw gateway" in _stop(proc)
    assert not (tmp_path / "home").exists()  # nothing was created

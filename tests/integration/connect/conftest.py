"""Processes for the ClawConnect end-to-end tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.connect.harness import FakeModel, GatewayProcess
from tests.integration.gateway import peers

#: The gateways ClawConnect's peer tests run against, with the auth mode each runs in: ``claw gateway serve`` and
#: the real OpenClaw gateway in token mode (``agents.json``), and the real one again in password mode (the
#: ``OPENCLAW_*`` environment). ``claw gateway serve`` in password mode is what the other end-to-end tests use.
PEERS = [
    pytest.param(("claw", "token"), id="claw"),
    pytest.param(("openclaw", "token"), id="openclaw", marks=peers.openclaw_marks()),
    pytest.param(("openclaw", "password"), id="openclaw-password", marks=peers.openclaw_marks()),
]

ScriptedModel = Callable[[list[dict[str, Any]]], peers.FakeModel]


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModel]:
    fake = FakeModel()
    try:
        yield fake
    finally:
        fake.close()


@pytest.fixture
def gateway(tmp_path: Path, fake_model: FakeModel) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path, fake_model)
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def peer_model_port() -> int:
    return peers.free_port()


@pytest.fixture(scope="module", params=PEERS)
def peer(request: pytest.FixtureRequest, peer_model_port: int) -> Iterator[peers.Peer]:
    """A gateway peer, started once per module (the real gateway takes about 13 s to be ready)."""
    name, auth_mode = request.param
    with peers.running_peer(name, peer_model_port, auth_mode=auth_mode) as gateway:
        yield gateway


@pytest.fixture
def scripted_model(peer: peers.Peer, peer_model_port: int) -> Iterator[ScriptedModel]:
    """Start the fake model behind ``peer`` with a script (docs/fake-llm.md); stopped after the test.

    Script steps, not ``@fake`` directives: the real gateway appends context of its own after the user's message,
    so a directive in a task never reaches the fake.
    """
    started: list[peers.FakeModel] = []

    def start(script: list[dict[str, Any]]) -> peers.FakeModel:
        fake = peers.start_fake_model(peer.workdir / "fake-llm.log", port=peer_model_port, script=script)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()

"""Fixtures for ClawConnect's unit tests: a real gateway in process, with the scripted model behind it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer

PASSWORD = "unit-gateway-password"


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


@pytest.fixture
async def gateway(tmp_path: Path, fake: FakeModelServer) -> AsyncIterator[GatewayServer]:
    document = {
        "models": {"providers": {"fake": {"baseUrl": fake.base_url, "apiKey": "k", "models": [{"id": "m"}]}}},
        "agents": {"defaults": {"model": {"primary": "fake/m"}}},
        "gateway": {"port": 0, "auth": {"mode": "password", "password": PASSWORD}},
    }
    config = parse_config(document, base_dir=tmp_path, environ={})
    async with GatewayServer(config, data_dir=tmp_path / "gw") as server:
        yield server

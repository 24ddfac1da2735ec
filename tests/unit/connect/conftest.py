"""Fixtures for ClawConnect's unit tests: a real gateway in process, with the scripted model behind it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clawstack.connect import ConnectService, JobStore, parse_agents
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


def agents_for(url: str, *, openclaw_agent: str = "main") -> Any:
    return parse_agents(
        {
            "agents": [
                {"id": "house", "url": url, "password": PASSWORD, "openclawAgentId": openclaw_agent},
                {"id": "ghost", "url": url, "password": PASSWORD, "openclawAgentId": "ghost"},
            ]
        }
    )


@pytest.fixture
async def service(tmp_path: Path, gateway: GatewayServer) -> AsyncIterator[ConnectService]:
    svc = ConnectService(agents_for(gateway.url), JobStore(tmp_path / "jobs" / "jobs.sqlite3"))
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()

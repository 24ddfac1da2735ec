"""The agent-session service tests' fixture: ``make`` starts a ConnectService over the in-process gateway, with a
registry (or none) and options, in its own data directory, and stops every one it started."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from clawstack.connect import ConnectService, JobStore
from clawstack.connect.agent_session import AgentSessionRuntimeRegistry
from clawstack.gateway.server import GatewayServer
from tests.unit.connect.agent_session.fakes import Factory
from tests.unit.connect.conftest import agents_for


@pytest.fixture
async def make(tmp_path: Path, gateway: GatewayServer) -> AsyncIterator[Factory]:
    started: list[ConnectService] = []

    async def factory(
        registry: AgentSessionRuntimeRegistry | None = None, *, data: str = "c", **kw: Any
    ) -> ConnectService:
        svc = ConnectService(
            agents_for(gateway.url), JobStore(tmp_path / data / "jobs.sqlite3"), agent_session_runtimes=registry, **kw
        )
        await svc.start()
        started.append(svc)
        return svc

    yield factory
    for svc in started:
        await svc.stop()

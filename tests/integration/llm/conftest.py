"""Fixtures for the llm integration tests: a real fake model server on a real socket, and a client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clawstack.llm import LLMClient
from clawstack.llm.fake import FakeModelServer


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


@pytest.fixture
async def client(fake: FakeModelServer) -> AsyncIterator[LLMClient]:
    async with LLMClient(fake.base_url, timeout_s=10.0) as llm:
        yield llm


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    """A Unix socket path in tmp_path; such paths must stay short (the limit is 107 bytes)."""
    path = tmp_path / "m.sock"
    assert len(str(path).encode()) < 100, "keep test names short: the socket path is too long"
    return path

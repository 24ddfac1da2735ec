"""Processes for the ClawConnect end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.connect.harness import FakeModel, GatewayProcess


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

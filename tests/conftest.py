"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory with a short path (socket paths are limited to 107 bytes) and safe ancestors."""
    path = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``hermes``-marked tests need the Hermes installation (``scripts/hermes-up``, which ``scripts/setup`` runs):
    without it they skip and say why, except under ``CLAWSTACK_REQUIRE_HERMES=1`` (CI), where they fail."""
    from clawstack.pod.errors import BackendError
    from clawstack.pod.hermes import hermes_installation

    if os.environ.get("CLAWSTACK_REQUIRE_HERMES") == "1":
        return
    try:
        hermes_installation()
    except BackendError as exc:
        skip = pytest.mark.skip(reason=f"no Hermes installation: {exc.message}")
        for item in items:
            if "hermes" in item.keywords:
                item.add_marker(skip)

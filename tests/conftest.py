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

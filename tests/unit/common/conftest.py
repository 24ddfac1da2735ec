from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

NOBODY = 65534


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A private directory with a short path (socket paths are limited to 107 bytes), safe ancestors."""
    path = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    os.chmod(path, 0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to create files owned by, or run processes as, another user"
)

from __future__ import annotations

import os

import pytest

NOBODY = 65534


requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to create files owned by, or run processes as, another user"
)

"""A real bubblewrap for the tests that run sandboxes: missing, they fail and say what to install."""

from __future__ import annotations

import shutil

import pytest

from clawstack.sandbox import Sandbox


@pytest.fixture
def sandbox() -> Sandbox:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap (bwrap) is not installed here: apt-get install -y bubblewrap")
    if shutil.which("prlimit") is None:
        pytest.fail("prlimit (util-linux) is not installed here: apt-get install -y util-linux")
    return Sandbox()

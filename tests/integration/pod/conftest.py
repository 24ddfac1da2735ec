"""Fixtures of the pod integration tests: clawstack's own images, built once per session."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def clawstack_images() -> list[Any]:
    """The proxy and worker images (``claw images build``; an up-to-date image is not rebuilt)."""
    from clawstack.pod.imagebuild import build_images

    return build_images()

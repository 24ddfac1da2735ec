"""The images clawstack builds for the compose backend, without a registry (see ``claw images build``)."""

from __future__ import annotations

from typing import Final

from clawstack import __version__

BASE_IMAGE: Final = f"clawstack/base:{__version__}"
PROXY_IMAGE: Final = f"clawstack/proxy:{__version__}"
WORKER_IMAGE: Final = f"clawstack/worker:{__version__}"

__all__ = ["BASE_IMAGE", "PROXY_IMAGE", "WORKER_IMAGE"]

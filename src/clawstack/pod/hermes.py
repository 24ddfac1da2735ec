"""The Hermes installation task-home workers run under the local backend: ``hermes-agent`` in a virtual
environment of its own, built with this interpreter.

It lives at :data:`VENV_ENV`, by default :func:`hermes_venv` (``/opt/clawstack/hermes-venv`` for root, else
``~/.local/share/clawstack/hermes-venv``); ``scripts/hermes-up`` installs it there. ``claw up`` pins
it, with the wrapper's own code, in the template's runner digest (:func:`hermes_pin`: the version and a digest of
the package's ``RECORD``), and the supervisor checks the pin again before each worker starts, so a Hermes upgraded
under a compiled pod is ``runner_changed`` rather than a different worker.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from clawstack.pod.errors import BackendError

VENV_ENV: Final = "CLAW_HERMES_VENV"
VERSION: Final = "0.19.0"
"""The ``hermes-agent`` release the wrapper is written against (``clawstack.worker.hermes``)."""


@dataclass(frozen=True, slots=True)
class HermesInstallation:
    site: Path
    version: str
    record_sha256: str


def hermes_venv(environ: Mapping[str, str] | None = None) -> Path:
    """Where the Hermes virtual environment is: :data:`VENV_ENV`, else the default for this user."""
    named = (os.environ if environ is None else environ).get(VENV_ENV)
    if named:
        return Path(named)
    if os.geteuid() == 0:
        return Path("/opt/clawstack/hermes-venv")
    return Path.home() / ".local" / "share" / "clawstack" / "hermes-venv"


def hermes_installation(environ: Mapping[str, str] | None = None) -> HermesInstallation:
    """The installation at :func:`hermes_venv`; :class:`BackendError` (``runner_unavailable``) when it is
    missing, built for another Python, or another release than :data:`VERSION`."""
    venv = hermes_venv(environ)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    dist = site / f"hermes_agent-{VERSION}.dist-info"
    record = dist / "RECORD"
    if not record.is_file():
        found = sorted(p.name for p in site.glob("hermes_agent-*.dist-info")) if site.is_dir() else []
        detail = f"found {found[0]}" if found else "not installed"
        raise BackendError(
            f"the local task-home runner needs hermes-agent {VERSION} in a virtual environment built with Python "
            f"{sys.version_info.major}.{sys.version_info.minor} at {VENV_ENV} (default {venv}): {detail}; "
            "run scripts/hermes-up",
            code="runner_unavailable",
        )
    return HermesInstallation(site=site, version=VERSION, record_sha256=hashlib.sha256(record.read_bytes()).hexdigest())


def hermes_pin() -> str | None:
    """What a template pins of the installation (``None`` when it is not there)."""
    try:
        found = hermes_installation()
    except BackendError:
        return None
    return f"hermes-agent {found.version} {found.record_sha256}"


__all__ = ["VENV_ENV", "VERSION", "HermesInstallation", "hermes_installation", "hermes_pin", "hermes_venv"]

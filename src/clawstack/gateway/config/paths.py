"""Where a gateway keeps its state, and where each agent's workspace is.

**The state directory.** Sessions, transcripts, runs and the default workspaces live in one directory per gateway.
``claw gateway serve --data-dir DIR`` names it; without that, :func:`default_state_dir` derives it from the config
file, so that two gateways whose configs sit in one folder never share it (OpenClaw keeps each gateway's state
under its own home, ``$OPENCLAW_STATE_DIR`` or ``$OPENCLAW_HOME/.openclaw``; clawstack has one home for every
gateway of a user and one directory per config inside it)::

    <home>/<config-stem>-<16 hex digits of sha256(absolute config path)>

where ``<home>`` is ``$CLAW_GATEWAY_HOME`` when set, else ``$XDG_STATE_HOME/clawstack/gateway`` when that is an
absolute path, else ``~/.local/state/clawstack/gateway``. The same config file always maps to the same directory
(a second gateway on it then refuses to start on the store lock); a copy of it elsewhere gets another.

**Workspaces** follow OpenClaw's rule (:func:`agent_workspace`): an agent's own ``workspace``; else, for the agent
that owns the shared root (the one marked ``default: true``, or the only agent), ``agents.defaults.workspace``;
else ``<agents.defaults.workspace>/<agent id>``; and when ``agents.defaults.workspace`` is not set, the state
directory takes its place: ``<state>/workspace`` for the owner, ``<state>/workspace-<agent id>`` for the others.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "GATEWAY_HOME_ENV",
    "agent_workspace",
    "default_state_dir",
    "gateway_home",
]

#: The variable that moves every gateway's default state directory.
GATEWAY_HOME_ENV = "CLAW_GATEWAY_HOME"

_STEM_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_STEM = 48


def gateway_home(environ: Mapping[str, str] | None = None) -> Path:
    """The directory holding the default state directories: ``$CLAW_GATEWAY_HOME``, or the per-user default."""
    env = os.environ if environ is None else environ
    explicit = env.get(GATEWAY_HOME_ENV, "").strip()
    if explicit:
        return Path(os.path.abspath(Path(explicit).expanduser()))
    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "clawstack" / "gateway"
    home = env.get("HOME", "").strip()
    base = Path(home) if home and Path(home).is_absolute() else Path.home()
    return base / ".local" / "state" / "clawstack" / "gateway"


def default_state_dir(config_path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Path:
    """The state directory of the gateway serving ``config_path`` when ``--data-dir`` is not given.

    ``<home>/<stem>-<digest>``: ``<stem>`` is the file name without its suffix (characters outside
    ``[A-Za-z0-9._-]`` become ``-``), ``<digest>`` the first 16 hex digits of the SHA-256 of the absolute path.
    """
    absolute = Path(os.path.abspath(Path(config_path).expanduser()))
    digest = hashlib.sha256(os.fsencode(absolute)).hexdigest()[:16]
    stem = _STEM_UNSAFE.sub("-", absolute.stem).strip("-.")[:_MAX_STEM] or "gateway"
    return gateway_home(environ) / f"{stem}-{digest}"


def agent_workspace(
    agent_id: str,
    *,
    own: Path | None,
    root: Path | None,
    owns_root: bool,
    state_dir: Path,
) -> Path:
    """The workspace of ``agent_id`` by OpenClaw's rule (module docstring).

    ``own`` is the agent's ``workspace``, ``root`` is ``agents.defaults.workspace``, ``owns_root`` says whether this
    agent is the one that uses the shared root itself.
    """
    if own is not None:
        return own
    if root is not None:
        return root if owns_root else root / agent_id
    return state_dir / "workspace" if owns_root else state_dir / f"workspace-{agent_id}"

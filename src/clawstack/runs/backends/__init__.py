"""Where workers run. The supervisor sees every backend through :class:`Backend` (``base``): spawn one worker
for a run, inspect it, remove it, list them all. ``local`` is the embedded default and, today, the only backend:
a bubblewrap sandbox per worker owned by a detached monitor. (The Docker Compose backend is not built yet.)
"""

from clawstack.runs.backends.base import Backend, Isolation, RunLabels, WorkerSpec, WorkerState
from clawstack.runs.backends.local import (
    IsolationUnavailableError,
    LocalBackend,
    LocalBackendError,
    SpawnError,
)
from clawstack.runs.backends.monitor import SANDBOX_CONFIG_FILE, SANDBOX_PROXY_SOCKET

__all__ = [
    "SANDBOX_CONFIG_FILE",
    "SANDBOX_PROXY_SOCKET",
    "Backend",
    "Isolation",
    "IsolationUnavailableError",
    "LocalBackend",
    "LocalBackendError",
    "RunLabels",
    "SpawnError",
    "WorkerSpec",
    "WorkerState",
]

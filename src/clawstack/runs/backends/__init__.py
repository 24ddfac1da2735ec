"""Where workers run. The supervisor sees every backend through :class:`Backend` (``base``): spawn one worker
for a run, inspect it, remove it, list them all. ``local`` (the embedded default) runs each worker in a
bubblewrap sandbox owned by a detached monitor; ``compose`` runs each as its own Docker Compose project.
:func:`backend_for` makes the one a compiled pod declares.
"""

from clawstack.runs.backends.base import Backend, Isolation, IsolationReport, RunLabels, WorkerSpec, WorkerState
from clawstack.runs.backends.factory import backend_for
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
    "IsolationReport",
    "IsolationUnavailableError",
    "LocalBackend",
    "LocalBackendError",
    "RunLabels",
    "SpawnError",
    "WorkerSpec",
    "WorkerState",
    "backend_for",
]

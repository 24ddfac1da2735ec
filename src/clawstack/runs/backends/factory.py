"""Making the backend a compiled pod declares."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clawstack.runs.backends.base import Backend
from clawstack.runs.backends.local import LocalBackend

if TYPE_CHECKING:
    from clawstack.pod.artifacts import PodPaths


def backend_for(paths: PodPaths, *, allow_no_isolation: bool = False) -> Backend:
    """The backend the compiled pod at ``paths`` declares (``x-claw.backend``), serving that pod alone.

    ``allow_no_isolation`` lets the local backend run workers without bubblewrap; it means nothing to compose.
    Raises :class:`~clawstack.pod.errors.PodError` (``pod_uncompiled``) before ``claw up``.
    """
    from clawstack.pod.artifacts import read_pod_manifest

    manifest = read_pod_manifest(paths)
    workers = paths.runs / "workers"
    if manifest["backend"] == "compose":
        from clawstack.pod.compose import PROXY_WORKER_URL
        from clawstack.pod.netguard import ensure_guard, remove_guard, runs_network
        from clawstack.runs.backends.compose import ComposeBackend

        network = runs_network(manifest["pod"])
        return ComposeBackend(
            workers,
            pod=manifest["pod"],
            network=network.name,
            proxy_url=PROXY_WORKER_URL,
            guard=lambda: ensure_guard(network),
            home_guard=ensure_guard,  # a task-home run's own network is kept off the host too
            home_unguard=remove_guard,
        )
    return LocalBackend(workers, pod=manifest["pod"], allow_no_isolation=allow_no_isolation)


__all__ = ["backend_for"]

"""Stand-in backends shared by the run benchmarks (imported by scripts run as ``python bench/<name>.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from clawstack.runs.backends.base import Isolation, RunLabels, WorkerSpec, WorkerState


class NoWorkers:
    """A backend that never has a worker: the supervisor's own cost is all that is measured."""

    isolation: Isolation = "none"

    async def spawn(self, spec: WorkerSpec) -> None:
        return None

    async def inspect(self, labels: RunLabels) -> WorkerState:
        return WorkerState(False, False, None, False, b"", False, "none")

    async def remove(self, labels: RunLabels) -> None:
        return None

    async def list_workers(self) -> Sequence[RunLabels]:
        return []

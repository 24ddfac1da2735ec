"""The pod compiler's exception tree.

::

    PodError (ClawError)            code, and ``where``: the place in the pod the problem is (a file, a key path)
     ├── PodFileError               the pod file or a file it names cannot be read or parsed
     ├── InterpolationError         a ``${VAR}`` cannot be resolved (``${VAR:?message}``, bad syntax)
     ├── ValidationError            a rule of the per-run template specification is broken
     ├── BackendError               the backend cannot provide what the pod asks for (image, runner, Docker)
     └── LockError                  another process holds the pod lock (its pid is named)

Messages say what to change. They never contain a credential: values from ``.env`` or ``cllama-env`` are
named by their variable, never shown.
"""

from __future__ import annotations

from clawstack.common.errors import ClawError


class PodError(ClawError):
    """A pod that cannot be compiled, with ``where`` naming the place (``claw-pod.yml: services.worker``)."""

    code = "pod_invalid"

    def __init__(self, message: str, *, where: str | None = None, code: str | None = None) -> None:
        super().__init__(f"{where}: {message}" if where else message, code=code)
        self.where = where


class PodFileError(PodError):
    code = "pod_file_invalid"


class InterpolationError(PodError):
    code = "interpolation_invalid"


class ValidationError(PodError):
    code = "template_invalid"


class BackendError(PodError):
    code = "backend_unavailable"


class LockError(PodError):
    code = "pod_locked"


__all__ = ["BackendError", "InterpolationError", "LockError", "PodError", "PodFileError", "ValidationError"]

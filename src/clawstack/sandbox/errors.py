"""The sandbox's errors; the tree is drawn in :mod:`clawstack.sandbox`'s docstring."""

from __future__ import annotations

from clawstack.common.errors import ClawError


class SandboxError(ClawError):
    """Root of the sandbox's errors."""

    code = "sandbox_error"


class SandboxUnavailableError(SandboxError):
    """bubblewrap (or ``prlimit``, when limits are asked for) is missing, or cannot create a sandbox here."""

    code = "sandbox_unavailable"


class SandboxSpecError(SandboxError):
    """A mount, variable, command or limit the sandbox cannot take."""

    code = "spec_invalid"


class SandboxStartError(SandboxError):
    """The sandbox's process could not be started."""

    code = "start_failed"
    retryable = True


class ConfinedPathError(SandboxError):
    """A path inside a confined directory that cannot be used as asked; ``code`` says why."""

    code = "path_invalid"


class PathEscapeError(ConfinedPathError):
    """The path leads out of the confined directory (``..``, an absolute path elsewhere, or a symlink)."""

    code = "path_escape"


class PathNotFoundError(ConfinedPathError):
    """Nothing exists at the path (or a directory on the way is missing)."""

    code = "path_not_found"


__all__ = [
    "ConfinedPathError",
    "PathEscapeError",
    "PathNotFoundError",
    "SandboxError",
    "SandboxSpecError",
    "SandboxStartError",
    "SandboxUnavailableError",
]

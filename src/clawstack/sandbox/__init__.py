"""The process sandbox primitive: bubblewrap namespaces, a read-only root, limits and bounded output; and file
access confined to one directory tree. Used by the local run backend and the gateway's workspace tools alike.

* :mod:`clawstack.sandbox.spec` (standard library only): a :class:`SandboxSpec` (environment, ordered
  :class:`Mount` entries, working directory) and :func:`bwrap_argv`, which always adds new user, PID, IPC, UTS,
  cgroup and network namespaces, no capabilities, death with the parent, a new session, a cleared environment
  and a read-only root; :class:`ResourceLimits` (``setrlimit``).
* :mod:`clawstack.sandbox.cgroups` (standard library only): :class:`Containment`, memory and pids limits on a
  whole sandbox: cgroups (v1 or v2) nested under the caller's own where the host lets it, else the rlimits that
  really bound it (``RLIMIT_NPROC`` only under a uid of the sandbox's own), and :class:`Enforcement`, which
  mechanism holds each limit.
* :mod:`clawstack.sandbox.process`: :class:`Sandbox` runs one command in a spec with a wall-clock limit (the
  whole sandbox is killed at it), an optional :class:`Containment` and uid, and bounded stdout/stderr capture,
  returning a :class:`SandboxResult`.
* :mod:`clawstack.sandbox.confined`: :class:`ConfinedDir` opens and replaces files and resolves directories under a root with no
  escape by ``..``, absolute paths or symlinks, and writes that never follow a symlink.

It imports nothing from clawstack but :mod:`clawstack.common`.

Errors::

    ClawError                         (clawstack.common.errors)
     └── SandboxError                 sandbox_error
          ├── SandboxUnavailableError sandbox_unavailable   no bubblewrap (or prlimit), or it cannot sandbox here
          ├── SandboxSpecError        spec_invalid          a mount, variable, command or limit it cannot take
          ├── SandboxStartError       start_failed          bubblewrap could not be started (retryable)
          └── ConfinedPathError       path_invalid          a path that cannot be used as asked; more codes:
               │                      is_a_directory, not_a_directory, not_a_regular_file, is_a_symlink,
               │                      symlink_loop, root_missing, permission_denied, no_space, io_error
               ├── PathEscapeError    path_escape           out of the root by .., an absolute path or a symlink
               └── PathNotFoundError  path_not_found
"""

from clawstack.sandbox.cgroups import Cgroups, Containment, Enforcement, LimitReached, Limits
from clawstack.sandbox.confined import MAX_SYMLINKS, ConfinedDir
from clawstack.sandbox.errors import (
    ConfinedPathError,
    PathEscapeError,
    PathNotFoundError,
    SandboxError,
    SandboxSpecError,
    SandboxStartError,
    SandboxUnavailableError,
)
from clawstack.sandbox.process import DRAIN_S, Sandbox, SandboxResult, default_env
from clawstack.sandbox.spec import (
    SANDBOX_HOSTNAME,
    SYSTEM_DIRS,
    Mount,
    ResourceLimits,
    SandboxSpec,
    bind,
    bind_fd,
    bwrap_argv,
    dev,
    directory,
    fd_file,
    proc,
    ro_bind,
    symlink,
    system_mounts,
    tmpfs,
)

__all__ = [
    "DRAIN_S",
    "MAX_SYMLINKS",
    "SANDBOX_HOSTNAME",
    "SYSTEM_DIRS",
    "Cgroups",
    "ConfinedDir",
    "ConfinedPathError",
    "Containment",
    "Enforcement",
    "LimitReached",
    "Limits",
    "Mount",
    "PathEscapeError",
    "PathNotFoundError",
    "ResourceLimits",
    "Sandbox",
    "SandboxError",
    "SandboxResult",
    "SandboxSpec",
    "SandboxSpecError",
    "SandboxStartError",
    "SandboxUnavailableError",
    "bind",
    "bind_fd",
    "bwrap_argv",
    "default_env",
    "dev",
    "directory",
    "fd_file",
    "proc",
    "ro_bind",
    "symlink",
    "system_mounts",
    "tmpfs",
]

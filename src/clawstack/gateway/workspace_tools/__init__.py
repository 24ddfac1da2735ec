"""The gateway's core workspace tools ``read``, ``write``, ``edit`` and ``exec``, with OpenClaw's names,
argument shapes and result texts.

:func:`workspace_tools` returns them as :class:`~clawstack.gateway.tools.Tool` objects (owner ``None``) for a
:class:`~clawstack.gateway.tools.ToolRegistry`. Every path is confined to the invocation's workspace by
:class:`clawstack.sandbox.ConfinedDir`: a relative path resolves inside it, an absolute one only if it names a
place inside it, and no ``..`` or symlink leads out; ``write`` and ``edit`` never follow a symlink. ``exec``
runs ``/bin/sh -c COMMAND`` in a :class:`clawstack.sandbox.Sandbox`: no network, a read-only root, the workspace
(bound at its own path) the only writable place besides a private ``/tmp``, a clean environment, a time limit
that kills the whole sandbox and a bound on the output. Without a workspace every tool refuses. For a blind
invocation every occurrence of the workspace's path in a result or an error reads ``<workspace>``, and a path
argument may start with ``<workspace>``.

Limits (:class:`WorkspaceToolLimits`): ``read`` shows at most 2000 lines or 50 KB per call (OpenClaw's), and
says how to continue; files over 256 MiB are refused. ``write`` and ``edit`` take files of at most 1 MiB.
``exec`` waits 30 s by default and at most 600 s, and keeps the last 64 KiB of its output; its whole sandbox
holds at most 256 processes and 1 GiB of memory (``tools.exec``, :func:`exec_limits`), and runs as uid 65534
when the gateway runs as root.

* :mod:`~clawstack.gateway.workspace_tools.toolset`: :func:`workspace_tools`, the four in one list.
* :mod:`~clawstack.gateway.workspace_tools.files`: ``read``, ``write`` and ``edit``.
* :mod:`~clawstack.gateway.workspace_tools.pages`: the page one ``read`` call shows.
* :mod:`~clawstack.gateway.workspace_tools.exec`: ``exec`` in the sandbox.
* :mod:`~clawstack.gateway.workspace_tools.workspace`: the limits, one invocation's workspace and its blind view,
  and the guard every tool runs in.
"""

from clawstack.gateway.workspace_tools.exec import EXEC_HOST_PATHS
from clawstack.gateway.workspace_tools.toolset import workspace_tools
from clawstack.gateway.workspace_tools.workspace import WORKSPACE_MARK, WorkspaceToolLimits, exec_limits

__all__ = [
    "EXEC_HOST_PATHS",
    "WORKSPACE_MARK",
    "WorkspaceToolLimits",
    "exec_limits",
    "workspace_tools",
]

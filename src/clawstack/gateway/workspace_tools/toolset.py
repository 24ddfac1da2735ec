"""The four workspace tools as one list, sharing one set of limits."""

from __future__ import annotations

from clawstack.gateway.tools import Tool
from clawstack.gateway.workspace_tools.exec import exec_tool
from clawstack.gateway.workspace_tools.files import file_tools
from clawstack.gateway.workspace_tools.workspace import WorkspaceToolLimits
from clawstack.sandbox import Sandbox

__all__ = ["workspace_tools"]


def workspace_tools(*, sandbox: Sandbox | None = None, limits: WorkspaceToolLimits | None = None) -> list[Tool]:
    """``read``, ``write``, ``edit`` and ``exec`` as gateway tools; ``exec`` runs in ``sandbox`` (by default a
    :class:`~clawstack.sandbox.Sandbox` finding ``bwrap`` on ``PATH``)."""
    sandbox = sandbox or Sandbox()
    limits = limits or WorkspaceToolLimits()
    return [*file_tools(limits), exec_tool(sandbox, limits)]

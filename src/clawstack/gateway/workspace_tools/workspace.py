"""What the workspace tools share: their limits, one invocation's workspace with its blind view of paths, the
guard every handler runs in, and the check for unknown arguments."""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from clawstack.gateway.config.agents import ExecToolConfig
from clawstack.gateway.tools import ToolError, ToolInvocation
from clawstack.sandbox import ConfinedDir, ConfinedPathError, ResourceLimits

__all__ = [
    "WORKSPACE_MARK",
    "Handler",
    "Workspace",
    "WorkspaceToolLimits",
    "exec_limits",
    "guarded",
    "refuse_unknown",
]

WORKSPACE_MARK: Final = "<workspace>"
"""What a blind invocation sees instead of the workspace's path."""
_MAX_PATH_BYTES: Final = 4096


@dataclass(frozen=True, slots=True)
class WorkspaceToolLimits:
    """The tools' bounds; the defaults are documented in the package docstring."""

    read_max_lines: int = 2000
    read_max_bytes: int = 50 * 1024
    read_max_file_bytes: int = 256 * 1024 * 1024
    write_max_bytes: int = 1024 * 1024
    exec_default_timeout_s: float = 30.0
    exec_max_timeout_s: float = 600.0
    exec_output_bytes: int = 64 * 1024
    exec_tmp_bytes: int = 64 * 1024 * 1024
    exec_pids: int = 256
    exec_memory_bytes: int = 1024**3
    exec_uid: int = 65534
    """The uid ``exec`` runs as when the gateway runs as root (never root itself)."""
    exec_rlimits: ResourceLimits = field(default_factory=lambda: ResourceLimits(file_bytes=1024**3, open_files=1024))

    def __post_init__(self) -> None:
        if self.exec_pids < 1 or self.exec_memory_bytes < 1 or not 0 < self.exec_uid < 2**32 - 1:
            raise ValueError("exec_pids and exec_memory_bytes must be positive, exec_uid a uid other than root")


def exec_limits(config: ExecToolConfig, base: WorkspaceToolLimits | None = None) -> WorkspaceToolLimits:
    """``base`` (by default the defaults) with ``tools.exec``'s bounds."""
    return dataclasses.replace(
        base or WorkspaceToolLimits(),
        exec_pids=config.pids_limit,
        exec_memory_bytes=config.memory_limit_mb * 1024**2,
        exec_uid=config.sandbox_uid,
    )


class Workspace:
    """The invocation's workspace: its confined root, and the blind view of paths."""

    def __init__(self, tool: str, invocation: ToolInvocation) -> None:
        if invocation.workspace is None:
            raise ToolError(
                f"{tool} needs a workspace, and this agent has none "
                "(agents.defaults.workspace, or the agent's own workspace)"
            )
        self.dir = ConfinedDir(invocation.workspace, label="workspace root")
        self.root = self.dir.root
        self.blind = invocation.blind
        names = {self.root, os.path.realpath(self.root)}
        self._hidden = sorted((name for name in names if len(name) > 1), key=len, reverse=True)

    def path(self, tool: str, arguments: Mapping[str, Any], key: str = "path") -> str:
        """The path argument ``key``, with a blind invocation's ``<workspace>`` prefix made real."""
        value = arguments.get(key)
        if not isinstance(value, str) or not value:
            raise ToolError(f"{tool}: {key} must be a non-empty string")
        if "\0" in value or len(value.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
            raise ToolError(f"{tool}: {key} must be free of NUL and at most {_MAX_PATH_BYTES} bytes")
        if self.blind and (value == WORKSPACE_MARK or value.startswith(WORKSPACE_MARK + "/")):
            value = self.root + value[len(WORKSPACE_MARK) :]
        return value

    def absolute(self, path: str) -> str:
        return os.path.normpath(path if path.startswith("/") else os.path.join(self.root, path))

    def show(self, text: str) -> str:
        """``text`` as the invocation may see it."""
        if self.blind:
            for name in self._hidden:
                text = text.replace(name, WORKSPACE_MARK)
        return text


Handler = Callable[[dict[str, Any], Workspace], Awaitable[str]]


def guarded(tool: str, handler: Handler) -> Callable[[dict[str, Any], ToolInvocation], Awaitable[str]]:
    """``handler`` as a tool handler: the workspace checked first, and everything it says shown blind."""

    async def run(arguments: dict[str, Any], invocation: ToolInvocation) -> str:
        workspace = Workspace(tool, invocation)
        try:
            return workspace.show(await handler(arguments, workspace))
        except ToolError as exc:
            raise ToolError(workspace.show(exc.message)) from None
        except ConfinedPathError as exc:
            raise ToolError(workspace.show(exc.message)) from None
        except OSError as exc:
            raise ToolError(f"{tool} failed ({errno.errorcode.get(exc.errno or 0, type(exc).__name__)})") from None

    return run


def refuse_unknown(tool: str, arguments: Mapping[str, Any], known: set[str]) -> None:
    """Refuse any argument outside ``known``, naming the ones the tool takes."""
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise ToolError(f"{tool}: unknown argument(s) {', '.join(unknown)} (it takes {', '.join(sorted(known))})")

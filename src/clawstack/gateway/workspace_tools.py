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
``exec`` waits 30 s by default and at most 600 s, and keeps the last 64 KiB of its output.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from clawstack.gateway.tools import Tool, ToolError, ToolInvocation
from clawstack.sandbox import (
    ConfinedDir,
    ConfinedPathError,
    ResourceLimits,
    Sandbox,
    SandboxError,
    SandboxSpec,
    bind,
    default_env,
    dev,
    proc,
    system_mounts,
    tmpfs,
)

__all__ = [
    "EXEC_HOST_PATHS",
    "WORKSPACE_MARK",
    "WorkspaceToolLimits",
    "workspace_tools",
]

WORKSPACE_MARK: Final = "<workspace>"
"""What a blind invocation sees instead of the workspace's path."""
EXEC_HOST_PATHS: Final = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/passwd", "/etc/group", "/etc/localtime")
"""Host paths ``exec`` binds read-only besides ``/usr`` and the top-level system directories (no other ``/etc``)."""
_RETENTION_NOTE: Final = "[earlier output was discarded at the retention cap and cannot be recovered]\n\n"
_TIMEOUT_GUIDANCE: Final = (
    "The command was terminated, but external side effects may already have completed. Verify the resulting state "
    "before retrying. Do not automatically rerun non-idempotent commands. Use a higher timeout only when the command "
    "is known to be safe to retry."
)
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_ARGUMENT_BYTES: Final = 128 * 1024 - 1  # one argv string: Linux's MAX_ARG_STRLEN, less the NUL
_MAX_ENV: Final = 100
_MAX_ENV_VALUE: Final = 4096
_MAX_PATH_BYTES: Final = 4096
_SCAN_CHUNK: Final = 1 << 20
_BOM: Final = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class WorkspaceToolLimits:
    """The tools' bounds; the defaults are documented in the module docstring."""

    read_max_lines: int = 2000
    read_max_bytes: int = 50 * 1024
    read_max_file_bytes: int = 256 * 1024 * 1024
    write_max_bytes: int = 1024 * 1024
    exec_default_timeout_s: float = 30.0
    exec_max_timeout_s: float = 600.0
    exec_output_bytes: int = 64 * 1024
    exec_tmp_bytes: int = 64 * 1024 * 1024
    exec_rlimits: ResourceLimits = field(
        default_factory=lambda: ResourceLimits(address_space_bytes=4 * 1024**3, file_bytes=1024**3, open_files=1024)
    )


def workspace_tools(*, sandbox: Sandbox | None = None, limits: WorkspaceToolLimits | None = None) -> list[Tool]:
    """``read``, ``write``, ``edit`` and ``exec`` as gateway tools; ``exec`` runs in ``sandbox`` (by default a
    :class:`~clawstack.sandbox.Sandbox` finding ``bwrap`` on ``PATH``)."""
    tools = _WorkspaceTools(sandbox or Sandbox(), limits or WorkspaceToolLimits())
    bounds = tools.limits
    read = _READ_DESCRIPTION.format(lines=bounds.read_max_lines, kb=bounds.read_max_bytes // 1024)
    exec_ = _EXEC_DESCRIPTION.format(
        kb=bounds.exec_output_bytes // 1024,
        default=_seconds(bounds.exec_default_timeout_s),
        most=_seconds(bounds.exec_max_timeout_s),
    )
    return [
        Tool("read", read, _READ_SCHEMA, tools.guarded("read", tools.read)),
        Tool("write", _WRITE_DESCRIPTION, _WRITE_SCHEMA, tools.guarded("write", tools.write)),
        Tool("edit", _EDIT_DESCRIPTION, _EDIT_SCHEMA, tools.guarded("edit", tools.edit)),
        Tool("exec", exec_, _EXEC_SCHEMA, tools.guarded("exec", tools.exec)),
    ]


# --- one invocation's workspace -----------------------------------------------------------------------------------


class _Workspace:
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


Handler = Callable[[dict[str, Any], _Workspace], Awaitable[str]]


class _WorkspaceTools:
    def __init__(self, sandbox: Sandbox, limits: WorkspaceToolLimits) -> None:
        self.sandbox = sandbox
        self.limits = limits
        self._mutations = asyncio.Lock()  # write and edit, one at a time: an edit reads then replaces

    def guarded(self, tool: str, handler: Handler) -> Callable[[dict[str, Any], ToolInvocation], Awaitable[str]]:
        """``handler`` as a tool handler: the workspace checked first, and everything it says shown blind."""

        async def run(arguments: dict[str, Any], invocation: ToolInvocation) -> str:
            workspace = _Workspace(tool, invocation)
            try:
                return workspace.show(await handler(arguments, workspace))
            except ToolError as exc:
                raise ToolError(workspace.show(exc.message)) from None
            except ConfinedPathError as exc:
                raise ToolError(workspace.show(exc.message)) from None
            except OSError as exc:
                raise ToolError(f"{tool} failed ({errno.errorcode.get(exc.errno or 0, type(exc).__name__)})") from None

        return run

    # -- read -------------------------------------------------------------------------------------------------

    async def read(self, arguments: dict[str, Any], workspace: _Workspace) -> str:
        _only("read", arguments, {"path", "offset", "limit", "cursor", "optional"})
        path = workspace.path("read", arguments)
        offset = _integer(arguments, "offset", 1, "Offset must be an integer at least 1")
        cursor = _integer(arguments, "cursor", 0, "Cursor must be an integer at least 0") or 0
        limit = arguments.get("limit")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit) or limit < 1:
                raise ToolError("read: limit must be a number of lines, at least 1")
            limit = int(limit)
        optional = arguments.get("optional")
        if optional is not None and optional is not True:
            raise ToolError("read: optional must be true when given")
        try:
            fd = await asyncio.to_thread(workspace.dir.open_file, path)
        except ConfinedPathError as exc:
            if exc.code in ("path_not_found", "not_a_directory"):
                if optional:
                    return f"Optional file not found: {path}."
                raise ToolError(f"File not found: {workspace.absolute(path)}.") from None
            if exc.code == "is_a_directory":
                raise ToolError(
                    f"Read requires a file path, but {path} is a directory. List the directory, then read a specific file."
                ) from None
            if exc.code == "not_a_regular_file":
                raise ToolError(f"Read only supports regular files; no read was attempted: {path}") from None
            raise
        try:
            return await asyncio.to_thread(_Page(self.limits, path, offset or 1, limit, cursor).read, fd)
        finally:
            os.close(fd)

    # -- write ------------------------------------------------------------------------------------------------

    async def write(self, arguments: dict[str, Any], workspace: _Workspace) -> str:
        _only("write", arguments, {"path", "content"})
        path = workspace.path("write", arguments)
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ToolError("write: content must be a string")
        data = _utf8("write", content, self.limits.write_max_bytes)
        async with self._mutations:
            if await asyncio.to_thread(_same_content, workspace.dir, path, data):
                return f"No changes made to {path}. The file already has identical content."
            await asyncio.to_thread(workspace.dir.replace_file, path, data)
        return f"Successfully wrote {len(data)} bytes to {path}"

    # -- edit -------------------------------------------------------------------------------------------------

    async def edit(self, arguments: dict[str, Any], workspace: _Workspace) -> str:
        _only("edit", arguments, {"path", "edits", "oldText", "newText"})
        path = workspace.path("edit", arguments)
        edits = _edits(arguments)
        async with self._mutations:
            try:
                raw = await asyncio.to_thread(_read_small, workspace.dir, path, self.limits.write_max_bytes)
            except ConfinedPathError as exc:
                code = _ERRNO_NAMES.get(exc.code)
                if code is None:
                    raise
                raise ToolError(f"Could not edit file: {path}. Error code: {code}.") from None
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ToolError(f"Could not edit file: {path}. It is not valid UTF-8 text.") from None
            result, message = _apply_edits(text, edits, path)
            if result is None:
                return message
            _utf8("edit", result, self.limits.write_max_bytes)
            await asyncio.to_thread(workspace.dir.replace_file, path, result.encode("utf-8"))
        return message

    # -- exec -------------------------------------------------------------------------------------------------

    async def exec(self, arguments: dict[str, Any], workspace: _Workspace) -> str:
        _only("exec", arguments, {*_EXEC_ACCEPTED, *_EXEC_REFUSED})
        for key, check in _EXEC_REFUSED.items():
            if key in arguments and (message := check(arguments[key])) is not None:
                raise ToolError(f"exec: {message}")
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("exec: command must be a non-empty string")
        if "\0" in command or len(command.encode("utf-8", "surrogatepass")) > _MAX_ARGUMENT_BYTES:
            raise ToolError(f"exec: command must be free of NUL and at most {_MAX_ARGUMENT_BYTES} bytes")
        title = arguments.get("title")
        if title is not None and (not isinstance(title, str) or len(title) > 120):
            raise ToolError("exec: title must be a string of at most 120 characters")
        timeout_s = self._timeout(arguments.get("timeoutSeconds"))
        env = default_env(workspace.root) | _env(arguments.get("env"))
        workdir = arguments.get("workdir", "")
        if not isinstance(workdir, str) or (workdir and not workdir.strip()):
            raise ToolError("exec: workdir must be a path (omit it or give an empty string for the workspace)")
        workdir = workspace.path("exec", arguments, "workdir") if workdir else "."
        parts = await asyncio.to_thread(workspace.dir.directory, workdir)  # the workspace itself must exist too
        cwd = os.path.join(workspace.root, *parts)
        spec = SandboxSpec(
            env=env,
            mounts=(
                *system_mounts(EXEC_HOST_PATHS),
                proc(),
                dev(),
                tmpfs("/tmp", self.limits.exec_tmp_bytes),  # noqa: S108 - the sandbox's own
                bind(workspace.root),
            ),
            chdir=cwd,
        )
        try:
            result = await self.sandbox.run(
                spec,
                ["/bin/sh", "-c", command],
                timeout_s=timeout_s,
                output_limit_bytes=self.limits.exec_output_bytes,
                limits=self.limits.exec_rlimits,
                stderr="merge",
                keep="tail",
            )
        except SandboxError as exc:
            raise ToolError(f"exec could not run the command ({exc.code}): {exc.message}") from None
        output = _decode_tail(result.stdout, result.stdout_truncated).strip()
        note = _RETENTION_NOTE if result.stdout_truncated else ""
        if result.timed_out:
            reason = f"Command timed out after {_seconds(timeout_s)} seconds.\n\n{_TIMEOUT_GUIDANCE}"
            raise ToolError(note + (f"{output}\n\n{reason}" if output else reason))
        code = result.exit_code
        if code in (126, 127):
            reason = "Command not found" if code == 127 else "Command not executable (permission denied)"
            raise ToolError(note + (f"{output}\n\n{reason}" if output else reason))
        shown = output or "(no output)"
        return note + (shown if code == 0 else f"{shown}\n\n(Command exited with code {code})")

    def _timeout(self, value: Any) -> float:
        if value is None:
            return self.limits.exec_default_timeout_s
        most = self.limits.exec_max_timeout_s
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ToolError("exec: timeoutSeconds must be a number of seconds")
        if value <= 0 or value > most:
            raise ToolError(
                f"exec: timeoutSeconds must be above 0 and at most {_seconds(most)} here "
                "(a command cannot run without a time limit)"
            )
        return float(value)


# --- argument checks ----------------------------------------------------------------------------------------------


def _only(tool: str, arguments: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise ToolError(f"{tool}: unknown argument(s) {', '.join(unknown)} (it takes {', '.join(sorted(known))})")


def _integer(arguments: Mapping[str, Any], key: str, minimum: int, message: str) -> int | None:
    value = arguments.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ToolError(message)
    return value


def _utf8(tool: str, text: str, limit: int) -> bytes:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError(f"{tool}: the content is not valid Unicode (it holds a lone surrogate)") from None
    if len(data) > limit:
        raise ToolError(f"{tool}: the content would be {len(data)} bytes; files here are at most {limit} bytes")
    return data


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > _MAX_ENV:
        raise ToolError(f"exec: env must be an object of at most {_MAX_ENV} string values")
    for key, item in value.items():
        if _ENV_NAME.fullmatch(key) is None or not isinstance(item, str) or "\0" in item or len(item) > _MAX_ENV_VALUE:
            raise ToolError(
                "exec: env names are [A-Za-z_][A-Za-z0-9_]* and values strings without NUL "
                f"of at most {_MAX_ENV_VALUE} characters"
            )
    return dict(value)


def _refuse_unless(allowed: tuple[object, ...], message: str) -> Callable[[Any], str | None]:
    """A check that passes only the values ``allowed`` (``False`` is not ``0``)."""

    def check(value: Any) -> str | None:
        return None if any(type(value) is type(item) and value == item for item in allowed) else message

    return check


_EXEC_ACCEPTED: Final = ("command", "workdir", "env", "timeoutSeconds", "title")
_EXEC_REFUSED: Final[dict[str, Callable[[Any], str | None]]] = {
    "yieldMs": lambda _: "yieldMs is not supported: commands run to completion here, with no process tool to poll",
    "background": _refuse_unless((False,), "background is not supported: commands run to completion here"),
    "pty": _refuse_unless((False,), "pty is not supported: commands run without a terminal"),
    "elevated": _refuse_unless((False,), "elevated is not supported: commands always run in the sandbox"),
    "host": _refuse_unless(("auto", "sandbox"), "host must be auto or sandbox: commands always run in the sandbox"),
    "ask": _refuse_unless(("off",), "ask is not supported: there are no exec approvals here"),
    "node": lambda _: "node is not supported: commands run in the gateway's sandbox, not on a node",
}


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# --- read ---------------------------------------------------------------------------------------------------------


def _format_size(size: int) -> str:
    """OpenClaw's compact size: ``512B``, ``50.0KB``, ``1.0MB``."""
    if size < 1024:
        return f"{size}B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f}KB"
    return f"{size / (1024 * 1024):.1f}MB"


class _Page:
    """One ``read`` call's page of a file: lines from ``offset`` (1-based), at most ``limit`` of them, starting
    ``cursor`` characters into the first, bounded by the limits, with OpenClaw's continuation notices."""

    def __init__(self, limits: WorkspaceToolLimits, path: str, offset: int, limit: int | None, cursor: int) -> None:
        self.limits, self.path, self.offset, self.limit, self.cursor = limits, path, offset, limit, cursor

    def read(self, fd: int) -> str:
        size = os.fstat(fd).st_size
        if size > self.limits.read_max_file_bytes:
            raise ToolError(
                f"{self.path} is {size} bytes; read takes files of at most {self.limits.read_max_file_bytes} bytes "
                "(use exec with head, tail or sed -n for parts of larger ones)"
            )
        bom = len(_BOM) if os.pread(fd, len(_BOM), 0) == _BOM else 0
        total, start = self._scan(fd, bom)
        if total == 0:
            return "File is empty (0 bytes)." if size == 0 else f"File contains no readable text ({size} bytes)."
        if self.offset > total:
            return f"Offset {self.offset} is beyond end of file ({total} lines total). Retry with offset <= {total}."
        assert start is not None
        budget = 4 * self.cursor + 2 * self.limits.read_max_bytes + 16
        raw = os.pread(fd, budget, start)
        if b"\0" in raw:
            raise ToolError(f"Read only supports text files; {self.path} looks binary (it holds NUL bytes).")
        whole = start + len(raw) >= size
        try:
            text, note = raw.decode("utf-8"), ""
        except UnicodeDecodeError as exc:
            if not whole and exc.start >= len(raw) - 3:  # a character cut by the page's end
                text, note = raw[: exc.start].decode("utf-8", "replace"), ""
            else:
                text = raw.decode("utf-8", "replace")
                note = f"[{self.path} is not valid UTF-8; invalid bytes are shown as \ufffd.]\n"
        return note + self._render(text.replace("\r\n", "\n"), total, whole)

    def _scan(self, fd: int, bom: int) -> tuple[int, int | None]:
        """The file's line count and the byte offset where line ``offset`` starts (``None``: past the end)."""
        wanted = self.offset - 1  # newlines before the first line shown
        newlines, position, start = 0, bom, bom if wanted == 0 else None
        last = b""
        while chunk := os.pread(fd, _SCAN_CHUNK, position):
            count = chunk.count(b"\n")
            if start is None and newlines + count >= wanted:
                index = -1
                for _ in range(wanted - newlines):
                    index = chunk.index(b"\n", index + 1)
                start = position + index + 1
            newlines += count
            position += len(chunk)
            last = chunk[-1:]
        total = newlines + (1 if position > bom and last != b"\n" else 0)
        return total, start

    def _render(self, text: str, total: int, whole: bool) -> str:
        first = self.offset - 1
        wanted = total - first if self.limit is None else min(self.limit, total - first)
        lines = text.split("\n")
        if whole and text.endswith("\n"):
            lines.pop()
        lines = lines[:wanted]
        end = first + wanted  # the last line selected, 1-based
        line_length = len(lines[0]) if lines else 0
        if self.cursor:
            if self.cursor >= line_length:
                more = f" Use offset={self.offset + 1} to continue." if self.offset < total else ""
                return f"Cursor {self.cursor} is at or beyond the end of line {self.offset} ({line_length} characters).{more}"
            lines[0] = lines[0][self.cursor :]
        content = "\n".join(lines) + ("\n" if whole and end == total and text.endswith("\n") else "")
        remaining = total - end
        notice = ""
        if self.limit is not None and remaining > 0:
            notice = (
                f"\n\n[{remaining} more line{'' if remaining == 1 else 's'} in file. Use offset={end + 1} to continue.]"
            )
        limit_bytes = self.limits.read_max_bytes
        if len(lines) <= self.limits.read_max_lines and _size(content) + _size(notice) <= limit_bytes:
            return self._blank(lines, content + notice, first == 0 and end == total, notice)
        reserved = max(
            _size(self._notice(("cursor", self.cursor + len(lines[0])), total)),
            _size(self._notice(("line", total + 1), total)),
        )
        room = max(0, limit_bytes - reserved)
        if _size(lines[0]) > room:
            shown = _utf8_prefix(lines[0], room)
            page = shown + self._notice(("cursor", self.cursor + len(shown)), total)
            return page
        kept: list[str] = []
        used = 0
        for line in lines[: self.limits.read_max_lines]:
            cost = _size(line) + (1 if kept else 0)
            if used + cost > room:
                break
            kept.append(line)
            used += cost
        notice = self._notice(("line", self.offset + len(kept)), total, end)
        return self._blank(kept, "\n".join(kept) + notice, False, notice)

    def _notice(self, continuation: tuple[str, int], total: int, end: int | None = None) -> str:
        kind, value = continuation
        size = _format_size(self.limits.read_max_bytes)
        if kind == "cursor":
            limit = "" if self.limit is None else f", limit={self.limit}"
            return (
                f"\n\n[Showing part of line {self.offset} ({size} limit). "
                f"Use read with offset={self.offset}, cursor={value}{limit} to continue.]"
            )
        limit = "" if self.limit is None or end is None else f", limit={max(1, end - value + 1)}"
        return f"\n\n[Showing lines {self.offset}-{value - 1} of {total} ({size} limit). Use offset={value}{limit} to continue.]"

    def _blank(self, lines: list[str], page: str, whole_file: bool, notice: str) -> str:
        """OpenClaw's answer for a page of blank lines only."""
        if any(lines):
            return page
        count = len(lines)
        what = "File" if whole_file else "Selected range"
        return f"{what} contains {count} blank line{'' if count == 1 else 's'}.{notice}"


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _utf8_prefix(text: str, limit: int) -> str:
    """The longest prefix of ``text`` of at most ``limit`` UTF-8 bytes."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


# --- write and edit -----------------------------------------------------------------------------------------------

_ERRNO_NAMES: Final = {
    "path_not_found": "ENOENT",
    "not_a_directory": "ENOTDIR",
    "is_a_directory": "EISDIR",
    "permission_denied": "EACCES",
    "symlink_loop": "ELOOP",
}


def _same_content(directory: ConfinedDir, path: str, data: bytes) -> bool:
    """Whether the regular file at ``path`` (not followed if a symlink) already holds exactly ``data``."""
    try:
        fd = directory.open_file(path, follow=False)
    except ConfinedPathError:
        return False  # missing, or something replace_file refuses with its own message
    try:
        if os.fstat(fd).st_size != len(data):
            return False
        return os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)


def _read_small(directory: ConfinedDir, path: str, limit: int) -> bytes:
    fd = directory.open_file(path, follow=False)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise ToolError(
                f"Could not edit file: {path}. It is {size} bytes; edit takes files of at most {limit} bytes."
            )
        return os.pread(fd, limit + 1, 0)
    finally:
        os.close(fd)


def _edits(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The replacements, as OpenClaw takes them: ``edits[]``, plus a top-level ``oldText``/``newText`` pair."""
    raw = arguments.get("edits", [])
    if not isinstance(raw, list):
        raise ToolError("edit: edits must be an array of {oldText, newText} objects")
    edits: list[tuple[str, str]] = []
    for index, item in enumerate(raw):
        if (
            not isinstance(item, dict)
            or set(item) != {"oldText", "newText"}
            or not isinstance(item["oldText"], str)
            or not isinstance(item["newText"], str)
        ):
            raise ToolError(f"edit: edits[{index}] must be an object with the strings oldText and newText")
        edits.append((item["oldText"], item["newText"]))
    old, new = arguments.get("oldText"), arguments.get("newText")
    if old is not None or new is not None:
        if not isinstance(old, str) or not isinstance(new, str):
            raise ToolError("edit: oldText and newText go together, as strings")
        if (old, new) not in edits:
            edits.append((old, new))
    if not edits:
        raise ToolError("Edit tool input is invalid. edits must contain at least one replacement.")
    return edits


def _apply_edits(text: str, edits: list[tuple[str, str]], path: str) -> tuple[str | None, str]:
    """``(new text, result message)``, or ``(None, message)`` when nothing changes; each ``oldText`` must occur
    exactly once in the original, and the replaced spans must not overlap."""
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    body = text[len(bom) :]
    crlf = "\r\n" in body and body.count("\r\n") == body.count("\n")
    if crlf:
        body = body.replace("\r\n", "\n")
    many = len(edits) > 1
    spans: list[tuple[int, int, str, int]] = []
    changed = 0
    for index, (old, new) in enumerate(edits):
        old, new = old.replace("\r\n", "\n"), new.replace("\r\n", "\n")
        if not old:
            raise ToolError(
                f"edits[{index}].oldText must not be empty in {path}."
                if many
                else f"oldText must not be empty in {path}."
            )
        count = body.count(old)
        if count > 1:
            if many:
                raise ToolError(
                    f"Found {count} occurrences of edits[{index}] in {path}. Each oldText must be unique. "
                    "Please provide more context to make it unique."
                )
            raise ToolError(
                f"Found {count} occurrences of the text in {path}. The text must be unique. "
                "Please provide more context to make it unique."
            )
        if count == 0:
            prefix = f"Could not find edits[{index}]" if many else "Could not find the exact text"
            snippet = body if len(body) <= 800 else body[:800] + "\n... (truncated)"
            raise ToolError(
                f"{prefix} in {path}. The old text must match exactly including all whitespace and newlines.\n"
                f"Current file contents:\n{snippet}"
            )
        spans.append((body.index(old), len(old), new, index))
        changed += old != new
    spans.sort()
    for (start, length, _, first), (following, _, _, second) in itertools.pairwise(spans):
        if start + length > following:
            raise ToolError(
                f"edits[{first}] and edits[{second}] overlap in {path}. Merge them into one edit or target disjoint regions."
            )
    if not changed:
        return None, f"No changes made to {path}. The replacement text is identical to the original."
    result = body
    for start, length, new, _ in reversed(spans):
        result = result[:start] + new + result[start + length :]
    if result == body:
        return None, f"No changes made to {path}. The replacement produced identical content."
    if crlf:
        result = result.replace("\n", "\r\n")
    return bom + result, f"Successfully replaced {changed} block(s) in {path}."


# --- exec ---------------------------------------------------------------------------------------------------------


def _decode_tail(data: bytes, truncated: bool) -> str:
    """The output as text; a tail cut inside a character starts at the next whole one."""
    if truncated:
        skip = 0
        while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", "replace")


# --- descriptions and schemas -------------------------------------------------------------------------------------

_READ_DESCRIPTION: Final = (
    "Read a text file in the workspace. Text caps {lines} lines or {kb}KB. Continue with offset/limit, or cursor "
    "within a long line."
)
_WRITE_DESCRIPTION: Final = "Write/overwrite a file in the workspace; creates parent directories."
_EDIT_DESCRIPTION: Final = (
    "Exact single-file replacements in the workspace. oldText unique/non-overlapping against original. Merge nearby "
    "changes; omit large unchanged spans."
)
_EXEC_DESCRIPTION: Final = (
    "Run a shell command (/bin/sh -c) in the workspace, in a sandbox: no network, a read-only system, the workspace "
    "the only writable place besides /tmp. Returns stdout+stderr (the last {kb}KB). Timeout {default}s by default, "
    "at most {most}s."
)
_PATH: Final = {"type": "string", "description": "File path; relative/absolute."}
_READ_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "path": _PATH,
        "offset": {"type": "integer", "minimum": 1, "description": "Start line; 1-based."},
        "limit": {"type": "number", "description": "Max lines."},
        "cursor": {
            "type": "integer",
            "minimum": 0,
            "description": "Character position within the start line; 0-based.",
        },
        "optional": {
            "type": "boolean",
            "const": True,
            "description": "Missing paths return not_found instead of failing.",
        },
    },
    "required": ["path"],
}
_WRITE_SCHEMA: Final = {
    "type": "object",
    "properties": {"path": _PATH, "content": {"type": "string", "description": "File content."}},
    "required": ["path", "content"],
}
_EDIT_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "path": _PATH,
        "edits": {
            "type": "array",
            "description": "Targeted replacements against original file; no overlap/nesting. Merge nearby changes.",
            "items": {
                "type": "object",
                "properties": {
                    "oldText": {
                        "type": "string",
                        "description": "Exact original text; unique and non-overlapping in this call.",
                    },
                    "newText": {"type": "string", "description": "Replacement text."},
                },
                "required": ["oldText", "newText"],
            },
        },
    },
    "required": ["path", "edits"],
}
_EXEC_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "title": {
            "type": "string",
            "maxLength": 120,
            "description": "Every call: short purpose; never claim success. No secrets.",
        },
        "command": {"type": "string", "description": "Shell command."},
        "workdir": {"type": "string", "description": "Omit/empty string: the workspace; whitespace-only invalid."},
        "env": {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "Literal overrides; no expansion. Omit to inherit.",
        },
        "timeoutSeconds": {"type": "number", "description": "Process lifetime in seconds."},
    },
    "required": ["command"],
}

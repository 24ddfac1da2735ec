"""The file tools ``read``, ``write`` and ``edit``, with OpenClaw's arguments and result texts. Paths resolve
inside the workspace; ``write`` and ``edit`` never follow a symlink, and run one at a time."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
from collections.abc import Mapping
from typing import Any, Final

from clawstack.gateway.tools import Tool, ToolError
from clawstack.gateway.workspace_tools.pages import Page
from clawstack.gateway.workspace_tools.workspace import Workspace, WorkspaceToolLimits, guarded, refuse_unknown
from clawstack.sandbox import ConfinedDir, ConfinedPathError

__all__ = ["file_tools"]


def file_tools(limits: WorkspaceToolLimits) -> list[Tool]:
    """``read``, ``write`` and ``edit`` as gateway tools; the ``write`` and ``edit`` calls made through one list
    run one at a time."""
    tools = _FileTools(limits)
    read = _READ_DESCRIPTION.format(lines=limits.read_max_lines, kb=limits.read_max_bytes // 1024)
    return [
        Tool("read", read, _READ_SCHEMA, guarded("read", tools.read)),
        Tool("write", _WRITE_DESCRIPTION, _WRITE_SCHEMA, guarded("write", tools.write)),
        Tool("edit", _EDIT_DESCRIPTION, _EDIT_SCHEMA, guarded("edit", tools.edit)),
    ]


class _FileTools:
    def __init__(self, limits: WorkspaceToolLimits) -> None:
        self.limits = limits
        self._mutations = asyncio.Lock()  # write and edit, one at a time: an edit reads then replaces

    # -- read -------------------------------------------------------------------------------------------------

    async def read(self, arguments: dict[str, Any], workspace: Workspace) -> str:
        refuse_unknown("read", arguments, {"path", "offset", "limit", "cursor", "optional"})
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
            return await asyncio.to_thread(Page(self.limits, path, offset or 1, limit, cursor).read, fd)
        finally:
            os.close(fd)

    # -- write ------------------------------------------------------------------------------------------------

    async def write(self, arguments: dict[str, Any], workspace: Workspace) -> str:
        refuse_unknown("write", arguments, {"path", "content"})
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

    async def edit(self, arguments: dict[str, Any], workspace: Workspace) -> str:
        refuse_unknown("edit", arguments, {"path", "edits", "oldText", "newText"})
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


# --- argument checks ----------------------------------------------------------------------------------------------


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

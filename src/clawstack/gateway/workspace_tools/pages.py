"""One ``read`` call's page of a text file, with OpenClaw's continuation notices and answers for empty, blank,
binary and non-UTF-8 files. All of it is blocking: call it from a thread."""

from __future__ import annotations

import os
from typing import Final

from clawstack.gateway.tools import ToolError
from clawstack.gateway.workspace_tools.workspace import WorkspaceToolLimits

__all__ = ["Page"]

_SCAN_CHUNK: Final = 1 << 20
_BOM: Final = b"\xef\xbb\xbf"


def _format_size(size: int) -> str:
    """OpenClaw's compact size: ``512B``, ``50.0KB``, ``1.0MB``."""
    if size < 1024:
        return f"{size}B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f}KB"
    return f"{size / (1024 * 1024):.1f}MB"


class Page:
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

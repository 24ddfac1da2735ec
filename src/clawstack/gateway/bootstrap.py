"""An agent's workspace bootstrap files: the workspace prepared, and its files rendered into the system prompt.

OpenClaw puts a few user-editable files of the agent's workspace into every run's system prompt, in this order
(:data:`BOOTSTRAP_FILES`): ``AGENTS.md`` (operating instructions), ``SOUL.md`` (persona), ``IDENTITY.md``,
``USER.md`` (the people the agent works for), ``BOOTSTRAP.md`` (a first-run note) and ``MEMORY.md``. A subagent
run gets ``AGENTS.md`` only (:data:`SUBAGENT_BOOTSTRAP_FILES`). ``TOOLS.md`` is not one of them: OpenClaw 2026.9
retired it into a ``## Tools`` section of ``AGENTS.md``.

:func:`bootstrap_context` reads them and renders the prompt section::

    # Project Context
    The agent's workspace files follow; the user can edit them.
    ## /srv/ws/AGENTS.md
    <contents>
    ## /srv/ws/SOUL.md
    …

Rules, each OpenClaw's:

* A file whose contents are empty or only whitespace is left out; trailing whitespace is dropped.
* A missing ``AGENTS.md``, ``SOUL.md`` or ``IDENTITY.md`` is shown as ``[MISSING] Expected at: <path>``; the other
  files are simply left out when missing.
* A file longer than ``max_chars`` (``bootstrapMaxChars``, default 20,000; ``USER.md`` at most 4,000) is cut: its
  head (three quarters of what fits) and its tail (one quarter) around the marker lines
  ``[...truncated, read NAME for full content...]`` and ``…(truncated NAME: kept H+T chars of N)…``. All files
  together get at most ``total_max_chars`` (``bootstrapTotalMaxChars``, default 60,000): a file that does not fit
  what is left is cut the same way, and once less than 64 characters are left no further file is added. When
  anything was cut, the section starts with a notice saying so.
* Only regular files directly in the workspace are read: a symlink, a hard link (a second name of a file that
  may live outside the workspace), a directory or a device is shown as ``[UNREADABLE: <reason>]``. Bytes that are
  not UTF-8 become U+FFFD. A file over 1 MiB is not read whole, only the head and tail bytes that can be shown.
* With ``blind=True`` the workspace's absolute path is printed as ``<workspace>`` everywhere, headings and file
  contents included, so a blind child never learns where it runs.

Lengths count characters (code points). :func:`prepare_workspace` creates the workspace (mode 0700) and, as
OpenClaw does, seeds the missing ``AGENTS.md``, ``SOUL.md``, ``IDENTITY.md`` and ``USER.md`` with short templates
(never overwriting; ``skipBootstrap`` and ``skipOptionalBootstrapFiles`` turn this off). It does not seed
``BOOTSTRAP.md`` (clawstack has no first-run ritual) nor run ``git init``.

Errors::

    GatewayError                 (clawstack.gateway.errors)
     └── WorkspaceError          code "workspace_unavailable"   the workspace cannot be created or opened
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from clawstack.gateway.config import DEFAULT_BOOTSTRAP_MAX_CHARS, DEFAULT_BOOTSTRAP_TOTAL_MAX_CHARS
from clawstack.gateway.errors import GatewayError

__all__ = [
    "BLIND_WORKSPACE",
    "BOOTSTRAP_FILES",
    "SEEDED_FILES",
    "SUBAGENT_BOOTSTRAP_FILES",
    "USER_FILE_MAX_CHARS",
    "BootstrapContext",
    "BootstrapFile",
    "WorkspaceError",
    "bootstrap_context",
    "prepare_workspace",
]

BOOTSTRAP_FILES: Final = ("AGENTS.md", "SOUL.md", "IDENTITY.md", "USER.md", "BOOTSTRAP.md", "MEMORY.md")
SUBAGENT_BOOTSTRAP_FILES: Final = ("AGENTS.md",)
#: Files shown as ``[MISSING]`` when absent; the others are left out.
_MARKED_WHEN_MISSING: Final = frozenset({"AGENTS.md", "SOUL.md", "IDENTITY.md"})
#: ``USER.md`` has its own cap; ``max_chars`` can lower it, never raise it.
USER_FILE_MAX_CHARS: Final = 4_000
#: What a blind child sees instead of the workspace's absolute path.
BLIND_WORKSPACE: Final = "<workspace>"
_MIN_FILE_BUDGET: Final = 64
_MIN_KEPT_CHARS: Final = 16
_WHOLE_FILE_BYTES: Final = 1 << 20

_SEED_TEMPLATES: Final = {
    "AGENTS.md": (
        "# AGENTS.md\n\nOperating instructions for this agent: its rules, priorities and way of working. The gateway"
        " puts this file into the agent's prompt at the start of every run; edit it to change how the agent works.\n"
    ),
    "SOUL.md": "# SOUL.md\n\nPersona and tone: how this agent speaks, and what it will not do.\n",
    "IDENTITY.md": "# IDENTITY.md\n\nThe agent's name and how it presents itself.\n",
    "USER.md": "# USER.md\n\nWhat this agent should know about the people it works for: preferences, style, context.\n",
}
#: The files :func:`prepare_workspace` creates when they are missing.
SEEDED_FILES: Final = tuple(_SEED_TEMPLATES)


class WorkspaceError(GatewayError):
    """The workspace directory cannot be created or opened (not a directory, permission denied, …)."""

    code = "workspace_unavailable"


FileState = Literal["injected", "truncated", "empty", "missing", "unreadable"]


@dataclass(frozen=True, slots=True)
class BootstrapFile:
    """What became of one bootstrap file: ``chars`` is its length (``None`` when unknown or absent),
    ``injected_chars`` what the prompt carries for it (a marker counts)."""

    name: str
    state: FileState
    chars: int | None
    injected_chars: int


@dataclass(frozen=True, slots=True)
class BootstrapContext:
    """The rendered section (``""`` when no file has anything to show) and, per file, what was done."""

    text: str
    files: tuple[BootstrapFile, ...]

    @property
    def truncated(self) -> bool:
        """Whether some file was cut to fit."""
        return any(f.state == "truncated" for f in self.files)


def prepare_workspace(workspace: Path, *, seed: bool = True, skip_optional: Collection[str] = ()) -> Path:
    """Create ``workspace`` if missing (each created directory mode 0700) and seed its missing bootstrap files.

    Seeding writes each of :data:`SEEDED_FILES` that does not exist (mode 0600, never following a symlink, never
    replacing a file), except those in ``skip_optional`` (``skipOptionalBootstrapFiles``); ``seed=False``
    (``skipBootstrap``) writes nothing. An existing directory keeps its mode. Returns ``workspace``.
    """
    _make_dirs(workspace)
    if not seed:
        return workspace
    dir_fd = _open_dir(workspace)
    try:
        for name, template in _SEED_TEMPLATES.items():
            if name in skip_optional:
                continue
            try:
                fd = os.open(
                    name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd
                )
            except FileExistsError:
                continue  # the user's file (or a symlink, which is never followed) stays as it is
            except OSError as exc:
                raise WorkspaceError(f"cannot create {name} in {workspace}: {exc.strerror or exc}") from exc
            try:
                os.write(fd, template.encode())
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return workspace


def _make_dirs(workspace: Path) -> None:
    missing: list[Path] = []
    path = workspace
    while not path.exists() and not path.is_symlink() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass  # created meanwhile by another run of the same agent
        except OSError as exc:
            raise WorkspaceError(f"cannot create the workspace {directory}: {exc.strerror or exc}") from exc
    if not workspace.is_dir():
        raise WorkspaceError(f"the workspace {workspace} is not a directory")


def _open_dir(workspace: Path) -> int:
    try:
        return os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkspaceError(f"cannot open the workspace {workspace}: {exc.strerror or exc}") from exc


def bootstrap_context(
    workspace: Path,
    *,
    blind: bool = False,
    max_chars: int = DEFAULT_BOOTSTRAP_MAX_CHARS,
    total_max_chars: int = DEFAULT_BOOTSTRAP_TOTAL_MAX_CHARS,
    files: Sequence[str] = BOOTSTRAP_FILES,
) -> BootstrapContext:
    """Read the bootstrap ``files`` of ``workspace`` and render them as the prompt section (module docstring).

    ``max_chars`` and ``total_max_chars`` are the agent's ``bootstrapMaxChars`` and ``bootstrapTotalMaxChars``;
    ``files`` is :data:`BOOTSTRAP_FILES` for a full prompt and :data:`SUBAGENT_BOOTSTRAP_FILES` for a subagent's.
    A workspace that does not exist yields nothing to show; one that cannot be opened raises
    :class:`WorkspaceError`.
    """
    if max_chars < 1 or total_max_chars < 1:
        raise ValueError("max_chars and total_max_chars must be at least 1")
    if not workspace.exists():
        return BootstrapContext("", ())
    shown = BLIND_WORKSPACE if blind else str(workspace)
    dir_fd = _open_dir(workspace)
    remaining = total_max_chars
    sections: list[str] = []
    report: list[BootstrapFile] = []
    try:
        for name in files:
            if remaining <= 0:
                break
            heading_path = f"{shown}/{name}"
            read = _read(dir_fd, name, max_chars)
            if read.state == "missing":
                if name not in _MARKED_WHEN_MISSING:
                    report.append(BootstrapFile(name, "missing", None, 0))
                    continue
                body = _clamp(f"[MISSING] Expected at: {heading_path}", remaining)
                state: FileState = "missing"
            elif read.state == "unreadable":
                body = _clamp(f"[UNREADABLE: {read.text}]", remaining)
                state = "unreadable"
            else:
                if remaining < _MIN_FILE_BUDGET:
                    break
                text = _hide(read.text, workspace) if blind else read.text
                if not text.strip():
                    report.append(BootstrapFile(name, "empty", read.chars, 0))
                    continue
                cap = min(max_chars, USER_FILE_MAX_CHARS) if name == "USER.md" else max_chars
                body, cut = _cut(text, name, min(cap, remaining), read.chars, read.partial_bytes)
                state = "truncated" if cut or read.partial_bytes is not None else "injected"
            if not body:
                break
            remaining -= len(body)
            sections.append(f"## {heading_path}\n{body}")
            report.append(BootstrapFile(name, state, read.chars, len(body)))
    finally:
        os.close(dir_fd)
    if not sections:
        return BootstrapContext("", tuple(report))
    head = ["# Project Context", "The agent's workspace files follow; the user can edit them."]
    if any(f.state == "truncated" for f in report):
        head = [
            "## Bootstrap Context Notice",
            "Some workspace files below were cut to fit the prompt: read the files themselves when details seem to"
            " be missing.",
            *head,
        ]
    return BootstrapContext("\n".join([*head, *sections]), tuple(report))


@dataclass(frozen=True, slots=True)
class _Read:
    state: Literal["read", "missing", "unreadable"]
    text: str = ""  # the contents, or why the file is unreadable
    chars: int | None = None
    partial_bytes: int | None = None  # the file's size when only its head and tail were read


def _read(dir_fd: int, name: str, max_chars: int) -> _Read:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return _Read("missing")
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return _Read("unreadable", "a symlink is not read")
        return _Read("unreadable", exc.strerror or type(exc).__name__)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return _Read("unreadable", "not a regular file")
        if st.st_nlink > 1:
            return _Read("unreadable", "a hard-linked file is not read")
        # A file up to 1 MiB is read whole. A bigger one is read at its ends only: enough bytes for max_chars
        # characters (at most 4 bytes each) at either end.
        window = 4 * max_chars + 4
        whole = max(_WHOLE_FILE_BYTES, 2 * window)
        if st.st_size <= whole:
            data = _read_all(fd, whole)
            if len(data) <= whole:
                text = data.decode("utf-8", errors="replace")
                return _Read("read", text.rstrip(), len(text.rstrip()))
        head = os.pread(fd, window, 0)
        tail = os.pread(fd, window, max(st.st_size - window, 0))
        while tail and tail[0] & 0xC0 == 0x80:  # start the tail on a character boundary
            tail = tail[1:]
        text = head.decode("utf-8", errors="replace") + "\n" + tail.decode("utf-8", errors="replace").rstrip()
        return _Read("read", text, None, st.st_size)
    except OSError as exc:
        return _Read("unreadable", exc.strerror or type(exc).__name__)
    finally:
        os.close(fd)


def _read_all(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit + 1
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _hide(text: str, workspace: Path) -> str:
    for form in sorted({str(workspace), os.path.realpath(workspace)}, key=len, reverse=True):
        text = text.replace(form, BLIND_WORKSPACE)
    return text


def _clamp(text: str, budget: int) -> str:
    if len(text) <= budget:
        return text
    return text[: budget - 1] + "…" if budget > 3 else text[:budget]


def _cut(text: str, name: str, cap: int, chars: int | None, size: int | None) -> tuple[str, bool]:
    """``text`` within ``cap`` characters: whole, or head and tail around the marker lines; whether it was cut."""
    if size is None and len(text) <= cap:
        return text, False
    total = f"{chars}" if chars is not None else f"a {size}-byte file"

    def marker(h: int, t: int) -> str:
        return f"[...truncated, read {name} for full content...]\n…(truncated {name}: kept {h}+{t} chars of {total})…"

    widest = marker(cap, cap)
    budget = cap - len(widest) - 2  # the two newlines around the marker
    if budget < _MIN_KEPT_CHARS:
        compact = f"[…truncated {name}]"
        return (text[: max(cap - len(compact), 0)] + compact)[:cap], True
    h = budget * 3 // 4
    t = budget // 4
    tail = text[-t:] if t else ""
    return f"{text[:h]}\n{marker(h, t)}\n{tail}".rstrip("\n"), True

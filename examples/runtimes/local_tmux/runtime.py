"""An example agent-session runtime, ``local-tmux``: sessions are tmux sessions on this host, each with a transcript.

A host that runs its agents in tmux sessions, each writing ``<root>/<session_id>/transcript.jsonl`` (one JSON
object per line, ``{"ts": …, "role": …, "text": …}``), loads this module with
``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES=examples/runtimes/local_tmux/runtime.py`` and sets
``LOCAL_TMUX_RUNTIME_ROOT``. ClawConnect then calls:

- ``inspect``: tmux liveness (``has-session`` and the pane's ``#{pane_dead}``) plus the transcript. ``running``
  while the pane is alive; ``completed`` with the last assistant entry as ``finalResponse`` only after the pane has
  ended and only if that entry is datable; ``dead`` when the pane ended without one. Entries that cannot be dated
  are skipped.
- ``detach``: kills the tmux session (ClawConnect calls it only for an explicit detach with ``stopRuntime: true``).

A session is this runtime's only if its directory ``<root>/<session_id>/`` exists as a real directory (a symbolic
link there is not followed and does not count). For any other id both callbacks answer ``None`` (no such session)
before tmux is run at all: a tmux session on this host that the host did not give a directory under the root is
never read or killed, whatever a caller names.

There is no ``continue``: this runtime cannot deliver a follow-up turn, so the seam answers
``unsupported_operation``. See README.md beside this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import stat
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

RUNTIME_ID: Final = "local-tmux"
DEFAULT_PROVIDER: Final = "local-agent"
ROOT_ENV: Final = "LOCAL_TMUX_RUNTIME_ROOT"
PROVIDER_ENV: Final = "LOCAL_TMUX_RUNTIME_PROVIDER"
TRANSCRIPT: Final = "transcript.jsonl"
MAX_TRANSCRIPT_TAIL_BYTES: Final = 4 * 1024 * 1024
"""Only the end of a transcript is read: the answer is its last assistant entry."""

# tmux turns ``.`` and ``:`` in session names into ``_``, and ``-t`` parses them as window and pane separators, so a
# session id is a plain segment without them; a leading ``-`` could read as an option.
SESSION_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
# What tmux says on stderr when there is no such session (or no server at all, hence no session).
_ABSENT: Final = ("can't find session", "session not found", "no server running", "No such file or directory")
# Epoch numbers below this are seconds, above it milliseconds (10^11 ms is March 1973).
_MS_THRESHOLD: Final = 10**11
_log = logging.getLogger(__name__)


class LocalTmuxError(Exception):
    """A call could not be answered. ``code`` is stable: ``invalid_session_id``, ``tmux_unavailable``,
    ``tmux_failed``, ``aborted``, and ``not_configured`` at registration. ClawConnect reports any of them as the operation's ``<op>_failed``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Ref(Protocol):
    @property
    def session_id(self) -> str: ...


class _Options(Protocol):
    @property
    def signal(self) -> asyncio.Event: ...


class _DetachRequest(Protocol):
    @property
    def stop_runtime(self) -> bool: ...


class _Registry(Protocol):
    def register(
        self, id: str, /, *, provider: str, inspect: Any, continue_: Any = None, detach: Any = None
    ) -> Any: ...


@dataclass(frozen=True)
class Entry:
    """One datable transcript line."""

    at_ms: int
    role: str
    text: str


@dataclass(frozen=True)
class Transcript:
    """The datable entries of a session's transcript; ``present`` is false when the session has no transcript file."""

    entries: tuple[Entry, ...]
    skipped: int
    present: bool = True


_T = TypeVar("_T")


async def _until_aborted(awaitable: Awaitable[_T], signal: asyncio.Event) -> _T:
    """``awaitable``'s result, or :class:`LocalTmuxError` ``aborted`` as soon as ``signal`` is set."""
    work = asyncio.ensure_future(awaitable)
    aborted = asyncio.ensure_future(signal.wait())
    try:
        await asyncio.wait((work, aborted), return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
    if not work.done():
        work.cancel()
        # Best-effort: let the cancelled call clean up (it kills its child process) before we report.
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        raise LocalTmuxError("aborted", "the call was aborted by its caller or deadline")
    return work.result()


def check_session_id(session_id: str) -> str:
    """``session_id`` if it is a plain segment usable as a tmux session name and a directory name."""
    if not isinstance(session_id, str) or not SESSION_ID.fullmatch(session_id):
        raise LocalTmuxError(
            "invalid_session_id",
            "a local-tmux session id is 1 to 128 of A-Z a-z 0-9 _ - and starts with a letter or digit",
        )
    return session_id


def parse_timestamp(value: object) -> int | None:
    """Epoch milliseconds from an epoch number (seconds or milliseconds) or an ISO 8601 string with a zone."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            return None
        return int(value if value >= _MS_THRESHOLD else value * 1000)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return None
        if parsed.tzinfo is None:  # a local time of an unknown zone cannot be ordered against anything
            return None
        return int(parsed.timestamp() * 1000)
    return None


def parse_transcript(data: bytes, *, truncated: bool) -> Transcript:
    """The datable entries of a JSON-lines transcript, in file order; every other line counts as skipped."""
    lines = data.split(b"\n")
    if truncated:
        lines = lines[1:]  # the first line of a tail read is partial
    entries: list[Entry] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        at_ms = parse_timestamp(item.get("ts")) if isinstance(item, dict) else None
        if at_ms is None or not isinstance(item.get("role"), str) or not isinstance(item.get("text"), str):
            skipped += 1
            continue
        entries.append(Entry(at_ms, item["role"], item["text"]))
    return Transcript(tuple(entries), skipped)


def _is_segment(name: str) -> bool:
    """Whether ``name`` names an entry directly inside a directory (never its parent, never a path)."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _open_directory(root: Path, name: str) -> int | None:
    """A descriptor of the real directory ``root/name`` (a symbolic link there is not followed), else ``None``."""
    if not _is_segment(name):
        return None
    try:
        return os.open(root / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None


def _read_tail(directory: int, name: str) -> tuple[bytes, bool] | None:
    """The last bytes of the file ``name`` in ``directory`` and whether the file was longer; ``None`` if there is no
    such regular file (a symbolic link is not followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=directory)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        truncated = info.st_size > MAX_TRANSCRIPT_TAIL_BYTES
        if truncated:
            handle.seek(info.st_size - MAX_TRANSCRIPT_TAIL_BYTES)
        return handle.read(MAX_TRANSCRIPT_TAIL_BYTES), truncated


class LocalTmuxRuntime:
    """The callbacks of one ``local-tmux`` runtime: tmux sessions on this host, each with a directory under ``root``
    (the operator's); an id without one is not this runtime's."""

    def __init__(self, root: Path, *, tmux: str = "tmux") -> None:
        self.root = root
        self.tmux = tmux

    async def _tmux(self, *args: str) -> tuple[int, str, str]:
        try:
            process = await asyncio.create_subprocess_exec(
                self.tmux,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise LocalTmuxError("tmux_unavailable", f"cannot run {self.tmux}: {exc.strerror or exc}") from exc
        try:
            out, err = await process.communicate()
        finally:
            if process.returncode is None:  # cancelled while tmux ran: do not leave it behind
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                # Best-effort reap of the killed child; the caller is already being cancelled.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.shield(process.wait())
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace").strip(), err.decode(errors="replace").strip()

    async def has_session(self, session_id: str) -> bool:
        code, _, err = await self._tmux("has-session", "-t", f"={session_id}")  # "=": exact name, not a prefix
        if code == 0:
            return True
        if any(marker in err for marker in _ABSENT):
            return False
        raise LocalTmuxError("tmux_failed", f"tmux has-session failed: {err[:200] or f'exit {code}'}")

    async def pane_state(self, session_id: str) -> str:
        """``alive``, ``dead`` (the session is kept but its pane's process exited) or ``gone`` (no such session)."""
        if not await self.has_session(session_id):
            return "gone"
        code, out, err = await self._tmux("display-message", "-p", "-t", f"={session_id}:", "#{pane_dead}")
        if code == 0 and out in ("0", "1"):
            return "alive" if out == "0" else "dead"
        if not await self.has_session(session_id):  # it went away between the two calls
            return "gone"
        raise LocalTmuxError("tmux_failed", f"tmux cannot tell whether the pane is alive: {(err or out)[:200]!r}")

    def owns(self, session_id: str) -> bool:
        """Whether ``session_id`` is this runtime's: ``<root>/<session_id>/`` is a real directory, not a link."""
        directory = _open_directory(self.root, session_id)
        if directory is None:
            return False
        os.close(directory)
        return True

    def read_transcript(self, session_id: str) -> Transcript | None:
        """The session's transcript; ``None`` if the session is not this runtime's, empty if the file is missing."""
        directory = _open_directory(self.root, session_id)
        if directory is None:
            return None
        try:
            tail = _read_tail(directory, TRANSCRIPT)
        finally:
            os.close(directory)
        return Transcript((), 0, present=False) if tail is None else parse_transcript(tail[0], truncated=tail[1])

    async def _observe(self, session_id: str) -> dict[str, Any] | None:
        if not self.owns(session_id):
            return None  # not a session of this runtime: tmux is never asked about it
        # The pane before the transcript: once the pane has ended, everything the agent wrote is on disk.
        pane = await self.pane_state(session_id)
        transcript = await asyncio.to_thread(self.read_transcript, session_id)
        if transcript is None:
            return None  # its directory went away meanwhile: no longer a session of this runtime
        return observe(pane, transcript)

    async def inspect(self, ref: _Ref, options: _Options) -> dict[str, Any] | None:
        session_id = check_session_id(ref.session_id)
        return await _until_aborted(self._observe(session_id), options.signal)

    async def detach(self, ref: _Ref, request: _DetachRequest, options: _Options) -> dict[str, Any] | None:
        session_id = check_session_id(ref.session_id)
        return await _until_aborted(self._stop(session_id, stop_runtime=request.stop_runtime is True), options.signal)

    async def _stop(self, session_id: str, *, stop_runtime: bool) -> dict[str, Any] | None:
        before = await self._observe(session_id)
        if before is None or not stop_runtime:
            return before
        if not self.owns(session_id):
            return None  # its directory went away while it was read: not this runtime's to kill any more
        if before["metadata"]["pane"] != "gone":
            code, _, err = await self._tmux("kill-session", "-t", f"={session_id}")
            if code != 0 and await self.has_session(session_id):
                raise LocalTmuxError("tmux_failed", f"tmux kill-session failed: {err[:200] or f'exit {code}'}")
        if before["state"] != "running":
            return before  # it had already ended; what it left stands
        # Killed mid-turn: whatever the transcript holds is not this turn's answer.
        return {
            "state": "dead",
            "alive": False,
            "terminated": True,
            "lastEventAt": before.get("lastEventAt"),
            "metadata": {**before["metadata"], "pane": "killed"},
        }


def observe(pane: str, transcript: Transcript) -> dict[str, Any]:
    """The observation for a pane state (``alive``, ``dead``, ``gone``) and the session's transcript.

    The pane ended (``dead`` or ``gone``) is the only time the transcript's last assistant entry is an answer.
    """
    entries = transcript.entries
    metadata = {
        "pane": pane,
        "transcript": "present" if transcript.present else "missing",
        "transcriptEntries": str(len(entries)),
        "skippedEntries": str(transcript.skipped),
    }
    last_event = max((e.at_ms for e in entries), default=None)
    answers = [e for e in entries if e.role == "assistant"]
    last_answer = answers[-1] if answers else None  # the transcript is appended to: the last line is the newest
    observation: dict[str, Any] = {"metadata": metadata}
    if last_event is not None:
        observation["lastEventAt"] = last_event
    if pane == "alive":
        observation.update(state="running", alive=True, terminated=False)
        if last_answer is not None:
            observation["latestResponse"] = last_answer.text  # partial: never offered as the turn's answer
        return observation
    if last_answer is None:
        observation.update(state="dead", alive=False, terminated=True)
        return observation
    observation.update(
        state="completed",
        alive=False,
        terminated=True,
        latestResponse=last_answer.text,
        finalResponse=last_answer.text,
    )
    return observation


def register_agent_session_runtimes(registry: _Registry, environ: Mapping[str, str] | None = None) -> None:
    """Register ``local-tmux`` with ``inspect`` and ``detach``; the sessions' root is ``LOCAL_TMUX_RUNTIME_ROOT``."""
    env = os.environ if environ is None else environ
    root = env.get(ROOT_ENV, "").strip()
    if not root or not os.path.isabs(root):
        _log.error("%s is not registered: %s must name the sessions' root directory (absolute)", RUNTIME_ID, ROOT_ENV)
        raise LocalTmuxError("not_configured", f"{ROOT_ENV} must name the sessions' root directory (absolute)")
    runtime = LocalTmuxRuntime(Path(root))
    registry.register(
        RUNTIME_ID,
        provider=env.get(PROVIDER_ENV, "").strip() or DEFAULT_PROVIDER,
        inspect=runtime.inspect,
        detach=runtime.detach,
    )


__all__ = [
    "RUNTIME_ID",
    "LocalTmuxError",
    "LocalTmuxRuntime",
    "observe",
    "parse_timestamp",
    "parse_transcript",
    "register_agent_session_runtimes",
]

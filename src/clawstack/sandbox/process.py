"""Running one command in a bubblewrap sandbox, with a wall-clock limit and bounded output capture."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from clawstack.sandbox.errors import SandboxSpecError, SandboxStartError, SandboxUnavailableError
from clawstack.sandbox.spec import ResourceLimits, SandboxSpec, bwrap_argv, dev, proc, system_mounts, tmpfs

Keep = Literal["head", "tail"]

DRAIN_S: Final = 2.0
"""How long output is still read after the sandbox has ended (its processes die with it, closing the pipes)."""
_READ_CHUNK: Final = 1 << 16
_PROBE_TIMEOUT_S: Final = 10.0
_HOST_ENV: Final = {"PATH": "/usr/bin:/bin"}  # bubblewrap's own environment: nothing of the caller's


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """How a sandboxed command ended and what it wrote.

    ``exit_code`` is the command's exit status (``128 + N`` when signal ``N`` ended it), ``None`` when it was
    killed at its time limit (then ``timed_out``). ``stdout`` holds stderr as well when the two were merged.
    Each stream keeps at most its limit: the first bytes (``keep="head"``) or the last (``"tail"``), and
    ``*_truncated`` says that more was written and discarded.
    """

    exit_code: int | None
    timed_out: bool
    stdout: bytes
    stdout_truncated: bool
    stderr: bytes
    stderr_truncated: bool
    duration_s: float


class _Bounded:
    """A stream read to its end, of which at most ``limit`` bytes are kept."""

    def __init__(self, limit: int, keep: Keep) -> None:
        self.limit, self.keep = limit, keep
        self.data = bytearray()
        self.seen = 0

    def add(self, chunk: bytes) -> None:
        self.seen += len(chunk)
        if self.keep == "head":
            self.data += chunk[: max(0, self.limit - len(self.data))]
            return
        self.data += chunk[-self.limit :] if self.limit else b""
        if len(self.data) > self.limit:
            del self.data[: len(self.data) - self.limit]

    @property
    def truncated(self) -> bool:
        return self.seen > len(self.data)

    async def pump(self, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(_READ_CHUNK):
            self.add(chunk)


class Sandbox:
    """Runs commands in bubblewrap sandboxes on this host.

    ``bwrap`` and ``prlimit`` are command names or paths, looked up on ``PATH`` once. ``prlimit`` (util-linux)
    runs inside the sandbox to set a command's :class:`ResourceLimits`, so it must be under one of the
    sandbox's read-only system paths (``/usr/bin/prlimit`` is). The first :meth:`run` checks that bubblewrap can
    create a sandbox here at all (:meth:`check`).
    """

    def __init__(self, *, bwrap: str = "bwrap", prlimit: str = "prlimit", drain_s: float = DRAIN_S) -> None:
        self._bwrap = shutil.which(bwrap)
        self._prlimit = shutil.which(prlimit)
        self._drain_s = drain_s
        self._usable = False

    @property
    def bwrap(self) -> str | None:
        """bubblewrap's path, or ``None`` when it was not found."""
        return self._bwrap

    def argv(self, spec: SandboxSpec, command: Sequence[str], *, limits: ResourceLimits | None = None) -> list[str]:
        """The host command line that runs ``command`` in ``spec`` under ``limits``."""
        if self._bwrap is None:
            raise SandboxUnavailableError(
                "bubblewrap (bwrap) was not found; install it (apt-get install -y bubblewrap)"
            )
        inner = list(command)
        if limits is not None:
            if self._prlimit is None:
                raise SandboxUnavailableError("prlimit (util-linux) was not found; it sets the sandbox's limits")
            inner = [*limits.prlimit_argv(self._prlimit), *inner]
        try:
            return bwrap_argv(self._bwrap, spec, inner)
        except ValueError as exc:
            raise SandboxSpecError(str(exc)) from exc

    async def check(self) -> None:
        """Make sure bubblewrap can create a sandbox here, by running ``true`` in a minimal one; raises
        :class:`SandboxUnavailableError` with bubblewrap's own complaint. A success is remembered."""
        if self._usable:
            return
        spec = SandboxSpec(env={"PATH": "/usr/bin:/bin"}, mounts=(*system_mounts(), proc(), dev(), tmpfs("/tmp")))  # noqa: S108 - its own tmpfs
        result = await self._run(self.argv(spec, ["true"]), _PROBE_TIMEOUT_S, 4096, "separate", "head")
        if result.exit_code != 0:
            detail = result.stderr.decode("utf-8", "replace").strip() or f"exit code {result.exit_code}"
            raise SandboxUnavailableError(f"bubblewrap cannot create a sandbox here ({detail[:500]})")
        self._usable = True

    async def run(
        self,
        spec: SandboxSpec,
        command: Sequence[str],
        *,
        timeout_s: float,
        output_limit_bytes: int,
        limits: ResourceLimits | None = None,
        stderr: Literal["separate", "merge"] = "separate",
        keep: Keep = "head",
    ) -> SandboxResult:
        """Run ``command`` in ``spec`` and return once the whole sandbox has ended.

        At ``timeout_s`` the sandbox is killed (its PID namespace and every process in it) and the result says
        ``timed_out``; cancelling the call kills it too. stdout and stderr (or both as one stream, in the order
        written, with ``stderr="merge"``) are each read to their end and bounded by ``output_limit_bytes``.
        stdin is ``/dev/null``.
        """
        if timeout_s <= 0 or output_limit_bytes < 0:
            raise SandboxSpecError("timeout_s must be positive and output_limit_bytes not negative")
        argv = self.argv(spec, command, limits=limits)
        await self.check()
        return await self._run(argv, timeout_s, output_limit_bytes, stderr, keep)

    async def _run(
        self, argv: list[str], timeout_s: float, limit: int, stderr: Literal["separate", "merge"], keep: Keep
    ) -> SandboxResult:
        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT if stderr == "merge" else asyncio.subprocess.PIPE,
                env=_HOST_ENV,
                cwd="/",
            )
        except OSError as exc:
            raise SandboxStartError(f"bubblewrap could not be started ({type(exc).__name__}: {exc.strerror})") from exc
        out, err = _Bounded(limit, keep), _Bounded(limit, keep)
        assert process.stdout is not None
        readers = [asyncio.create_task(out.pump(process.stdout))]
        if process.stderr is not None:
            readers.append(asyncio.create_task(err.pump(process.stderr)))
        timed_out = False
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    await process.wait()
            except TimeoutError:
                timed_out = True
            if timed_out:
                _kill(process)  # --die-with-parent: the sandbox's pid 1, and with it everything inside, follows
                await process.wait()
            await asyncio.wait(readers, timeout=self._drain_s)
        finally:
            if process.returncode is None:
                # Cancelled: kill the sandbox; the wait for it is shielded so that the kill is reaped.
                _kill(process)
                await asyncio.shield(process.wait())
            for reader in readers:
                reader.cancel()
        returncode = process.returncode
        assert returncode is not None  # waited for above
        exit_code = None if timed_out else (128 - returncode if returncode < 0 else returncode)
        return SandboxResult(
            exit_code=exit_code,
            timed_out=timed_out,
            stdout=bytes(out.data),
            stdout_truncated=out.truncated,
            stderr=bytes(err.data),
            stderr_truncated=err.truncated,
            duration_s=time.monotonic() - started,
        )


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended in between
        process.kill()


def default_env(home: str | os.PathLike[str]) -> dict[str, str]:
    """The environment a sandboxed shell command gets: ``PATH``, ``HOME`` and a UTF-8 ``LANG``."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.fspath(home), "LANG": "C.UTF-8"}


__all__ = ["DRAIN_S", "Keep", "Sandbox", "SandboxResult", "default_env"]

"""Running one command in a bubblewrap sandbox, with a wall-clock limit, bounded output capture and, given a
:class:`~clawstack.sandbox.cgroups.Containment`, memory and pids limits on the whole sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from subprocess import SubprocessError
from typing import Final, Literal

from clawstack.sandbox.cgroups import Containment, LimitReached
from clawstack.sandbox.errors import SandboxSpecError, SandboxStartError, SandboxUnavailableError
from clawstack.sandbox.spec import ResourceLimits, SandboxSpec, bind, bwrap_argv, dev, proc, system_mounts, tmpfs

Keep = Literal["head", "tail"]

DRAIN_S: Final = 2.0
"""How long output is still read after the sandbox has ended (its processes die with it, closing the pipes)."""
_READ_CHUNK: Final = 1 << 16
_PROBE_TIMEOUT_S: Final = 10.0
_HOST_ENV: Final = {"PATH": "/usr/bin:/bin"}  # bubblewrap's own environment: nothing of the caller's
_LIMIT_POLL_S: Final = 0.05
# Waits on stdin (a pipe) until the caller has moved it into the sandbox's cgroups, then becomes bubblewrap: so
# bubblewrap, and everything it starts, begins inside them. EOF instead of the go-ahead ends it without a start.
_GATE: Final = ("/bin/sh", "-c", 'read -r _ && exec "$@" </dev/null', "claw-gate")
_MAX_STAGED: Final = 7
_STAGE_DIR: Final = "/tmp"  # noqa: S108 - covered by a tmpfs of its own, in a private mount namespace only
# As root: the gate (when "$1" is set), then, in a private mount namespace, each directory opened (before anything
# is covered: it may be under /tmp), a small tmpfs over /tmp, each bound at /tmp/<i> (reachable for the uid
# whatever the path to it), the uid and gid dropped with no supplementary groups, and bubblewrap exec'd: the
# process the caller started becomes bubblewrap. At most 7 directories (descriptors 3 to 9).
_STAGE: Final = r"""
if [ -n "$1" ]; then read -r _ || exit 125; fi
exec </dev/null
shift
exec unshare --mount --propagation private -- /bin/sh -c '
set -e
uid=$1; count=$2; shift 2
i=0
while [ "$i" -lt "$count" ]; do
  eval "exec $((i + 3))<\"\$$((i + 1))\""
  i=$((i + 1))
done
shift "$count"
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev claw-stage /tmp
i=0
while [ "$i" -lt "$count" ]; do
  mkdir "/tmp/$i"
  mount --no-canonicalize --bind "/proc/self/fd/$((i + 3))" "/tmp/$i"
  eval "exec $((i + 3))<&-"
  i=$((i + 1))
done
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups -- "$@"
' claw-stage "$@"
"""


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """How a sandboxed command ended and what it wrote.

    ``exit_code`` is the command's exit status (``128 + N`` when signal ``N`` ended it), ``None`` when it was
    killed at its time limit (then ``timed_out``). ``stdout`` holds stderr as well when the two were merged.
    Each stream keeps at most its limit: the first bytes (``keep="head"``) or the last (``"tail"``), and
    ``*_truncated`` says that more was written and discarded. ``limit_reached`` names the containment limit the
    kernel enforced (``pids``: a fork was refused; ``memory``: the OOM killer struck), at which the whole sandbox
    was killed; ``exit_code`` is then ``None`` too.
    """

    exit_code: int | None
    timed_out: bool
    stdout: bytes
    stdout_truncated: bool
    stderr: bytes
    stderr_truncated: bool
    duration_s: float
    limit_reached: LimitReached | None = None


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
        self._usable: set[int | None] = set()

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

    async def check(self, *, uid: int | None = None) -> None:
        """Make sure bubblewrap can create a sandbox here (as ``uid``, when given), by running ``true`` in a
        minimal one; raises :class:`SandboxUnavailableError` with bubblewrap's own complaint. A success is
        remembered."""
        if uid in self._usable:
            return
        spec = SandboxSpec(env={"PATH": "/usr/bin:/bin"}, mounts=(*system_mounts(), proc(), dev(), tmpfs("/tmp")))  # noqa: S108 - its own tmpfs
        launch = _Launch(self.argv(spec, ["true"]), uid=uid)
        result = await self._run(launch, _PROBE_TIMEOUT_S, 4096, "separate", "head")
        if result.exit_code != 0:
            detail = result.stderr.decode("utf-8", "replace").strip() or f"exit code {result.exit_code}"
            raise SandboxUnavailableError(f"bubblewrap cannot create a sandbox here ({detail[:500]})")
        self._usable.add(uid)

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
        containment: Containment | None = None,
        uid: int | None = None,
    ) -> SandboxResult:
        """Run ``command`` in ``spec`` and return once the whole sandbox has ended.

        At ``timeout_s`` the sandbox is killed (its PID namespace and every process in it) and the result says
        ``timed_out``; cancelling the call kills it too. stdout and stderr (or both as one stream, in the order
        written, with ``stderr="merge"``) are each read to their end and bounded by ``output_limit_bytes``.
        stdin is ``/dev/null``. The descriptors of the spec's ``bind-fd`` and ``file`` mounts are passed in.

        ``containment`` bounds the whole sandbox: bubblewrap starts inside its cgroups, or under the rlimits that
        stand in for them (added to ``limits``); the moment the kernel enforces a cgroup limit the sandbox is
        killed, and the result's ``limit_reached`` says which. The caller creates and releases it. ``uid`` runs
        bubblewrap, and so the whole sandbox, as that uid and gid with no supplementary groups (only root can).
        """
        if timeout_s <= 0 or output_limit_bytes < 0:
            raise SandboxSpecError("timeout_s must be positive and output_limit_bytes not negative")
        if containment is not None and (extra := containment.rlimits()):
            limits = dataclasses.replace(limits or ResourceLimits(), **extra)
        fds = tuple(int(mount.source) for mount in spec.mounts if mount.kind in ("bind-fd", "file"))
        staged: tuple[int, ...] = ()
        if uid is not None:
            # bubblewrap, unprivileged, binds only what its uid can reach by path: stage the descriptors' dirs.
            staged = tuple(int(mount.source) for mount in spec.mounts if mount.kind == "bind-fd")
            if len(staged) > _MAX_STAGED:
                raise SandboxSpecError(f"at most {_MAX_STAGED} bind-fd mounts under a uid of the sandbox's own")
            places = iter(range(len(staged)))
            spec = dataclasses.replace(
                spec,
                mounts=[
                    bind(f"{_STAGE_DIR}/{next(places)}", mount.dest) if mount.kind == "bind-fd" else mount
                    for mount in spec.mounts
                ],
            )
        argv = self.argv(spec, command, limits=limits)
        launch = _Launch(argv, uid=uid, fds=fds, staged=staged, containment=containment)
        await self.check(uid=uid)
        return await self._run(launch, timeout_s, output_limit_bytes, stderr, keep)

    async def _run(
        self, launch: _Launch, timeout_s: float, limit: int, stderr: Literal["separate", "merge"], keep: Keep
    ) -> SandboxResult:
        started = time.monotonic()
        process = await launch.start(stderr)
        out, err = _Bounded(limit, keep), _Bounded(limit, keep)
        assert process.stdout is not None
        readers = [asyncio.create_task(out.pump(process.stdout))]
        if process.stderr is not None:
            readers.append(asyncio.create_task(err.pump(process.stderr)))
        timed_out = False
        reached: LimitReached | None = None
        try:
            try:
                async with asyncio.timeout(timeout_s):
                    reached = await launch.wait_for_end_or_limit(process)
            except TimeoutError:
                timed_out = True
            if timed_out or reached is not None:
                launch.kill(process)
                await process.wait()
            await asyncio.wait(readers, timeout=self._drain_s)
        finally:
            if process.returncode is None:
                # Cancelled: kill the sandbox; the wait for it is shielded so that the kill is reaped.
                launch.kill(process)
                await asyncio.shield(process.wait())
            for reader in readers:
                reader.cancel()
        returncode = process.returncode
        assert returncode is not None  # waited for above
        if reached is None and not timed_out and launch.containment is not None:
            reached = launch.containment.limit_reached()  # it struck just before the end
        killed = timed_out or reached is not None
        exit_code = None if killed else (128 - returncode if returncode < 0 else returncode)
        return SandboxResult(
            exit_code=exit_code,
            timed_out=timed_out,
            stdout=bytes(out.data),
            stdout_truncated=out.truncated,
            stderr=bytes(err.data),
            stderr_truncated=err.truncated,
            duration_s=time.monotonic() - started,
            limit_reached=reached,
        )


@dataclass(frozen=True, slots=True)
class _Launch:
    """How bubblewrap's process is started: its argv, the uid it runs as, the descriptors it inherits, and the
    containment its process joins before it becomes bubblewrap."""

    argv: list[str]
    uid: int | None = None
    fds: tuple[int, ...] = ()
    staged: tuple[int, ...] = ()
    containment: Containment | None = None

    def _prefix(self, gated: bool) -> list[str]:
        if self.uid is None:
            return list(_GATE) if gated else []
        staging = [os.readlink(f"/proc/self/fd/{fd}") for fd in self.staged]
        return ["/bin/sh", "-c", _STAGE, "claw-stage", "1" if gated else "", str(self.uid), str(len(staging)), *staging]

    async def start(self, stderr: Literal["separate", "merge"]) -> asyncio.subprocess.Process:
        gated = self.containment is not None and self.containment.cgroups is not None
        gate_r, gate_w = os.pipe() if gated else (None, None)
        try:
            process = await asyncio.create_subprocess_exec(
                *self._prefix(gated),
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL if gate_r is None else gate_r,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT if stderr == "merge" else asyncio.subprocess.PIPE,
                env=_HOST_ENV,
                cwd="/",
                pass_fds=self.fds,
            )
        except (OSError, ValueError, SubprocessError) as exc:
            if gate_w is not None:
                os.close(gate_w)
            detail = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise SandboxStartError(f"bubblewrap could not be started ({type(exc).__name__}: {detail})") from exc
        finally:
            if gate_r is not None:
                os.close(gate_r)
        if gate_w is not None:
            assert self.containment is not None
            try:
                self.containment.join(process.pid)
                os.write(gate_w, b"go\n")
            except OSError as exc:
                _kill(process)
                await process.wait()
                raise SandboxStartError(
                    f"the sandbox could not join its cgroups ({type(exc).__name__}: {exc.strerror})"
                ) from exc
            finally:
                os.close(gate_w)
        return process

    async def wait_for_end_or_limit(self, process: asyncio.subprocess.Process) -> LimitReached | None:
        """Wait for the sandbox's end, or for a containment limit the kernel enforced, whichever is first."""
        if self.containment is None or self.containment.cgroups is None:
            await process.wait()
            return None
        ended = asyncio.ensure_future(process.wait())
        try:
            while True:
                done, _ = await asyncio.wait([ended], timeout=_LIMIT_POLL_S)
                if done:
                    return None
                if (reached := self.containment.limit_reached()) is not None:
                    return reached
        finally:
            ended.cancel()

    def kill(self, process: asyncio.subprocess.Process) -> None:
        """Kill the sandbox: bubblewrap (``--die-with-parent``: the sandbox's pid 1, and with it everything in its
        PID namespace, follows), and whatever its cgroups hold."""
        _kill(process)
        if self.containment is not None:
            self.containment.kill_all()


def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended in between
        process.kill()


def default_env(home: str | os.PathLike[str]) -> dict[str, str]:
    """The environment a sandboxed shell command gets: ``PATH``, ``HOME`` and a UTF-8 ``LANG``."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.fspath(home), "LANG": "C.UTF-8"}


__all__ = ["DRAIN_S", "Keep", "Sandbox", "SandboxResult", "default_env"]

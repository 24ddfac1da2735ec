"""The pod lock: one ``flock`` on ``.claw-runs/pod.lock`` shared by ``claw up``, ``claw down`` and the supervisor.

The holder writes its pid into the file so that a refused process can say who holds it. The lock is released
when the last descriptor of its open file closes. A holder that starts lifecycle subprocesses hands them the
descriptor (``acquire(inheritable=True)``, then :attr:`PodLock.fd` passed to the subprocess), so that a killed
supervisor's in-flight spawn keeps writer authority until it is done: the local backend's monitor holds it until
its worker has started or failed, and only then closes it. ``claw up`` and ``claw down`` refuse meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

from clawstack.common.files import ensure_private_dir
from clawstack.pod.errors import LockError


class PodLock:
    """An exclusive, non-blocking lock on a pod."""

    def __init__(self, path: Path, *, holder: str) -> None:
        self.path = path
        self.holder = holder
        self._fd: int | None = None

    def acquire(self, *, inheritable: bool = False) -> None:
        """Take the lock or raise :class:`LockError` naming the current holder's pid."""
        ensure_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            held_by = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LockError(f"the pod is locked by {held_by}; stop it first", where=str(self.path)) from exc
            raise LockError(f"cannot lock the pod: {exc.strerror}", where=str(self.path)) from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.holder}\n".encode(), 0)
        os.set_inheritable(fd, inheritable)
        self._fd = fd

    def release(self) -> None:
        """Release the lock. Idempotent."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    @property
    def fd(self) -> int | None:
        """The lock's descriptor while held: a lifecycle subprocess given it keeps writer authority while it runs."""
        return self._fd

    def __enter__(self) -> PodLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    pid, _, name = text.partition(" ")
    return f"pid {pid} ({name})" if pid.isdigit() else "another process"


__all__ = ["PodLock"]

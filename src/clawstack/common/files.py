"""Private files and trusted directories.

* :func:`write_private` writes a file atomically: a temporary file in the same directory, ``fsync``, ``rename``
  over the target, then ``fsync`` of the directory, so a crash leaves either the old bytes or the new ones, and
  an answer given after the call returns is backed by what is on disk. The file is mode 0600.
* :func:`ensure_private_dir` creates (or tightens) a directory to mode 0700 owned by us.
* :func:`check_trusted_dir` is the socket-directory trust rule: the directory is owned by the expected user,
  has mode 0700 or 0750, and no ancestor is group- or world-writable unless it carries the sticky bit. Ancestors
  must also be owned by root or the expected user, since their owner could swap the directory out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Final

from clawstack.common.errors import ClawError

PRIVATE_FILE_MODE: Final = 0o600
PRIVATE_DIR_MODE: Final = 0o700
TRUSTED_DIR_MODES: Final = frozenset({0o700, 0o750})


class UnsafePathError(ClawError):
    """A path fails a trust rule. The message names the path and the rule; it never names file contents."""

    code = "path_unsafe"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """``fsync`` a directory so that a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` if needed (missing parents get default permissions) and make it mode 0700.

    Refuses a path that exists but is a symlink or not a directory, or is owned by someone else.
    """
    target = Path(path)
    target.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    st = os.lstat(target)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{target} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(f"{target} is owned by uid {st.st_uid}, not {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(target, PRIVATE_DIR_MODE)
    return target


def write_private(path: str | os.PathLike[str], data: bytes, *, mode: int = PRIVATE_FILE_MODE) -> None:
    """Atomically replace ``path`` with ``data``, mode ``mode`` (0600), durably.

    The parent directory must already exist; use :func:`ensure_private_dir` for it.
    """
    target = Path(path)
    parent = target.parent
    tmp = parent / f".{target.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed or widened nothing; make it exact
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        # Best-effort cleanup of the temporary file on any failure, then re-raise unchanged.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(parent)


def read_private(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """Read a file that must be a regular, non-symlinked file of mode 0600 owned by us, at most ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symlink") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{path} is not a regular file")
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafePathError(f"{path} must be mode 0600 and owned by uid {os.geteuid()}")
        if st.st_size > max_bytes:
            raise UnsafePathError(f"{path} is larger than {max_bytes} bytes")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise UnsafePathError(f"{path} is larger than {max_bytes} bytes")
        return data
    finally:
        os.close(fd)


def check_trusted_dir(path: str | os.PathLike[str], *, owner_uid: int | None = None) -> Path:
    """Check the trust rule for a directory holding a socket or secrets; return its resolved path.

    * ``path`` itself is a directory (not a symlink) owned by ``owner_uid`` (default: our effective UID),
      with mode exactly 0700 or 0750;
    * no ancestor of its real path is group- or world-writable unless it has the sticky bit, and every
      ancestor is owned by root or ``owner_uid``.

    Raises :class:`UnsafePathError` with a message naming the offending path and rule.
    """
    expected = os.geteuid() if owner_uid is None else owner_uid
    given = Path(path)
    try:
        st = os.lstat(given)
    except FileNotFoundError as exc:
        raise UnsafePathError(f"{given} does not exist", code="path_missing") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(f"{given} is a symlink; name the real directory")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"{given} is not a directory")
    if st.st_uid != expected:
        raise UnsafePathError(f"{given} is owned by uid {st.st_uid}, expected uid {expected}")
    mode = stat.S_IMODE(st.st_mode)
    if mode not in TRUSTED_DIR_MODES:
        raise UnsafePathError(f"{given} has mode {mode:04o}; it must be 0700 or 0750")
    real = given.resolve(strict=True)
    for ancestor in real.parents:
        ast = os.stat(ancestor)
        amode = stat.S_IMODE(ast.st_mode)
        if amode & (stat.S_IWGRP | stat.S_IWOTH) and not amode & stat.S_ISVTX:
            raise UnsafePathError(
                f"ancestor {ancestor} has mode {amode:04o}: group- or world-writable without the sticky bit"
            )
        if ast.st_uid not in (0, expected):
            raise UnsafePathError(f"ancestor {ancestor} is owned by uid {ast.st_uid}, not root or uid {expected}")
    return real


__all__ = [
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "TRUSTED_DIR_MODES",
    "UnsafePathError",
    "check_trusted_dir",
    "ensure_private_dir",
    "fsync_dir",
    "read_private",
    "write_private",
]

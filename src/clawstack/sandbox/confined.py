"""File access confined to one directory tree, robust against ``..``, symlinks and swaps under way.

A :class:`ConfinedDir` resolves a path the way the kernel would, but one component at a time from descriptors
it holds (``openat`` with ``O_NOFOLLOW``): a relative path starts at the root, an absolute one is accepted only
if it names a place under the root (by its path as given or by its real path). ``..`` never climbs above the
root; a symlink on the way is followed only if its target stays inside (an absolute target must name a place
under the root, a relative one is resolved from the symlink's directory), at most 40 of them. A directory
whose descriptor is held stays that directory even if its name is replaced by a symlink meanwhile, and a final
component is opened with ``O_NOFOLLOW``, so a check and its use can never disagree.

Writes never follow a symlink at all: :meth:`ConfinedDir.replace_file` writes a new file next to the target and
renames it over the target, so a symlink (or a hard link) there is replaced, never written through; a target
that is a symlink when it is checked is refused. All of it is blocking: call it from a thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from clawstack.sandbox.errors import ConfinedPathError, PathEscapeError, PathNotFoundError

MAX_SYMLINKS: Final = 40
_T = TypeVar("_T")
_DIR_FLAGS: Final = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class _Symlink(Exception):
    """Raised by a final step that met a symlink: the walk follows it."""


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


class ConfinedDir:
    """Paths confined to the directory ``root`` (see the module docstring). ``label`` names the root in error
    messages, as in "Path escapes workspace root (/srv/ws): ../x"."""

    def __init__(self, root: str | os.PathLike[str], *, label: str = "root") -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.label = label
        self._prefixes = [_parts(self.root)]
        real = _parts(os.path.realpath(self.root))
        if real != self._prefixes[0]:
            self._prefixes.append(real)

    # -- operations -------------------------------------------------------------------------------------------

    def open_file(self, path: str, *, follow: bool = True) -> int:
        """A read-only descriptor of the regular file at ``path`` (the caller closes it). With ``follow=False`` a
        final symlink is refused instead of followed."""

        def final(directory: int, name: str, _parts: Sequence[str]) -> int:
            if not name:
                raise self._error(path, "is_a_directory", "is a directory")
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=directory)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    if follow:
                        raise _Symlink from None
                    raise self._error(path, "is_a_symlink", "is a symbolic link, which is not followed here") from None
                raise
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                return fd
            os.close(fd)
            if stat.S_ISDIR(mode):
                raise self._error(path, "is_a_directory", "is a directory")
            raise self._error(path, "not_a_regular_file", "is not a regular file")

        return self._walk(path, final)

    def directory(self, path: str) -> tuple[str, ...]:
        """The directory at ``path`` as its components below the root, symlinks resolved."""

        def final(directory: int, name: str, parts: Sequence[str]) -> tuple[str, ...]:
            if not name:
                return tuple(parts)
            fd = os.open(name, _DIR_FLAGS, dir_fd=directory)
            try:
                mode = os.fstat(fd).st_mode
            finally:
                os.close(fd)
            if stat.S_ISLNK(mode):
                raise _Symlink
            if not stat.S_ISDIR(mode):
                raise self._error(path, "not_a_directory", "is not a directory")
            return (*parts, name)

        return self._walk(path, final)

    def replace_file(self, path: str, data: bytes) -> bool:
        """Write ``data`` as the file at ``path``, creating missing directories on the way, atomically and
        durably (a new file renamed over the old one, both fsynced); return whether the file is new. An existing
        file keeps its permission bits. A symlink, a directory or anything but a regular file there is refused."""

        def final(directory: int, name: str, _parts: Sequence[str]) -> bool:
            if not name:
                raise self._error(path, "is_a_directory", "is a directory")
            try:
                existing: os.stat_result | None = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            if existing is not None:
                if stat.S_ISLNK(existing.st_mode):
                    raise self._error(path, "is_a_symlink", "is a symbolic link; writes do not follow symbolic links")
                if stat.S_ISDIR(existing.st_mode):
                    raise self._error(path, "is_a_directory", "is a directory")
                if not stat.S_ISREG(existing.st_mode):
                    raise self._error(path, "not_a_regular_file", "is not a regular file")
            self._write_new(directory, name, data, None if existing is None else stat.S_IMODE(existing.st_mode))
            return existing is None

        return self._walk(path, final, create_parents=True)

    @staticmethod
    def _write_new(directory: int, name: str, data: bytes, mode: int | None) -> None:
        temporary = f".claw-{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, 0o666 if mode is None else mode & 0o777, dir_fd=directory)
        renamed = False
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if mode is not None:
                    os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
            renamed = True
        finally:
            if not renamed:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=directory)
        handle = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=directory)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)

    # -- the walk ---------------------------------------------------------------------------------------------

    def _walk(self, path: str, final: Callable[[int, str, Sequence[str]], _T], *, create_parents: bool = False) -> _T:
        """Resolve ``path`` down to its final component and return ``final(directory, name, parts)``:
        ``directory`` a descriptor of the final component's directory, ``parts`` that directory's components
        below the root, ``name`` the final component (``""`` when the path names a directory by ``.``/``..``
        or is the root). ``final`` raises :class:`_Symlink` to have a symlink followed."""
        followed = 0
        try:
            pending = deque(self._components(path))
            stack: list[tuple[int, str]] = [(self._open_root(), "")]
        except OSError as exc:
            raise self._translate(path, exc) from exc
        try:
            while True:
                while pending and pending[0] in ("", "."):
                    pending.popleft()
                parts = [name for _, name in stack[1:]]
                if not pending:
                    return final(stack[-1][0], "", parts)
                name = pending.popleft()
                if name == "..":
                    if len(stack) == 1:
                        raise self._escape(path, followed > 0)
                    os.close(stack.pop()[0])
                    continue
                if all(part in ("", ".") for part in pending):
                    try:
                        return final(stack[-1][0], name, parts)
                    except _Symlink:
                        pass
                else:
                    fd = self._enter(stack[-1][0], name, path, create=create_parents)
                    if fd is not None:
                        stack.append((fd, name))
                        continue
                followed += 1
                if followed > MAX_SYMLINKS:
                    raise self._error(path, "symlink_loop", "has too many levels of symbolic links")
                try:
                    target = os.readlink(name, dir_fd=stack[-1][0])
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    pending.appendleft(name)  # no longer a symlink: replaced meanwhile, so look again
                    continue
                if target.startswith("/"):
                    inside = self._inside(target)
                    if inside is None:
                        raise self._escape(path, True)
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                    pending.extendleft(reversed(inside))
                else:
                    pending.extendleft(reversed(target.split("/")))
        except OSError as exc:
            raise self._translate(path, exc) from exc
        finally:
            for fd, _ in stack:
                os.close(fd)

    def _enter(self, directory: int, name: str, path: str, *, create: bool) -> int | None:
        """A descriptor of the directory ``name`` in ``directory``, or ``None`` if ``name`` is a symlink."""
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=directory)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):  # made meanwhile; what it is is checked below
                os.mkdir(name, 0o777, dir_fd=directory)
            fd = os.open(name, _DIR_FLAGS, dir_fd=directory)
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            return fd
        os.close(fd)
        if stat.S_ISLNK(mode):
            return None
        raise self._error(path, "not_a_directory", f"has {name!r} on its way, which is not a directory")

    def _open_root(self) -> int:
        try:
            return os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            raise ConfinedPathError(
                f"The {self.label} {self.root} does not exist or is not a directory", code="root_missing"
            ) from None

    def _components(self, path: str) -> list[str]:
        if not path or "\0" in path:
            raise self._error(path, "path_invalid", "is not a usable path (empty, or holds NUL)")
        if not path.startswith("/"):
            return path.split("/")
        inside = self._inside(path)
        if inside is None:
            raise self._escape(path, False)
        return inside

    def _inside(self, absolute: str) -> list[str] | None:
        """The components below the root of ``absolute``, when it starts with the root's (given or real) path;
        ``..`` is left for the walk, which resolves it against real directories."""
        parts = _parts(absolute)
        for prefix in self._prefixes:
            if parts[: len(prefix)] == prefix:
                return parts[len(prefix) :]
        return None

    # -- errors -----------------------------------------------------------------------------------------------

    def _escape(self, path: str, symlink: bool) -> PathEscapeError:
        kind = "Symlink" if symlink else "Path"
        return PathEscapeError(f"{kind} escapes {self.label} ({self.root}): {path}")

    @staticmethod
    def _error(path: str, code: str, what: str) -> ConfinedPathError:
        return ConfinedPathError(f"{path} {what}", code=code)

    def _translate(self, path: str, exc: OSError) -> ConfinedPathError:
        if exc.errno == errno.ENOENT:
            return PathNotFoundError(f"{path} does not exist")
        if exc.errno == errno.ENOTDIR:
            return self._error(path, "not_a_directory", "has a component on its way that is not a directory")
        if exc.errno in (errno.EACCES, errno.EPERM):
            return self._error(path, "permission_denied", "cannot be accessed (permission denied)")
        if exc.errno == errno.ENAMETOOLONG:
            return self._error(path, "path_invalid", "is too long")
        if exc.errno == errno.ENOSPC:
            return self._error(path, "no_space", "cannot be written: no space left on the device")
        return self._error(path, "io_error", f"failed ({errno.errorcode.get(exc.errno or 0, 'error')})")


__all__ = ["MAX_SYMLINKS", "ConfinedDir"]

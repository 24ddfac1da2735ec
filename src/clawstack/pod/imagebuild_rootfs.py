"""The root filesystem of ``clawstack/base``, assembled on the host from the host interpreter; no pull, no shell.

:func:`base_rootfs` lays out the interpreter of ``sys.base_prefix`` at :data:`IMAGE_PREFIX` (Python finds its
prefix by landmark, so it runs from there), without what a server does not need (the stdlib test suites,
tkinter, idlelib, turtledemo, ensurepip, the build configuration, the prefix's site-packages), with the host's
byte code of each stdlib module where it is current (so that a worker on a read-only root does not compile the
stdlib at every start; each such source keeps its host mtime, which its byte code is checked against),
plus the shared-library closure ``ldd`` names for the interpreter and every ``lib-dynload`` module at their host
paths (symlinked directories such as ``/lib -> usr/lib`` kept as symlinks), the dynamic loader, the CA bundle, a
minimal ``/etc/passwd``, ``/etc/group`` and ``/etc/nsswitch.conf``, and an empty ``/tmp`` (mode 1777).
:meth:`RootfsLayout.write_tar` writes it deterministically (sorted entries, fixed mtime, uid/gid 0, no user
names, normalised modes, a fixed mtime but for those sources), so the same host gives the same tarball digest.

An extension module whose libraries ``ldd`` cannot find is left as it is: it cannot be imported on the host
either. A missing interpreter, stdlib or ``ldd``, or an interpreter whose own libraries are missing, raises
:class:`~clawstack.pod.errors.BackendError` with code ``rootfs_failed``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final, Literal

from clawstack.pod.errors import BackendError

__all__ = [
    "IMAGE_PREFIX",
    "HostInterpreter",
    "RootfsLayout",
    "base_rootfs",
    "file_digest",
    "host_interpreter",
    "shared_libraries",
]

IMAGE_PREFIX: Final = "/opt/python"
"""Where the interpreter's prefix lives in the image: ``/opt/python/bin/python3`` is the interpreter."""

TAR_MTIME: Final = 0
"""The modification time of every entry of a tarball written here."""

CA_BUNDLE: Final = "/etc/ssl/certs/ca-certificates.crt"

_STDLIB_LEFT_OUT: Final = frozenset({"test", "tkinter", "idlelib", "turtledemo", "ensurepip"})
_NESTED_TESTS: Final = frozenset({"test", "tests", "idle_test"})
_DYNLOAD_LEFT_OUT: Final = re.compile(r"(_test|_ctypes_test|_xxtestfuzz|xxlimited|_tkinter)")
_LDD_TIMEOUT_S: Final = 60
_LDD_BATCH: Final = 64
_SYMLINK_DEPTH: Final = 40

_PASSWD: Final = b"root:x:0:0:root:/root:/nonexistent\nnobody:x:65534:65534:nobody:/nonexistent:/nonexistent\n"
_GROUP: Final = b"root:x:0:\nnogroup:x:65534:\n"
_NSSWITCH: Final = b"passwd: files\ngroup: files\nhosts: files dns\n"


def _failed(message: str) -> BackendError:
    return BackendError(message, code="rootfs_failed")


@dataclass(frozen=True, slots=True)
class HostInterpreter:
    """The interpreter an image is made from: its prefix on the host and where its parts are inside it."""

    prefix: Path
    """``sys.base_prefix``: the installation, not a virtual environment."""
    version: str
    """``X.Y``."""
    executable: Path
    """``<prefix>/bin/pythonX.Y``."""
    stdlib: Path
    """``<prefix>/<platlibdir>/pythonX.Y``."""
    libdir: Path
    """Where ``libpythonX.Y.so`` lives when the interpreter is built shared."""
    shared: bool
    """Whether the interpreter links ``libpython`` dynamically."""

    def image_path(self, host_path: Path) -> str:
        """The path in the image of ``host_path``, a path inside the prefix."""
        return posixpath.join(IMAGE_PREFIX, host_path.relative_to(self.prefix).as_posix())


def host_interpreter() -> HostInterpreter:
    """The interpreter this process runs on, as installed (``sys.base_prefix``); ``rootfs_failed`` if unusable."""
    prefix = Path(sys.base_prefix)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    executable = prefix / "bin" / f"python{version}"
    stdlib = prefix / sys.platlibdir / f"python{version}"
    if not executable.is_file():
        raise _failed(f"the host interpreter {executable} is missing: clawstack/base is made from sys.base_prefix")
    if not (stdlib / "os.py").is_file():
        raise _failed(f"the standard library of the host interpreter is not at {stdlib}")
    libdir = prefix / sys.platlibdir
    configured_prefix = sysconfig.get_config_var("prefix")
    configured_libdir = sysconfig.get_config_var("LIBDIR")
    if isinstance(configured_prefix, str) and isinstance(configured_libdir, str):
        with contextlib.suppress(ValueError):  # a LIBDIR outside the prefix: keep <prefix>/<platlibdir>
            libdir = prefix / Path(configured_libdir).relative_to(configured_prefix)
    shared = bool(sysconfig.get_config_var("Py_ENABLE_SHARED"))
    return HostInterpreter(prefix, version, executable, stdlib, libdir, shared)


def file_digest(path: Path) -> str:
    """``sha256:…`` of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


@dataclass(frozen=True, slots=True)
class _Entry:
    kind: Literal["dir", "file", "symlink"]
    mode: int
    source: Path | None = None
    data: bytes | None = None
    target: str | None = None
    mtime: int = 0


class RootfsLayout:
    """The entries of a root filesystem, by absolute path in the image, and a deterministic tar writer."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def paths(self) -> frozenset[str]:
        """Every path in the layout (absolute, in the image)."""
        return frozenset(self._entries)

    def add_dir(self, path: str, mode: int = 0o755) -> None:
        """A directory (and its parents); an existing directory keeps the mode it has."""
        path = _image_path(path)
        if path == "/":
            return
        self.add_dir(posixpath.dirname(path))
        existing = self._entries.get(path)
        if existing is None:
            self._entries[path] = _Entry("dir", mode)
        elif existing.kind != "dir":
            raise _failed(f"{path} is both a directory and a {existing.kind} in the root filesystem")

    def add_file(self, path: str, source: Path, *, keep_mtime: bool = False) -> None:
        """A copy of the host file ``source`` (executable when the host file is); with ``keep_mtime``, with its
        host mtime (whole seconds) instead of the fixed one."""
        status = source.stat()
        mode = 0o755 if status.st_mode & 0o111 else 0o644
        mtime = int(status.st_mtime) if keep_mtime else TAR_MTIME
        self._put(path, _Entry("file", mode, source=source, mtime=mtime))

    def add_data(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """A file with the contents ``data``."""
        self._put(path, _Entry("file", mode, data=data))

    def add_symlink(self, path: str, target: str) -> None:
        """A symbolic link to ``target``, exactly as written."""
        self._put(path, _Entry("symlink", 0o777, target=target))

    def add_host_path(self, host_path: str) -> None:
        """The host file ``host_path`` at the same path, every symlink on the way to it kept as a symlink."""
        self._add_host_path(posixpath.normpath(host_path), _SYMLINK_DEPTH)

    def _add_host_path(self, host_path: str, depth: int) -> None:
        if depth == 0:
            raise _failed(f"too many levels of symbolic links resolving {host_path}")
        parts = PurePosixPath(host_path).parts[1:]
        current = "/"
        for index, part in enumerate(parts):
            candidate = posixpath.join(current, part)
            if os.path.islink(candidate):
                target = os.readlink(candidate)
                if candidate not in self._entries:
                    self.add_symlink(candidate, target)
                resolved = posixpath.normpath(posixpath.join(current, target))
                self._add_host_path(posixpath.join(resolved, *parts[index + 1 :]), depth - 1)
                return
            current = candidate
        if not os.path.isfile(current):
            raise _failed(f"{current} is not a regular file on this host")
        if current not in self._entries:
            self.add_file(current, Path(current))

    def _put(self, path: str, entry: _Entry) -> None:
        path = _image_path(path)
        self.add_dir(posixpath.dirname(path))
        existing = self._entries.get(path)
        if existing is not None and existing.kind == "dir":
            raise _failed(f"{path} is both a directory and a {entry.kind} in the root filesystem")
        self._entries[path] = entry

    def write_tar(self, destination: Path, *, exclude: Collection[str] = ()) -> str:
        """Write the layout (less the paths in ``exclude``) as an uncompressed tarball; returns its digest."""
        with tarfile.open(destination, "w", format=tarfile.PAX_FORMAT) as archive:
            for path in sorted(self._entries):
                if path in exclude:
                    continue
                entry = self._entries[path]
                info = tarfile.TarInfo(path.lstrip("/"))
                info.mtime, info.uid, info.gid, info.uname, info.gname = entry.mtime, 0, 0, "", ""
                info.mode = entry.mode
                if entry.kind == "dir":
                    info.type = tarfile.DIRTYPE
                    archive.addfile(info)
                elif entry.kind == "symlink":
                    info.type, info.linkname = tarfile.SYMTYPE, entry.target or ""
                    archive.addfile(info)
                elif entry.data is not None:
                    info.size = len(entry.data)
                    archive.addfile(info, io.BytesIO(entry.data))
                else:
                    assert entry.source is not None
                    with entry.source.open("rb") as stream:
                        info.size = os.fstat(stream.fileno()).st_size
                        archive.addfile(info, stream)
        return file_digest(destination)


def _current_byte_code(source: Path) -> Path | None:
    """The host's byte code of ``source`` (this interpreter's, not optimised) if it is current: the magic number
    of this interpreter, checked by timestamp, and the mtime and size it records are the source's."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    try:
        with cached.open("rb") as stream:
            header = stream.read(16)
        status = source.stat()
    except (OSError, NotImplementedError):
        return None
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER or int.from_bytes(header[4:8], "little") != 0:
        return None
    recorded_mtime = int.from_bytes(header[8:12], "little")
    recorded_size = int.from_bytes(header[12:16], "little")
    if recorded_mtime != int(status.st_mtime) & 0xFFFFFFFF or recorded_size != status.st_size & 0xFFFFFFFF:
        return None
    return cached


def _image_path(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"not an absolute image path: {path!r}")
    return posixpath.normpath(path)


def shared_libraries(binaries: Iterable[Path], *, strict: bool = False) -> list[str]:
    """The host paths of every shared library (the dynamic loader included) ``ldd`` names for ``binaries``.

    With ``strict``, a library ``ldd`` cannot find raises ``rootfs_failed``; otherwise it is left out.
    """
    ldd = shutil.which("ldd")
    if ldd is None:
        raise _failed("ldd is not on PATH: it is needed to find the shared libraries of the interpreter")
    files = [str(path) for path in binaries]
    found: set[str] = set()
    for start in range(0, len(files), _LDD_BATCH):
        batch = files[start : start + _LDD_BATCH]
        try:
            # ldd exits 1 when one of several files is not dynamic; what it prints for the others still counts.
            result = subprocess.run(  # noqa: S603 - ldd from PATH on the host's own files
                [ldd, *batch], capture_output=True, text=True, timeout=_LDD_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise _failed(f"ldd failed: {error}") from error
        for line in result.stdout.splitlines():
            line = line.strip()
            if "=> not found" in line and strict:
                raise _failed(f"ldd cannot find {line.split()[0]}, needed by {' '.join(batch)}")
            match = re.search(r"(?:=>\s*|^)(/\S+)\s+\(0x", line)
            if match is not None:
                found.add(posixpath.normpath(match.group(1)))
    return sorted(found)


def _stdlib_skip(path: Path, stdlib: Path) -> bool:
    relative = path.relative_to(stdlib).parts
    if not relative:
        return False
    if relative[0] in _STDLIB_LEFT_OUT or relative[0].startswith("config-"):
        return True
    return len(relative) > 1 and relative[-1] in _NESTED_TESTS and path.is_dir()


def base_rootfs(interpreter: HostInterpreter) -> RootfsLayout:
    """The root filesystem of ``clawstack/base`` for ``interpreter`` (see the module docstring)."""
    layout = RootfsLayout()
    python = f"python{interpreter.version}"
    layout.add_file(interpreter.image_path(interpreter.executable), interpreter.executable)
    for alias in ("python3", "python"):
        layout.add_symlink(posixpath.join(IMAGE_PREFIX, "bin", alias), python)
    own_libraries: set[str] = set()
    if interpreter.shared:
        for library in sorted(interpreter.libdir.glob("libpython3*.so*")):
            image_path = interpreter.image_path(library)
            if library.is_symlink():
                layout.add_symlink(image_path, os.readlink(library))
            else:
                layout.add_file(image_path, library)
            own_libraries.add(os.path.realpath(library))
    _add_stdlib(layout, interpreter)
    dynload = interpreter.stdlib / "lib-dynload"
    modules = sorted(p for p in dynload.glob("*.so") if not _DYNLOAD_LEFT_OUT.match(p.name))
    needed = shared_libraries([interpreter.executable], strict=True)
    needed += shared_libraries(modules)
    for needed_library in sorted(set(needed)):
        if os.path.realpath(needed_library) not in own_libraries:
            layout.add_host_path(needed_library)
    # glibc loads libgcc_s at run time to unwind a thread that exits through pthread_exit; ldd never names it.
    for needed_library in needed:
        if posixpath.basename(needed_library) == "libc.so.6":
            libgcc = posixpath.join(posixpath.dirname(os.path.realpath(needed_library)), "libgcc_s.so.1")
            if os.path.isfile(libgcc):
                layout.add_host_path(libgcc)
    if os.path.isfile(CA_BUNDLE):
        layout.add_host_path(CA_BUNDLE)
    layout.add_data("/etc/passwd", _PASSWD)
    layout.add_data("/etc/group", _GROUP)
    layout.add_data("/etc/nsswitch.conf", _NSSWITCH)
    layout.add_dir("/tmp", 0o1777)  # noqa: S108 - the image's own /tmp
    return layout


def _add_stdlib(layout: RootfsLayout, interpreter: HostInterpreter) -> None:
    stdlib = interpreter.stdlib
    layout.add_dir(interpreter.image_path(stdlib / "site-packages"))
    for directory, subdirectories, filenames in os.walk(stdlib):
        here = Path(directory)
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name != "__pycache__"
            and not (name == "site-packages" and here == stdlib)
            and not _stdlib_skip(here / name, stdlib)
        )
        layout.add_dir(interpreter.image_path(here))
        for name in sorted(filenames):
            path = here / name
            if name.endswith(".pyc") or _stdlib_skip(path, stdlib):
                continue
            if here.name == "lib-dynload" and _DYNLOAD_LEFT_OUT.match(name):
                continue
            if path.is_symlink():
                layout.add_symlink(interpreter.image_path(path), os.readlink(path))
            elif stat.S_ISREG(path.stat().st_mode):
                byte_code = _current_byte_code(path) if name.endswith(".py") else None
                layout.add_file(interpreter.image_path(path), path, keep_mtime=byte_code is not None)
                if byte_code is not None:
                    layout.add_file(interpreter.image_path(byte_code), byte_code)

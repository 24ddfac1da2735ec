"""The deliverables a task-home worker left for its requester: the files directly in ``<home>/deliverables/``.

A home is ``<homes_dir>/<installation>/<home>/``; the supervisor owns it, but the worker inside can change anything
in it at any time, so nothing here trusts a path:

- every path component is opened relative to its parent without following links (``O_NOFOLLOW``), and a file is
  opened ``O_NONBLOCK`` (a FIFO swapped in never blocks) and served only if ``fstat`` of that descriptor says it is
  a regular file with one link; its size, digest, mtime and bytes all come from that one descriptor;
- a deliverable's name matches :data:`NAME` (ASCII letters, digits, ``.``, ``_``, ``-`` and spaces, starting with a
  letter or digit, at most 128 characters) and its size is at most :data:`MAX_DELIVERABLE_BYTES`; subdirectories,
  links (symbolic, or a second hard link), FIFOs, sockets, hidden files and larger files are not served;
- a listing holds at most :data:`MAX_LISTED` files, sorted by name; ``truncated`` says there were more, or that the
  directory holds more than :data:`MAX_ENTRIES` entries (reading stops after one more); files are opened in name
  order until one more than the limit is served, and a servable file that cannot be read fails the whole listing;
- a fetch's ``sha256`` is the digest of exactly the bytes returned; with ``expected_sha256`` (the digest from the
  listing) a file whose bytes changed is refused rather than served.

A home without a ``deliverables/`` directory lists as empty. Nothing is locked: this works whether or not a run
holds the home. Messages name no path.

Errors::

    DeliverableError (ClawError)  code, status
     ├── deliverable_unknown 404      no such servable file (bad name, hidden, link, directory, FIFO, socket)
     ├── deliverable_too_large 413    a servable name whose file is (or grows) larger than the limit
     ├── deliverable_changed 409      the file's bytes no longer have the expected digest; no content is returned
     ├── home_unknown 404             the home does not exist
     └── deliverables_unreadable 503  the directory or a servable file could not be read (permissions, I/O, a
                                      directory on the way replaced by a link, too many open files)
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from clawstack.common.errors import ClawError
from clawstack.runs.backends.base import INSTALLATION
from clawstack.runs.homes import HOME_ID

MAX_DELIVERABLE_BYTES: Final = 524288
MAX_LISTED: Final = 200
MAX_ENTRIES: Final = 4096
NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,127}")

_STATUS: Final = {
    "deliverable_unknown": 404,
    "deliverable_too_large": 413,
    "deliverable_changed": 409,
    "home_unknown": 404,
    "deliverables_unreadable": 503,
}

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Opening the last component fails with these when it is no longer a regular file: a link (ELOOP), a socket (ENXIO).
_NOT_SERVED: Final = (errno.ENOENT, errno.ELOOP, errno.ENXIO)
_EPOCH: Final = datetime(1970, 1, 1)


class DeliverableError(ClawError):
    """A refusal to list or fetch deliverables; ``status`` follows from the code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, code=code)
        self.status = _STATUS.get(code, 500)


@dataclass(frozen=True, slots=True)
class Deliverable:
    """One listed file."""

    name: str
    bytes: int
    sha256: str
    modified_at: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256, "modified_at": self.modified_at}


@dataclass(frozen=True, slots=True)
class Listing:
    """The servable files of a home, sorted by name, and whether there were more."""

    deliverables: tuple[Deliverable, ...]
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {"deliverables": [d.to_json() for d in self.deliverables], "truncated": self.truncated}


def _unreadable() -> DeliverableError:
    return DeliverableError("deliverables_unreadable", "the deliverables could not be read")


def _unknown() -> DeliverableError:
    return DeliverableError("deliverable_unknown", "no such deliverable")


def _too_large() -> DeliverableError:
    return DeliverableError("deliverable_too_large", f"the deliverable is larger than {MAX_DELIVERABLE_BYTES} bytes")


@contextlib.contextmanager
def _deliverables_fd(homes_dir: Path, installation: str, home: str) -> Iterator[int | None]:
    """The open ``deliverables`` directory of a home, or ``None`` when the home has none."""
    if not isinstance(installation, str) or not INSTALLATION.fullmatch(installation):
        raise ValueError("invalid installation id")
    if not isinstance(home, str) or not HOME_ID.fullmatch(home):
        raise ValueError("invalid home id")
    opened: list[int] = []
    try:
        try:
            opened.append(os.open(homes_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in (installation, home):
                opened.append(os.open(part, _DIR_FLAGS, dir_fd=opened[-1]))
        except FileNotFoundError:
            raise DeliverableError("home_unknown", "no such home") from None
        except OSError:
            raise _unreadable() from None
        try:
            opened.append(os.open("deliverables", _DIR_FLAGS, dir_fd=opened[-1]))
            found = True
        except FileNotFoundError:
            found = False
        except OSError:
            raise _unreadable() from None
        yield opened[-1] if found else None
    finally:
        for fd in reversed(opened):
            os.close(fd)


def _read(dir_fd: int, name: str) -> tuple[bytes, os.stat_result]:
    """The bytes of a servable file and the ``fstat`` of the descriptor they were read from."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_SERVED:
            raise _unknown() from None
        raise _unreadable() from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise _unknown()
        if st.st_size > MAX_DELIVERABLE_BYTES:
            raise _too_large()
        chunks: list[bytes] = []
        left = MAX_DELIVERABLE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError:
        raise _unreadable() from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_DELIVERABLE_BYTES:
        raise _too_large()
    return data, st


def _utc(mtime_ns: int) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ``, whole seconds, clamped to the years 1 to 9999."""
    try:
        moment = _EPOCH + timedelta(seconds=mtime_ns // 1_000_000_000)
    except OverflowError:
        moment = datetime.max if mtime_ns > 0 else datetime.min
    return moment.replace(microsecond=0).isoformat() + "Z"


def _candidates(dir_fd: int) -> tuple[list[str], bool]:
    """The names that look servable by ``lstat``, sorted, and whether the directory has too many entries."""
    names: list[str] = []
    entries = 0
    try:
        with os.scandir(dir_fd) as it:
            for entry in it:
                entries += 1
                if entries > MAX_ENTRIES + 1:
                    break
                if not NAME.fullmatch(entry.name):
                    continue
                try:
                    st = os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_size <= MAX_DELIVERABLE_BYTES:
                    names.append(entry.name)
    except OSError:
        raise _unreadable() from None
    return sorted(names), entries > MAX_ENTRIES  # names are ASCII: code point order is byte order


def list_deliverables(homes_dir: Path, installation: str, home: str) -> Listing:
    """The servable files directly in the home's ``deliverables/``; see the module docstring."""
    with _deliverables_fd(homes_dir, installation, home) as dir_fd:
        if dir_fd is None:
            return Listing((), False)
        names, truncated = _candidates(dir_fd)
        listed: list[Deliverable] = []
        for name in names:
            try:
                data, st = _read(dir_fd, name)
            except DeliverableError as exc:
                if exc.code == "deliverables_unreadable":
                    raise
                continue  # gone, replaced or grown since it was listed: no longer servable
            if len(listed) == MAX_LISTED:
                truncated = True
                break
            listed.append(Deliverable(name, len(data), hashlib.sha256(data).hexdigest(), _utc(st.st_mtime_ns)))
    return Listing(tuple(listed), truncated)


def fetch_deliverable(
    homes_dir: Path, installation: str, home: str, name: str, *, expected_sha256: str | None = None
) -> dict[str, Any]:
    """One servable file's bytes, ``{"name", "bytes", "sha256", "content_base64"}``; see the module docstring."""
    with _deliverables_fd(homes_dir, installation, home) as dir_fd:
        if dir_fd is None or not isinstance(name, str) or not NAME.fullmatch(name):
            raise _unknown()
        data, _ = _read(dir_fd, name)
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and expected_sha256.lower() != digest:
        raise DeliverableError("deliverable_changed", "the deliverable changed since it was listed")
    return {"name": name, "bytes": len(data), "sha256": digest, "content_base64": base64.b64encode(data).decode()}


__all__ = [
    "MAX_DELIVERABLE_BYTES",
    "MAX_ENTRIES",
    "MAX_LISTED",
    "NAME",
    "Deliverable",
    "DeliverableError",
    "Listing",
    "fetch_deliverable",
    "list_deliverables",
]

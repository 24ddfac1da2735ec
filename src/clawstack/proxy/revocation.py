"""The durable revocation fence: the ledger in ``CLAW_REVOCATION_DIR``.

A revoked identity must stay refused whatever else is lost: the identity store, the process, the machine's page
cache. So a revocation is acknowledged only after one line naming the identity is appended to
``revocations.log`` and the file is fsynced, and the proxy refuses any identity found in that file when it
starts. Nothing else in the proxy decides whether an identity is revoked after a restart.

The file is a plain append-only log, one record per line, about 80 bytes each::

    v1 <identity_id> <revoked_at unix seconds> <expires_at unix seconds or ->\\n

Appending one short line and fsyncing it is the cheapest durable write there is, and the format can be read
(and audited) with ``grep``. A crash mid-append leaves a final line without its newline; that line was never
acknowledged, so it is ignored on load and truncated away before the next append. Any other malformed line
means the file is not what we wrote, and loading refuses it rather than guess which revocations it held.

The file is bounded (16 MiB by default). Every identity reserves room for its future record when it is created
(:meth:`RevocationLedger.reserve`), so a revocation never waits for room: at the bound, records of identities
that have already expired are compacted away (an expired identity is refused anyway), and when that frees
nothing, new identities are refused with :class:`~clawstack.proxy.errors.CapacityError` instead. A record with
no expiry is never dropped. Reservations live in memory: after a restart the proxy re-reserves the identities
that are still live.

One process owns the directory at a time: the ledger holds an exclusive ``flock`` on ``lock`` while it is open,
so a second proxy pointed at the same directory is refused instead of interleaving appends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Final

from clawstack.common.clock import Clock, SystemClock
from clawstack.common.files import fsync_dir, write_private
from clawstack.proxy.errors import CapacityError, RevocationError

LOG_NAME: Final = "revocations.log"
LOCK_NAME: Final = "lock"
DEFAULT_MAX_BYTES: Final = 16 * 1024 * 1024
DEFAULT_COMPACTION_GRACE_S: Final = 24 * 3600.0

_ID_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_ID_RE: Final = re.compile(_ID_PATTERN)
_SECONDS_PATTERN: Final = rb"0|[1-9][0-9]{0,11}"
_LINE_RE: Final = re.compile(
    rb"v1 (" + _ID_PATTERN.encode() + rb") (" + _SECONDS_PATTERN + rb") (" + _SECONDS_PATTERN + rb"|-)\n"
)
_MAX_SECONDS: Final = 253402300799  # 9999-12-31T23:59:59Z, the last second a datetime can hold
# The longest line a record can be: a torn tail longer than this cannot be a crashed append.
MAX_LINE_BYTES: Final = len(b"v1 ") + 128 + 1 + 12 + 1 + 12 + 1
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_READ_CHUNK: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class RevocationRecord:
    """One durable revocation. Times have the file's one-second precision.

    ``revoked_at`` is rounded down and ``expires_at`` (the identity's own expiry, ``None`` for never) is rounded
    up, so rounding never lets a record be compacted before its identity has expired.
    """

    identity_id: str
    revoked_at: datetime
    expires_at: datetime | None


def _check_identity_id(identity_id: str) -> None:
    if not isinstance(identity_id, str) or _ID_RE.fullmatch(identity_id) is None:
        raise ValueError("identity id must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _check_aware(value: datetime | None) -> None:
    if value is not None and value.tzinfo is None:
        raise ValueError("expires_at must be timezone-aware")


def _to_seconds(value: datetime, *, round_up: bool) -> int:
    delta = value - _EPOCH
    seconds = delta.days * 86400 + delta.seconds
    if round_up and delta.microseconds:
        seconds += 1
    return min(max(seconds, 0), _MAX_SECONDS)


def _from_seconds(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _encode(record: RevocationRecord) -> bytes:
    revoked = _to_seconds(record.revoked_at, round_up=False)
    expires = "-" if record.expires_at is None else str(_to_seconds(record.expires_at, round_up=True))
    return f"v1 {record.identity_id} {revoked} {expires}\n".encode("ascii")


def _merge(first: RevocationRecord, second: RevocationRecord) -> RevocationRecord:
    """Two lines for one identity (never written by us, but harmless): keep the one that lasts longest."""
    if first.expires_at is None or second.expires_at is None:
        expires_at = None
    else:
        expires_at = max(first.expires_at, second.expires_at)
    return RevocationRecord(first.identity_id, min(first.revoked_at, second.revoked_at), expires_at)


def _parse_line(line: bytes, line_no: int) -> RevocationRecord:
    match = _LINE_RE.fullmatch(line)
    if match is not None:
        revoked_s = int(match.group(2))
        expires_s = None if match.group(3) == b"-" else int(match.group(3))
        if revoked_s <= _MAX_SECONDS and (expires_s is None or expires_s <= _MAX_SECONDS):
            return RevocationRecord(
                identity_id=match.group(1).decode("ascii"),
                revoked_at=_from_seconds(revoked_s),
                expires_at=None if expires_s is None else _from_seconds(expires_s),
            )
    raise RevocationError(f"revocation ledger line {line_no} is not a valid record", code="revocation_ledger_corrupt")


@dataclass(slots=True)
class _Scan:
    records: dict[str, RevocationRecord]
    good_bytes: int  # length of the complete lines; anything after them is a torn append
    torn: bool


def _scan(fd: int) -> _Scan:
    """Read every record in the file open at ``fd`` (from offset 0, without moving the fd's offset)."""
    records: dict[str, RevocationRecord] = {}
    pending = b""
    position = 0
    good = 0
    line_no = 0
    while True:
        chunk = os.pread(fd, _READ_CHUNK, position)
        if not chunk:
            break
        position += len(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            line_no += 1
            record = _parse_line(line + b"\n", line_no)
            previous = records.get(record.identity_id)
            records[record.identity_id] = record if previous is None else _merge(previous, record)
            good += len(line) + 1
        if len(pending) > MAX_LINE_BYTES:
            raise RevocationError(
                f"revocation ledger line {line_no + 1} is longer than any record", code="revocation_ledger_corrupt"
            )
    return _Scan(records=records, good_bytes=good, torn=bool(pending))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unwritable(what: str, exc: OSError) -> RevocationError:
    reason = errno.errorcode.get(exc.errno or 0, "error")
    return RevocationError(f"revocation directory: cannot {what} ({reason})", code="revocation_unwritable")


class RevocationLedger:
    """The revocation records in one directory, loaded in memory and appended durably.

    Use :meth:`open` (or ``with``) before anything else. One process owns the directory (a second is refused by
    the directory lock). Every method that touches the disk blocks, so callers on an event loop may run
    :meth:`record` in a worker thread; writes are serialised by an internal lock, and the queries
    (:meth:`is_revoked`, :meth:`get`) are single dictionary lookups that never wait for it.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Clock | None = None,
        compaction_grace_s: float = DEFAULT_COMPACTION_GRACE_S,
    ) -> None:
        if max_bytes < MAX_LINE_BYTES:
            raise ValueError(f"max_bytes must be at least {MAX_LINE_BYTES}")
        self._directory = Path(directory)
        self._log_path = self._directory / LOG_NAME
        self._max_bytes = max_bytes
        self._grace = timedelta(seconds=compaction_grace_s)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._lock_fd: int | None = None
        self._log_fd: int | None = None
        self._records: dict[str, RevocationRecord] = {}
        self._reservations: dict[str, int] = {}
        self._reserved = 0
        self._used = 0  # bytes of acknowledged lines; the file may hold a torn append after them
        self._torn = False  # the file may hold bytes after ``_used`` that must be truncated before appending
        self._earliest_expiry: datetime | None = None
        # Reentrant because reserve() compacts; record() is typically run in a worker thread (asyncio.to_thread)
        # while reserve() runs on the event loop, so the file and the counters need one owner at a time.
        self._mutex = threading.RLock()

    # ------------------------------------------------------------------------------------------- lifecycle

    def open(self) -> None:
        """Take the directory (creating it 0700 if missing) and load every record. Idempotent.

        Raises :class:`RevocationError` with code ``revocation_dir_unsafe`` (a symlink, not a directory, owned
        by someone else, group- or world-writable), ``revocation_dir_locked`` (another process has it open),
        ``revocation_ledger_corrupt`` or ``revocation_unwritable``.
        """
        with self._mutex:
            if self._lock_fd is not None:
                return
            self._prepare_directory()
            self._lock_fd = self._acquire_lock()
            try:
                self._open_log()
            finally:
                if self._log_fd is None:
                    # Release the lock when loading failed, so a corrected retry (or another process) can take it.
                    self.close()

    def close(self) -> None:
        """Close the file and release the directory lock. Idempotent; the loaded records stay readable."""
        with self._mutex:
            for fd in (self._log_fd, self._lock_fd):
                if fd is not None:
                    os.close(fd)
            self._log_fd = None
            self._lock_fd = None

    def __enter__(self) -> RevocationLedger:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _prepare_directory(self) -> None:
        path = self._directory
        missing: list[Path] = []
        probe = path
        while not os.path.lexists(probe) and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        try:
            for created in reversed(missing):
                try:
                    os.mkdir(created, 0o700 if created == path else 0o777)
                except FileExistsError:
                    continue
                if created == path:
                    os.chmod(created, 0o700)  # exact, whatever the umask
                fsync_dir(created.parent)  # the new directory entry must survive a crash with the records
            st = os.lstat(path)
        except OSError as exc:
            raise _unwritable("create the directory", exc) from exc
        problem = None
        if stat.S_ISLNK(st.st_mode):
            problem = "is a symlink"
        elif not stat.S_ISDIR(st.st_mode):
            problem = "is not a directory"
        elif st.st_uid != os.geteuid():
            problem = f"is owned by uid {st.st_uid}, not {os.geteuid()}"
        elif stat.S_IMODE(st.st_mode) & (stat.S_IWGRP | stat.S_IWOTH):
            problem = f"has mode {stat.S_IMODE(st.st_mode):04o}; it must not be group- or world-writable"
        if problem is not None:
            raise RevocationError(f"revocation directory {problem}", code="revocation_dir_unsafe")

    def _acquire_lock(self) -> int:
        try:
            fd = os.open(self._directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RevocationError("revocation lock file is a symlink", code="revocation_dir_unsafe") from exc
            raise _unwritable("create the lock file", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RevocationError(
                    "revocation directory is in use by another process", code="revocation_dir_locked"
                ) from exc
            raise _unwritable("lock the directory", exc) from exc
        return fd

    def _open_log(self) -> None:
        """Open the log for appending (creating it if missing), make it and its name durable, and load it.

        The file's records are merged into memory, never replacing it: memory only ever holds records that were
        acknowledged, so a record missing from the file after a rewrite was an expired one.
        """
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self._log_path, flags)
            except FileNotFoundError:
                fd = os.open(self._log_path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RevocationError("revocation ledger file is a symlink", code="revocation_dir_unsafe") from exc
            raise _unwritable("open the ledger file", exc) from exc
        loaded = False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise RevocationError(
                    "revocation ledger file is not a regular file owned by us", code="revocation_dir_unsafe"
                )
            if stat.S_IMODE(st.st_mode) != 0o600:
                os.fchmod(fd, 0o600)
            # Always, not only on creation: an earlier open may have created the file and failed before this.
            os.fsync(fd)
            fsync_dir(self._directory)
            scan = _scan(fd)
            loaded = True
        except OSError as exc:
            raise _unwritable("read the ledger file", exc) from exc
        finally:
            if not loaded:
                os.close(fd)
        for identity_id, record in scan.records.items():
            known = self._records.get(identity_id)
            self._records[identity_id] = record if known is None else _merge(known, record)
        self._used = scan.good_bytes
        self._torn = scan.torn
        self._log_fd = fd
        self._earliest_expiry = self._compute_earliest_expiry()

    def _compute_earliest_expiry(self) -> datetime | None:
        expiries = [r.expires_at for r in self._records.values() if r.expires_at is not None]
        return min(expiries) if expiries else None

    def _require_open(self) -> int:
        if self._lock_fd is None:
            raise RevocationError("revocation ledger is not open", code="revocation_unwritable")
        if self._log_fd is None:
            self._open_log()  # a compaction replaced the file and could not reopen it; try again now
        assert self._log_fd is not None
        return self._log_fd

    # --------------------------------------------------------------------------------------------- queries

    def is_revoked(self, identity_id: str) -> bool:
        """Whether ``identity_id`` has a durable revocation record (in memory; never touches the disk)."""
        return identity_id in self._records

    def get(self, identity_id: str) -> RevocationRecord | None:
        """The identity's revocation record, or ``None``."""
        return self._records.get(identity_id)

    def read_durable(self, identity_id: str) -> RevocationRecord | None:
        """Read the identity's record from the file on disk, afresh (a new open and a full scan).

        This is the self-test's proof that a revocation reached the disk, independent of the in-memory state.
        Raises :class:`RevocationError` (``revocation_unreadable`` or ``revocation_ledger_corrupt``).
        """
        _check_identity_id(identity_id)
        try:
            fd = os.open(self._log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RevocationError("cannot open the revocation ledger file", code="revocation_unreadable") from exc
        try:
            return _scan(fd).records.get(identity_id)
        except OSError as exc:
            raise RevocationError("cannot read the revocation ledger file", code="revocation_unreadable") from exc
        finally:
            os.close(fd)

    @property
    def used_bytes(self) -> int:
        """Bytes of records in the file."""
        return self._used

    @property
    def record_count(self) -> int:
        """Identities with a revocation record."""
        return len(self._records)

    @property
    def reserved_bytes(self) -> int:
        """Bytes promised to identities that may still be revoked."""
        return self._reserved

    @property
    def max_bytes(self) -> int:
        """The bound on records plus reservations."""
        return self._max_bytes

    # ------------------------------------------------------------------------------------------------ writes

    def record(self, identity_id: str, *, expires_at: datetime | None) -> tuple[RevocationRecord, bool]:
        """Record the revocation of ``identity_id`` durably; return ``(record, newly_recorded)``.

        The line is appended and the file fsynced before this returns. Idempotent: an identity already recorded
        returns its existing record and ``False`` without writing. On any I/O failure this raises
        :class:`RevocationError` (``revocation_unwritable``) and the identity is *not* recorded, so the caller
        must keep refusing it on its own and must not acknowledge the revocation. A revocation is never refused
        for room: it uses the identity's reservation, which it consumes, and an identity that reserved none is
        recorded even past the bound (the bound is kept by refusing new identities, never revocations).
        """
        with self._mutex:
            _check_identity_id(identity_id)
            _check_aware(expires_at)
            existing = self._records.get(identity_id)
            if existing is not None:
                return existing, False
            fd = self._require_open()
            record = RevocationRecord(
                identity_id=identity_id,
                revoked_at=_from_seconds(_to_seconds(self._clock.now(), round_up=False)),
                expires_at=None if expires_at is None else _from_seconds(_to_seconds(expires_at, round_up=True)),
            )
            line = _encode(record)
            try:
                if self._torn:
                    os.ftruncate(fd, self._used)
                self._torn = True  # until the fsync succeeds, whatever follows ``_used`` is not acknowledged
                _write_all(fd, line)
                os.fsync(fd)
            except OSError as exc:
                # Take the unacknowledged line back out at once, so that no reader (the self-test's durability
                # proof included) takes it for a revocation; if even that fails, the next append truncates first.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self._used)
                raise _unwritable("record the revocation", exc) from exc
            self._torn = False
            self._used += len(line)
            self._records[identity_id] = record
            self._release(identity_id)
            if record.expires_at is not None and (
                self._earliest_expiry is None or record.expires_at < self._earliest_expiry
            ):
                self._earliest_expiry = record.expires_at
            return record, True

    def reserve(self, identity_id: str, *, expires_at: datetime | None) -> None:
        """Promise room for the future record of a new identity, or refuse the identity.

        When the records plus every reservation would pass ``max_bytes``, expired records are compacted first;
        if there is still no room this raises :class:`CapacityError` (``revocation_capacity``). Idempotent per
        identity. An identity already revoked needs no room.
        """
        with self._mutex:
            _check_identity_id(identity_id)
            _check_aware(expires_at)
            self._require_open()
            if identity_id in self._records:
                return
            # The record's revocation time is not known yet; twelve digits hold any time a datetime can.
            expires = "-" if expires_at is None else str(_to_seconds(expires_at, round_up=True))
            size = len(f"v1 {identity_id} {'0' * 12} {expires}\n")
            held = self._reservations.get(identity_id, 0)
            if size <= held:
                return
            extra = size - held
            if self._used + self._reserved + extra > self._max_bytes:
                self.compact()
                if self._used + self._reserved + extra > self._max_bytes:
                    raise CapacityError(
                        f"revocation ledger is full: {self._used} bytes of records and {self._reserved} bytes reserved"
                        f" of {self._max_bytes}; no expired record is left to compact",
                        code="revocation_capacity",
                    )
            self._reservations[identity_id] = size
            self._reserved += extra

    def release(self, identity_id: str) -> None:
        """Drop the identity's reservation (it expired and will never be revoked). Idempotent."""
        with self._mutex:
            self._release(identity_id)

    def _release(self, identity_id: str) -> None:
        self._reserved -= self._reservations.pop(identity_id, 0)

    def compact(self) -> int:
        """Rewrite the file without the records of identities that have already expired; return bytes freed.

        A record is dropped only when its ``expires_at`` is set and more than the compaction grace (a day by
        default) before the clock's now: such an identity is refused for having expired, so its revocation no
        longer matters, and the grace keeps that true if the wall clock steps back. A record without expiry is
        never dropped. The rewrite is atomic and durable (:func:`~clawstack.common.files.write_private`); on failure
        the old file stays and :class:`RevocationError` is raised.
        """
        with self._mutex:
            self._require_open()
            now = self._clock.now() - self._grace
            if self._earliest_expiry is None or self._earliest_expiry >= now:
                return 0
            keep = {
                identity_id: record
                for identity_id, record in self._records.items()
                if record.expires_at is None or record.expires_at >= now
            }
            data = b"".join(_encode(record) for record in keep.values())
            before = self._used
            try:
                write_private(self._log_path, data)
            except OSError as exc:
                self._reopen_log()
                raise _unwritable("compact the ledger", exc) from exc
            self._records = keep
            self._used = len(data)
            self._torn = False
            self._reopen_log()
            return before - self._used

    def _reopen_log(self) -> None:
        """Follow the file to its new inode after a rewrite (attempted or done)."""
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None
        try:
            self._open_log()
        except RevocationError:
            # The records are safe on disk either way; the next write retries the open and reports its failure.
            self._earliest_expiry = self._compute_earliest_expiry()


__all__ = [
    "DEFAULT_MAX_BYTES",
    "LOCK_NAME",
    "LOG_NAME",
    "MAX_LINE_BYTES",
    "RevocationLedger",
    "RevocationRecord",
]

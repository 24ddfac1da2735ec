"""The opt-in trace journal: one append-only JSON-lines file per capture epoch, and coverage seals.

An operator who enables the journal wants a verifiable trace of every run: one record per request, and, when a
run's identity is revoked, a *coverage seal* that accounts for every record the identity produced (a count and
a digest), so an auditor can tell a complete trace from one with records missing.

**Capture epochs.** Each :meth:`TraceJournal.start` begins a new epoch, one more than any epoch seen in the
directory, and a new file ``journal-<epoch>.jsonl``; then it writes ``epoch`` (``{"epoch", "started_at"}``)
atomically. An orchestrator reads that file (:func:`read_capture_epoch`, fresh on every call) before it launches
a run and pins the value. A seal carries the epoch it was written in: a proxy restart during a run starts a new
epoch, the run's earlier records are in the previous file, and the seal's epoch no longer matches the pinned one.
That mismatch, not the epoch file (which can outlive a stopped proxy), is the check.

**Records.** The journal adds ``epoch``, ``seq`` (1, 2, … within the epoch; the ``epoch_start`` line is 0),
``ts`` and, for a record attributed to an identity, ``identity``; the caller supplies everything else. The
journal never adds request or response content: callers pass digests unless content capture is enabled. A
record's digest is ``"sha256:" + hex`` of its line's bytes without the newline, so anyone can recompute it
from the file.

**Seals.** An identity's coverage digest is ``"sha256:" + hex(sha256(d1 + d2 + …))`` where ``d1, d2, …`` are
its records' digest strings (ASCII, ``"sha256:<hex>"``) in file order; with no records it is the digest of no
bytes. A seal line is ``{"type": "coverage_seal", "identity", "records", "digest"}`` and is not itself counted.

**Durability.** A record is one ``write(2)`` and no ``fsync``: a trace must not cost a disk flush per request.
A seal is fsynced before :meth:`TraceJournal.seal` returns, which makes every earlier line durable with it.
After any write fails the journal refuses all further writes (:class:`~clawstack.proxy.errors.JournalError`),
because a later seal would otherwise vouch for a file with a gap; starting it again begins a new epoch.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from clawstack.common.clock import Clock, SystemClock, format_timestamp, parse_timestamp
from clawstack.common.digest import DIGEST_PREFIX, sha256_digest
from clawstack.common.files import UnsafePathError, ensure_private_dir, write_private
from clawstack.common.strictjson import StrictJSONError, loads
from clawstack.proxy.errors import JournalError

EPOCH_FILE: Final = "epoch"
JOURNAL_FIELDS: Final = frozenset({"epoch", "seq", "ts", "identity"})
"""Fields the journal sets on every record; a caller's record may not carry them."""
JOURNAL_TYPES: Final = frozenset({"epoch_start", "coverage_seal"})
"""Record types only the journal writes."""

_JOURNAL_NAME_RE: Final = re.compile(r"journal-([1-9][0-9]{0,15})\.jsonl")
_MAX_EPOCH_FILE_BYTES: Final = 4096


def journal_path(directory: Path, epoch: int) -> Path:
    """The journal file of ``epoch`` in ``directory``."""
    return Path(directory) / f"journal-{epoch}.jsonl"


def read_capture_epoch(directory: Path) -> int | None:
    """The capture epoch in ``<directory>/epoch``, read afresh; ``None`` when there is no usable epoch file.

    Unusable means missing, unreadable, a symlink or not a regular file, larger than 4 KiB, not strict JSON,
    not an object with a positive integer ``epoch`` and an RFC 3339 ``started_at``. Never raises.
    """
    try:
        fd = os.open(Path(directory) / EPOCH_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) <= _MAX_EPOCH_FILE_BYTES:
            chunk = os.read(fd, _MAX_EPOCH_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = loads(data, max_bytes=_MAX_EPOCH_FILE_BYTES)
    except StrictJSONError:
        return None
    if not isinstance(value, dict):
        return None
    epoch = value.get("epoch")
    started_at = value.get("started_at")
    if type(epoch) is not int or epoch < 1 or not isinstance(started_at, str):
        return None
    try:
        parse_timestamp(started_at)
    except ValueError:
        return None
    return epoch


def _highest_journal_epoch(directory: Path) -> int:
    highest = 0
    for name in os.listdir(directory):
        match = _JOURNAL_NAME_RE.fullmatch(name)
        if match is not None:
            highest = max(highest, int(match.group(1)))
    return highest


def _encode(value: Mapping[str, Any]) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        # The original error may quote the offending value, which may be content; keep only its kind.
        raise ValueError(f"journal record is not representable as JSON ({type(exc).__name__})") from None


def _io_error(what: str, exc: OSError) -> JournalError:
    reason = errno.errorcode.get(exc.errno or 0, "error")
    return JournalError(f"trace journal: cannot {what} ({reason})", code="journal_unwritable")


@dataclass(frozen=True, slots=True)
class CoverageSeal:
    """What a seal vouches for: ``records`` lines attributed to ``identity_id`` in ``epoch``, and their digest.

    ``digest`` is ``"sha256:" + hex`` of the concatenated record digest strings, in file order.
    """

    identity_id: str
    epoch: int
    records: int
    digest: str


class _Coverage:
    __slots__ = ("count", "hasher")

    def __init__(self) -> None:
        self.count = 0
        self.hasher = hashlib.sha256()


class TraceJournal:
    """The journal of one proxy process: one capture epoch from :meth:`start` to :meth:`close`.

    :meth:`append` never waits for the disk to flush (no fsync); :meth:`start`, :meth:`seal` and :meth:`close`
    do, so callers on an event loop may run them in a worker thread. An internal lock keeps each line whole and
    the sequence numbers and coverage in file order when they do.
    """

    def __init__(self, directory: Path, *, capture_content: bool = False, clock: Clock | None = None) -> None:
        self._directory = Path(directory)
        self._capture_content = capture_content
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._fd: int | None = None
        self._epoch: int | None = None
        self._seq = 0
        self._size = 0  # bytes of complete lines in the current file
        self._failed = False
        self._coverage: dict[str, _Coverage] = {}
        self._mutex = threading.Lock()

    @property
    def epoch(self) -> int:
        """The current capture epoch. Raises :class:`JournalError` (``journal_not_started``) before :meth:`start`."""
        if self._epoch is None:
            raise JournalError("trace journal is not started", code="journal_not_started")
        return self._epoch

    @property
    def capture_content(self) -> bool:
        """Whether callers may put request and response content in records (off unless explicitly enabled)."""
        return self._capture_content

    def start(self) -> int:
        """Begin a new capture epoch and return it. Idempotent while started.

        Creates the directory 0700 if needed, opens a new ``journal-<epoch>.jsonl`` (0600), writes and fsyncs an
        ``epoch_start`` line, then replaces the epoch file atomically. Raises :class:`JournalError`
        (``journal_dir_unsafe`` or ``journal_unwritable``).
        """
        with self._mutex:
            if self._fd is not None and self._epoch is not None:
                return self._epoch
            try:
                ensure_private_dir(self._directory)
                previous = max(read_capture_epoch(self._directory) or 0, _highest_journal_epoch(self._directory))
            except UnsafePathError as exc:
                raise JournalError(f"trace journal directory is unsafe: {exc.code}", code="journal_dir_unsafe") from exc
            except OSError as exc:
                raise _io_error("prepare the directory", exc) from exc
            epoch = previous + 1
            started_at = format_timestamp(self._clock.now())
            first = _encode(
                {
                    "type": "epoch_start",
                    "epoch": epoch,
                    "seq": 0,
                    "ts": started_at,
                    "capture_content": self._capture_content,
                }
            )
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(journal_path(self._directory, epoch), flags, 0o600)
            except OSError as exc:
                raise _io_error("create the journal file", exc) from exc
            try:
                os.fchmod(fd, 0o600)  # exact, whatever the umask
                _write_all(fd, first + b"\n")
                os.fsync(fd)
                # write_private also fsyncs the directory, which makes the new journal file's entry durable too.
                write_private(self._directory / EPOCH_FILE, _encode({"epoch": epoch, "started_at": started_at}))
            except OSError as exc:
                os.close(fd)
                raise _io_error("start the capture epoch", exc) from exc
            self._fd = fd
            self._epoch = epoch
            self._seq = 0
            self._size = len(first) + 1
            self._failed = False
            self._coverage = {}
            return epoch

    def append(self, record: Mapping[str, Any], *, identity_id: str | None) -> str:
        """Write one record and return its digest; attribute it to ``identity_id`` when given.

        The journal adds ``epoch``, ``seq``, ``ts`` (and ``identity``) in front of the caller's fields, which may
        not use those names or a journal record type (``ValueError``). The line is written with one ``write``
        and not fsynced. Raises :class:`JournalError` when the journal is not started or cannot be written.
        """
        with self._mutex:
            fd = self._require_started()
            clashing = JOURNAL_FIELDS.intersection(record.keys())
            if clashing:
                raise ValueError(f"journal record may not set {sorted(clashing)}; the journal sets them")
            record_type = record.get("type")
            if isinstance(record_type, str) and record_type in JOURNAL_TYPES:
                raise ValueError("journal record type is reserved for the journal itself")
            seq = self._seq + 1
            fields: dict[str, Any] = {"epoch": self._epoch, "seq": seq, "ts": format_timestamp(self._clock.now())}
            if identity_id is not None:
                fields["identity"] = identity_id
            fields.update(record)
            line = _encode(fields)
            self._write(fd, line)
            self._seq = seq
            digest = sha256_digest(line)
            if identity_id is not None:
                coverage = self._coverage.get(identity_id)
                if coverage is None:
                    coverage = self._coverage[identity_id] = _Coverage()
                coverage.count += 1
                coverage.hasher.update(digest.encode("ascii"))
            return digest

    def coverage(self, identity_id: str) -> tuple[int, str]:
        """``(records, digest)`` for the identity in the current epoch so far (``(0, digest of nothing)``)."""
        coverage = self._coverage.get(identity_id)
        if coverage is None:
            return 0, sha256_digest(b"")
        return coverage.count, DIGEST_PREFIX + coverage.hasher.copy().hexdigest()

    def seal(self, identity_id: str) -> CoverageSeal:
        """Write the identity's coverage seal and fsync the journal before returning it.

        Sealing again writes another seal with the same counts, plus any records appended in between.
        Raises :class:`JournalError` when the journal is not started or cannot be written.
        """
        with self._mutex:
            fd = self._require_started()
            assert self._epoch is not None
            records, digest = self.coverage(identity_id)
            seq = self._seq + 1
            line = _encode(
                {
                    "epoch": self._epoch,
                    "seq": seq,
                    "ts": format_timestamp(self._clock.now()),
                    "identity": identity_id,
                    "type": "coverage_seal",
                    "records": records,
                    "digest": digest,
                }
            )
            self._write(fd, line)
            self._seq = seq
            try:
                os.fsync(fd)
            except OSError as exc:
                self._fail()
                raise _io_error("make the coverage seal durable", exc) from exc
            return CoverageSeal(identity_id=identity_id, epoch=self._epoch, records=records, digest=digest)

    def close(self) -> None:
        """Fsync and close the journal file. Idempotent. The epoch stays readable; appends are refused."""
        with self._mutex:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            try:
                os.fsync(fd)
            except OSError as exc:
                raise _io_error("make the journal durable at close", exc) from exc
            finally:
                os.close(fd)

    def _require_started(self) -> int:
        if self._failed:
            raise JournalError(
                "trace journal stopped after a write failure; start it again to begin a new capture epoch",
                code="journal_unwritable",
            )
        if self._fd is None:
            raise JournalError("trace journal is not started", code="journal_not_started")
        return self._fd

    def _write(self, fd: int, line: bytes) -> None:
        try:
            _write_all(fd, line + b"\n")
        except OSError as exc:
            self._fail()
            raise _io_error("append a record", exc) from exc
        self._size += len(line) + 1

    def _fail(self) -> None:
        """Stop writing after a failure, leaving the file ending at its last complete line where possible."""
        self._failed = True
        fd, self._fd = self._fd, None
        if fd is not None:
            # Best effort: the error being raised matters more than tidying a torn line.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


__all__ = [
    "EPOCH_FILE",
    "JOURNAL_FIELDS",
    "JOURNAL_TYPES",
    "CoverageSeal",
    "TraceJournal",
    "journal_path",
    "read_capture_epoch",
]

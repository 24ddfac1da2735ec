"""Durable SQLite stores: the one way every store here locks, creates, opens and migrates its database file.

Every store (the run ledger, the gateway's sessions, ClawConnect's jobs and attachments) is one database file with
one writer. :func:`take_writer_lock` takes an exclusive, non-blocking ``flock`` on ``<file>.lock`` (0600, never
through a symlink) for as long as the store is open; :func:`open_database` creates the file private (0600, a
regular file owned by this user, never through a symlink), turns on write-ahead logging (verified) and
``synchronous=FULL``, refuses a schema newer than the code, and applies the schema statements and ``user_version``
in one ``IMMEDIATE`` transaction. A store whose schema changed passes ``migrate``, which brings a file of an older
version to the shape the schema statements expect in that same transaction, so the migration and the new version
reach the disk together or not at all.

Errors are :class:`DatabaseLockedError` (another writer holds the lock) and :class:`DatabaseError` (with a short
reason); stores translate them into their own error codes. :class:`WriterDatabase` is the lock, the connection and
the transactions of one store's file, for stores to build on. :func:`move_aside` renames a damaged database (and its
``-wal`` and ``-shm`` files) to ``<file>.corrupt-<UTC time>`` so that a store can start afresh without losing it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

from clawstack.common.files import ensure_private_dir, fsync_dir

__all__ = [
    "DatabaseError",
    "DatabaseLockedError",
    "WriterDatabase",
    "create_private_file",
    "immediate_transaction",
    "move_aside",
    "open_database",
    "take_writer_lock",
]


class DatabaseError(Exception):
    """The database file cannot be used; the message says why (never the file's content)."""


class DatabaseLockedError(DatabaseError):
    """Another process (or store) is the writer of this database."""


def take_writer_lock(path: Path) -> int:
    """Hold the exclusive lock of the database at ``path``; returns the lock's file descriptor (close to release)."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise DatabaseError(f"the lock file cannot be opened: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise DatabaseLockedError("another writer holds this database") from exc
        raise DatabaseError(f"the lock cannot be taken: {exc.strerror or exc}") from exc
    return fd


def create_private_file(path: Path) -> None:
    """Create ``path`` (or open it) as a regular file of this user, mode 0600 exactly; SQLite gives its ``-wal``
    and ``-shm`` files the same mode. :class:`DatabaseError` for anything else there."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise DatabaseError(f"the database file cannot be created: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise DatabaseError("the database is not a regular file owned by this user")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def open_database(
    path: Path,
    schema: Sequence[str],
    version: int,
    *,
    check_integrity: bool = False,
    foreign_keys: bool = False,
    migrate: Callable[[sqlite3.Connection, int], None] | None = None,
) -> sqlite3.Connection:
    """Create (private) or open ``path``, in WAL with ``synchronous=FULL``, migrated to ``schema`` at ``version``.

    ``check_integrity`` runs ``PRAGMA quick_check`` first: a damaged file raises :class:`sqlite3.DatabaseError`
    (as does a file that is not a database at all), which a store may answer by moving the file aside.
    ``migrate(db, found)`` is called first inside the schema transaction when the file has an older, non-zero
    ``user_version`` (``found``); whatever it raises rolls the transaction back and leaves the file as it was. The
    connection is in autocommit mode (``isolation_level=None``) and may be used from other threads.
    """
    create_private_file(path)
    try:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise DatabaseError("the database cannot be opened") from exc
    try:
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise DatabaseError("the database cannot use write-ahead logging")
        db.execute("PRAGMA synchronous=FULL")
        if foreign_keys:
            db.execute("PRAGMA foreign_keys=ON")
        if check_integrity and db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise sqlite3.DatabaseError("quick_check failed")
        found = int(db.execute("PRAGMA user_version").fetchone()[0])
        if found > version:
            raise DatabaseError(f"the database has schema version {found}, newer than this code ({version})")
        db.execute("BEGIN IMMEDIATE")
        if migrate is not None and 0 < found < version:
            migrate(db, found)
        for statement in schema:
            db.execute(statement)
        db.execute(f"PRAGMA user_version={int(version)}")
        db.execute("COMMIT")
    except BaseException:
        # Best-effort close before the caller learns why the file cannot be used.
        db.close()
        raise
    return db


def move_aside(path: Path, *, rename: Callable[[Path, Path], None] = os.rename) -> Path:
    """Rename the database at ``path`` and its ``-wal``/``-shm`` files aside; return the new path of the database.

    An :class:`OSError` from ``rename`` propagates: a store that cannot move a damaged file aside must refuse to
    write rather than lose it.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            rename(source, Path(f"{target}{suffix}"))
    fsync_dir(path.parent)
    return target


@contextlib.contextmanager
def immediate_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` transaction on an autocommit connection: committed (durably, with
    ``synchronous=FULL``) when the block ends, rolled back on any exception (cancellation included), which
    propagates unchanged."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


class WriterDatabase:
    """One store's database file with this object as its only writer: the lock, the connection, the
    transactions.

    :meth:`open` takes the writer lock (:class:`DatabaseLockedError` if another writer holds it) and opens the file
    (:func:`open_database`); :meth:`close` releases both and is idempotent. :meth:`read` and :meth:`write` (one
    ``IMMEDIATE`` transaction, committed when the block ends) serialise callers from several threads and turn any
    :class:`sqlite3.Error` into :class:`DatabaseError` naming ``what`` the store is. Blocking: call from a thread.
    """

    def __init__(
        self,
        path: Path,
        schema: Sequence[str],
        version: int,
        *,
        what: str,
        foreign_keys: bool = False,
        migrate: Callable[[sqlite3.Connection, int], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._schema, self._version, self._what = tuple(schema), version, what
        self._foreign_keys, self._migrate = foreign_keys, migrate
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._mutex = threading.RLock()

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open` succeeded and :meth:`close` has not been called since."""
        return self._db is not None

    def open(self) -> None:
        """Lock, create or open and migrate the database; a no-op when already open."""
        with self._mutex:
            if self._db is not None:
                return
            ensure_private_dir(self.path.parent)
            lock_fd = take_writer_lock(self.path)
            try:
                self._db = open_database(
                    self.path, self._schema, self._version, foreign_keys=self._foreign_keys, migrate=self._migrate
                )
            except sqlite3.Error as exc:
                os.close(lock_fd)
                raise DatabaseError(f"the {self._what} database cannot be initialised") from exc
            except BaseException:
                # Best-effort release of the lock on any other failure to open, then re-raise unchanged.
                os.close(lock_fd)
                raise
            self._lock_fd = lock_fd

    def close(self) -> None:
        """Close the database and release the lock. Idempotent."""
        with self._mutex:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection, for reads; :class:`DatabaseError` if closed or a read fails."""
        with self._mutex:
            db = self._db
            if db is None:
                raise DatabaseError(f"the {self._what} is not open")
            try:
                yield db
            except sqlite3.Error as exc:
                raise DatabaseError(f"the {self._what} database cannot be read") from exc

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction, committed (durably) on success and rolled back on any error."""
        with self._mutex:
            db = self._db
            if db is None:
                raise DatabaseError(f"the {self._what} is not open")
            try:
                with immediate_transaction(db):
                    yield db
            except sqlite3.Error as exc:
                raise DatabaseError(f"the {self._what} database cannot be written") from exc

"""Tests for clawstack.common.sqlite: the writer lock and opening a private, WAL, migrated database."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from clawstack.common.sqlite import (
    DatabaseError,
    DatabaseLockedError,
    WriterDatabase,
    open_database,
    take_writer_lock,
)

SCHEMA = ("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT)",)


def test_a_new_database_is_private_wal_full_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    db = open_database(path, SCHEMA, 3)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
        db.execute("INSERT INTO t VALUES ('a', 'b')")
    finally:
        db.close()
    again = open_database(path, SCHEMA, 3)
    assert again.execute("SELECT v FROM t").fetchall() == [("b",)]
    again.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    open_database(path, SCHEMA, 5).close()
    with pytest.raises(DatabaseError, match="newer than this code"):
        open_database(path, SCHEMA, 4)


def test_a_symlink_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.sqlite3"
    target.write_bytes(b"")
    link = tmp_path / "store.sqlite3"
    link.symlink_to(target)
    with pytest.raises(DatabaseError, match="cannot be created"):
        open_database(link, SCHEMA, 1)


def test_a_damaged_file_is_reported_when_integrity_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    os.chmod(path, 0o600)
    with pytest.raises(sqlite3.DatabaseError):
        open_database(path, SCHEMA, 1, check_integrity=True)


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    fd = take_writer_lock(path)
    try:
        with pytest.raises(DatabaseLockedError):
            take_writer_lock(path)
        assert stat.S_IMODE((tmp_path / "store.sqlite3.lock").stat().st_mode) == 0o600
    finally:
        os.close(fd)
    os.close(take_writer_lock(path))


def test_an_older_file_is_migrated_in_the_schema_transaction(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    old = open_database(path, SCHEMA, 1)
    old.execute("INSERT INTO t VALUES ('a', 'b')")
    old.close()
    calls: list[int] = []
    v2 = (*SCHEMA, "CREATE INDEX IF NOT EXISTS t_w ON t (w)")

    def migrate(db: sqlite3.Connection, found: int) -> None:
        calls.append(found)
        db.execute("ALTER TABLE t ADD COLUMN w TEXT NOT NULL DEFAULT ''")
        db.execute("UPDATE t SET w = v || '!'")

    db = open_database(path, v2, 2, migrate=migrate)
    assert db.execute("SELECT k, v, w FROM t").fetchall() == [("a", "b", "b!")]
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    db.close()
    open_database(path, v2, 2, migrate=migrate).close()  # already current: not migrated again
    open_database(tmp_path / "fresh.sqlite3", v2[:1], 2, migrate=migrate).close()  # a new file is created current
    assert calls == [1]


def test_a_failed_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    open_database(path, SCHEMA, 1).close()

    def migrate(db: sqlite3.Connection, found: int) -> None:
        db.execute("ALTER TABLE t ADD COLUMN w TEXT")
        raise DatabaseError("cannot migrate")

    with pytest.raises(DatabaseError, match="cannot migrate"):
        open_database(path, SCHEMA, 2, migrate=migrate)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert [row[1] for row in db.execute("PRAGMA table_info(t)")] == ["k", "v"]
    db.close()


def test_a_writer_database_is_the_one_writer_and_its_transactions_are_all_or_nothing(tmp_path: Path) -> None:
    schema = ("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY)",)
    path = tmp_path / "state" / "w.sqlite3"
    first = WriterDatabase(path, schema, 1, what="test store")
    with pytest.raises(DatabaseError, match="test store is not open"), first.read():
        pass
    first.open()
    first.open()  # idempotent
    assert first.is_open
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    second = WriterDatabase(path, schema, 1, what="test store")
    with pytest.raises(DatabaseLockedError):
        second.open()
    with first.write() as db:
        db.execute("INSERT INTO t VALUES ('a')")

    def insert_b_then_a_again() -> None:
        with first.write() as db:
            db.execute("INSERT INTO t VALUES ('b')")
            db.execute("INSERT INTO t VALUES ('a')")  # a constraint failure rolls the whole transaction back

    with pytest.raises(DatabaseError, match="cannot be written"):
        insert_b_then_a_again()
    with first.read() as db:
        assert db.execute("SELECT k FROM t ORDER BY k").fetchall() == [("a",)]
    first.close()
    first.close()
    second.open()  # the lock is free again
    second.close()

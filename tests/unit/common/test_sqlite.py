"""Tests for clawstack.common.sqlite: the writer lock and opening a private, WAL, migrated database."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from clawstack.common.sqlite import DatabaseError, DatabaseLockedError, open_database, take_writer_lock

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

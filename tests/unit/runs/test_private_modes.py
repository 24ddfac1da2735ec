"""Every private directory the supervisor makes beside the ledger is 0700 from the moment it exists, whatever
the umask: safety never rests on a parent's mode alone."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawstack.pod.artifacts import PodPaths
from clawstack.proxy.identities import IdentityStore
from clawstack.runs.files import RunFiles
from tests.unit.runs.test_ledger_and_answers import record


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_secrets_and_results_directories_are_0700_and_files_0600(tmp_path: Path, open_umask: None) -> None:
    files = RunFiles(PodPaths(tmp_path))
    run = record()
    files.store_credential(run, "bearer-credential")
    files.identity_secret(run)
    files.store_result(run, b"answer")
    files.keep_template({"id": "sha256:abc", "name": "w"})
    runs = tmp_path / ".claw-runs"
    for directory in ("", "secrets", "secrets/acme", "results", "results/acme", "admitted"):
        assert mode(runs / directory) == 0o700, directory
    for path in runs.rglob("*"):
        if path.is_file():
            assert mode(path) == 0o600, path


def test_the_proxys_identity_store_is_0600_from_the_start(tmp_path: Path, open_umask: None) -> None:
    store = IdentityStore(tmp_path / "identities")
    store.open()
    try:
        db = tmp_path / "identities" / "identities.sqlite3"
        assert mode(db.parent) == 0o700
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            if path.exists():
                assert mode(path) == 0o600, path
    finally:
        store.close()

"""The durable revocation fence: durability, idempotency, fsync ordering, faults, the bound, and the directory."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zoneinfo
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clawstack.common.clock import ManualClock
from clawstack.proxy.errors import CapacityError, RevocationError
from clawstack.proxy.revocation import LOG_NAME, MAX_LINE_BYTES, RevocationLedger, RevocationRecord

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
START_S = int(START.timestamp())


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=START)


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "revocations"


@pytest.fixture
def ledger(directory: Path, clock: ManualClock) -> Iterator[RevocationLedger]:
    """A ledger without compaction grace, so that tests can place expiries exactly at the boundary."""
    with RevocationLedger(directory, clock=clock, compaction_grace_s=0) as opened:
        yield opened


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def fail_on_log(monkeypatch: pytest.MonkeyPatch, name: str, log: Path, err: int, *, partial: bool = False) -> list[int]:
    """Make ``os.<name>`` fail with ``err`` on the ledger file only; return a list counting the failures.

    With ``partial``, a failing ``write`` first writes half of its bytes, as a full disk might.
    """
    real = getattr(os, name)
    failures: list[int] = []

    def fake(fd: int, *args: object) -> object:
        if os.fstat(fd).st_ino == os.stat(log).st_ino:
            failures.append(fd)
            if partial and name == "write":
                data = bytes(args[0])  # type: ignore[call-overload]
                os.pwrite(fd, data[: len(data) // 2], os.fstat(fd).st_size)
            raise OSError(err, os.strerror(err))
        return real(fd, *args)

    monkeypatch.setattr(os, name, fake)
    return failures


# --------------------------------------------------------------------------------------------- durability


def test_records_survive_close_and_reopen(directory: Path, clock: ManualClock) -> None:
    expiry = START + timedelta(hours=1)
    with RevocationLedger(directory, clock=clock) as ledger:
        forever, new_forever = ledger.record("run-forever", expires_at=None)
        timed, new_timed = ledger.record("run-timed", expires_at=expiry)
    assert new_forever
    assert new_timed
    assert forever == RevocationRecord("run-forever", START, None)
    assert timed == RevocationRecord("run-timed", START, expiry)

    with RevocationLedger(directory, clock=clock) as fresh:
        assert fresh.is_revoked("run-forever")
        assert fresh.is_revoked("run-timed")
        assert not fresh.is_revoked("run-other")
        assert fresh.get("run-forever") == forever
        assert fresh.get("run-timed") == timed
        assert fresh.record_count == 2
        assert fresh.used_bytes == (directory / LOG_NAME).stat().st_size
    assert (directory / LOG_NAME).read_bytes() == (
        f"v1 run-forever {START_S} -\nv1 run-timed {START_S} {START_S + 3600}\n".encode()
    )


def test_a_second_ledger_object_reads_the_records_while_the_first_is_open(
    ledger: RevocationLedger, directory: Path
) -> None:
    record, _ = ledger.record("run-a", expires_at=None)
    # read_durable needs no lock and no open ledger: it is a fresh read of the file.
    assert RevocationLedger(directory).read_durable("run-a") == record
    assert ledger.read_durable("run-a") == record
    assert ledger.read_durable("run-b") is None


def test_read_durable_reads_the_disk_not_memory(ledger: RevocationLedger, directory: Path) -> None:
    ledger.record("run-a", expires_at=None)
    (directory / LOG_NAME).write_bytes(b"v1 run-b 5 -\n")
    assert ledger.is_revoked("run-a")
    assert ledger.read_durable("run-a") is None
    assert ledger.read_durable("run-b") == RevocationRecord("run-b", datetime.fromtimestamp(5, UTC), None)
    (directory / LOG_NAME).unlink()
    assert ledger.read_durable("run-b") is None


def test_read_durable_reports_a_corrupt_file(ledger: RevocationLedger, directory: Path) -> None:
    (directory / LOG_NAME).write_bytes(b"nonsense\n")
    with pytest.raises(RevocationError) as info:
        ledger.read_durable("run-a")
    assert info.value.code == "revocation_ledger_corrupt"


def test_times_are_rounded_so_compaction_is_never_early(directory: Path) -> None:
    clock = ManualClock(start=START + timedelta(microseconds=900_000))
    with RevocationLedger(directory, clock=clock) as ledger:
        record, _ = ledger.record("run-a", expires_at=START + timedelta(seconds=10, microseconds=1))
    assert record.revoked_at == START
    assert record.expires_at == START + timedelta(seconds=11)
    assert RevocationLedger(directory).read_durable("run-a") == record


def test_expiry_in_another_timezone_is_the_same_instant(ledger: RevocationLedger) -> None:
    paris = START.astimezone(zoneinfo.ZoneInfo("Europe/Paris"))
    record, _ = ledger.record("run-a", expires_at=paris)
    assert record.expires_at == START


# ---------------------------------------------------------------------------------------------- idempotency


def test_record_is_idempotent_and_writes_once(ledger: RevocationLedger, clock: ManualClock, directory: Path) -> None:
    first, newly = ledger.record("run-a", expires_at=None)
    size = (directory / LOG_NAME).stat().st_size
    clock.advance(60)
    again, newly_again = ledger.record("run-a", expires_at=START + timedelta(days=1))
    assert newly
    assert not newly_again
    assert again == first
    assert (directory / LOG_NAME).stat().st_size == size
    assert ledger.record_count == 1


def test_reserve_and_release_are_idempotent(ledger: RevocationLedger) -> None:
    ledger.reserve("run-a", expires_at=None)
    held = ledger.reserved_bytes
    assert held > 0
    ledger.reserve("run-a", expires_at=None)
    assert ledger.reserved_bytes == held
    ledger.release("run-a")
    ledger.release("run-a")
    ledger.release("run-never-reserved")
    assert ledger.reserved_bytes == 0


def test_record_consumes_the_reservation(ledger: RevocationLedger) -> None:
    expiry = START + timedelta(hours=1)
    ledger.reserve("run-a", expires_at=expiry)
    ledger.reserve("run-b", expires_at=expiry)
    reserved_a = ledger.reserved_bytes // 2
    ledger.record("run-a", expires_at=expiry)
    assert ledger.reserved_bytes == reserved_a
    assert ledger.used_bytes <= reserved_a  # a reservation covers the record it stands for
    ledger.reserve("run-a", expires_at=expiry)  # already revoked: needs no room
    assert ledger.reserved_bytes == reserved_a


@pytest.mark.parametrize("bad", ["", "-lead", ".lead", "has space", "a/b", "a:b", "é", "a" * 129, "a\n"])
def test_malformed_identity_ids_are_refused(ledger: RevocationLedger, bad: str, directory: Path) -> None:
    for call in (
        lambda: ledger.record(bad, expires_at=None),
        lambda: ledger.reserve(bad, expires_at=None),
        lambda: ledger.read_durable(bad),
    ):
        with pytest.raises(ValueError, match="identity id"):
            call()
    assert (directory / LOG_NAME).read_bytes() == b""
    assert ledger.reserved_bytes == 0


def test_longest_identity_id_fits_a_line(ledger: RevocationLedger) -> None:
    identity = "A" + "z._-9" * 25 + "xy"
    assert len(identity) == 128
    record, _ = ledger.record(identity, expires_at=datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC))
    assert ledger.used_bytes <= MAX_LINE_BYTES
    assert ledger.read_durable(identity) == record


def test_naive_expiry_is_refused(ledger: RevocationLedger) -> None:
    with pytest.raises(ValueError, match="timezone"):
        ledger.record("run-a", expires_at=datetime(2026, 5, 1))
    assert not ledger.is_revoked("run-a")


def test_closed_ledger_refuses_writes_but_answers_queries(directory: Path, clock: ManualClock) -> None:
    ledger = RevocationLedger(directory, clock=clock)
    with pytest.raises(RevocationError):
        ledger.record("run-a", expires_at=None)
    ledger.open()
    ledger.open()  # idempotent
    ledger.record("run-a", expires_at=None)
    ledger.close()
    ledger.close()  # idempotent
    assert ledger.is_revoked("run-a")
    with pytest.raises(RevocationError) as info:
        ledger.record("run-b", expires_at=None)
    assert info.value.code == "revocation_unwritable"


def test_records_from_worker_threads_alongside_reserves(ledger: RevocationLedger, directory: Path) -> None:
    # The proxy records in a worker thread (asyncio.to_thread) while the event loop reserves.
    def revoke(n: int) -> None:
        for m in range(25):
            ledger.record(f"run-{n}-{m}", expires_at=None)

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(revoke, n) for n in range(8)]
        for n in range(200):
            ledger.reserve(f"new-{n}", expires_at=None)
        for future in futures:
            future.result()
    assert ledger.record_count == 200
    assert ledger.reserved_bytes == sum(len(f"v1 new-{n} {'0' * 12} -\n") for n in range(200))
    lines = (directory / LOG_NAME).read_bytes().splitlines()
    assert len(lines) == 200
    assert ledger.used_bytes == (directory / LOG_NAME).stat().st_size


# ---------------------------------------------------------------------------------------------- fsync order


def test_record_fsyncs_the_file_with_the_line_in_it_before_returning(
    ledger: RevocationLedger, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bytes] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            seen.append(os.pread(fd, 4096, 0))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    ledger.record("run-a", expires_at=None)
    assert seen == [f"v1 run-a {START_S} -\n".encode()]


def test_open_makes_a_new_file_and_its_directory_entries_durable(
    directory: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        st_ = os.fstat(fd)
        synced.append(
            "parent"
            if st_.st_ino == os.stat(directory.parent).st_ino
            else "dir"
            if stat.S_ISDIR(st_.st_mode)
            else "file"
        )
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    with RevocationLedger(directory, clock=clock):
        pass
    # The directory's own entry in its parent, then the new file, then the file's entry in the directory.
    assert synced == ["parent", "file", "dir"]


def test_unwritable_directory_by_mode(directory: Path, clock: ManualClock) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes through mode bits; the fault is simulated in the os.write/os.fsync tests below")
    with RevocationLedger(directory, clock=clock) as ledger:
        os.chmod(directory / LOG_NAME, 0o400)
        os.chmod(directory, 0o500)
        try:
            ledger.close()
            with pytest.raises(RevocationError) as info:
                ledger.open()
            assert info.value.code == "revocation_unwritable"
            assert not ledger.is_revoked("run-a")
        finally:
            os.chmod(directory, 0o700)
            os.chmod(directory / LOG_NAME, 0o600)


@pytest.mark.parametrize(("call", "err"), [("write", errno.ENOSPC), ("fsync", errno.EIO), ("ftruncate", errno.EIO)])
def test_a_failed_write_is_never_acknowledged(
    ledger: RevocationLedger, directory: Path, monkeypatch: pytest.MonkeyPatch, call: str, err: int
) -> None:
    log = directory / LOG_NAME
    ledger.record("run-before", expires_at=None)
    if call == "ftruncate":
        # A torn tail left by a crash forces the truncation that now fails.
        with log.open("ab") as f:
            f.write(b"v1 torn")
        ledger.close()
        ledger.open()
    before = ledger.used_bytes
    failures = fail_on_log(monkeypatch, call, log, err)
    with pytest.raises(RevocationError) as info:
        ledger.record("run-a", expires_at=None)
    assert failures
    assert info.value.code == "revocation_unwritable"
    assert errno.errorcode[err] in info.value.message
    assert not ledger.is_revoked("run-a")
    assert ledger.used_bytes == before
    # Once the disk recovers, the retry records it exactly once.
    monkeypatch.undo()
    _, newly = ledger.record("run-a", expires_at=None)
    assert newly
    assert log.read_bytes() == f"v1 run-before {START_S} -\nv1 run-a {START_S} -\n".encode()


def test_a_partial_write_is_truncated_before_the_next_append(
    ledger: RevocationLedger, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = directory / LOG_NAME
    fail_on_log(monkeypatch, "write", log, errno.ENOSPC, partial=True)
    with pytest.raises(RevocationError):
        ledger.record("run-a", expires_at=None)
    assert log.read_bytes() == b""  # the half line that reached the file was taken back out at once
    assert not ledger.is_revoked("run-a")
    # A restart now would ignore the torn line rather than refuse the file or believe it.
    assert RevocationLedger(directory).read_durable("run-a") is None
    monkeypatch.undo()
    ledger.record("run-b", expires_at=None)
    assert log.read_bytes() == f"v1 run-b {START_S} -\n".encode()


def test_an_unwritable_directory_fails_open_loudly(
    directory: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory.mkdir(mode=0o700)
    real_open = os.open

    def refuse(path: object, flags: int, *args: object) -> int:
        if Path(str(path)).name == LOG_NAME and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "read-only file system")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refuse)
    ledger = RevocationLedger(directory, clock=clock)
    with pytest.raises(RevocationError) as info:
        ledger.open()
    assert info.value.code == "revocation_unwritable"
    assert "EROFS" in info.value.message
    assert str(directory) not in info.value.message  # messages never carry paths
    monkeypatch.undo()
    ledger.open()  # the failed open released the directory lock
    ledger.close()


# ---------------------------------------------------------------------------------------- torn and corrupt


def test_a_torn_final_line_is_ignored_then_truncated(directory: Path, clock: ManualClock) -> None:
    directory.mkdir(mode=0o700)
    log = directory / LOG_NAME
    good = b"v1 run-a 100 -\nv1 run-b 100 200\n"
    log.write_bytes(good + b"v1 run-c 17")
    with RevocationLedger(directory, clock=clock) as ledger:
        assert ledger.is_revoked("run-a")
        assert ledger.is_revoked("run-b")
        assert not ledger.is_revoked("run-c")
        assert ledger.used_bytes == len(good)
        assert log.read_bytes().endswith(b"v1 run-c 17")  # nothing rewritten on load
        ledger.record("run-d", expires_at=None)
    assert log.read_bytes() == good + f"v1 run-d {START_S} -\n".encode()


def test_a_torn_tail_of_nul_bytes_is_ignored(directory: Path, clock: ManualClock) -> None:
    directory.mkdir(mode=0o700)
    (directory / LOG_NAME).write_bytes(b"v1 run-a 100 -\n" + b"\0" * 40)
    with RevocationLedger(directory, clock=clock) as ledger:
        assert ledger.record_count == 1


CORRUPT = [
    pytest.param(b"garbage\n", id="garbage"),
    pytest.param(b"\n", id="empty-line"),
    pytest.param(b"v2 run-a 1 -\n", id="unknown-version"),
    pytest.param(b"v1 run-a 1\n", id="missing-field"),
    pytest.param(b"v1 run-a 1 - extra\n", id="extra-field"),
    pytest.param(b"v1 run-a 1 - \n", id="trailing-space"),
    pytest.param(b"v1  run-a 1 -\n", id="double-space"),
    pytest.param(b"v1 run-a 1 -\r\n", id="crlf"),
    pytest.param(b"v1 -run 1 -\n", id="bad-id"),
    pytest.param(b"v1 run-\xc3\xa9 1 -\n", id="non-ascii-id"),
    pytest.param(b"v1 run-a 01 -\n", id="leading-zero"),
    pytest.param(b"v1 run-a -1 -\n", id="negative"),
    pytest.param(b"v1 run-a 1.5 -\n", id="fraction"),
    pytest.param(b"v1 run-a 1 x\n", id="bad-expiry"),
    pytest.param(b"v1 run-a 999999999999 -\n", id="beyond-year-9999"),
    pytest.param(b"v1 run-a 1 9999999999999\n", id="too-many-digits"),
    pytest.param(b"v1 run-a\x001 -\n", id="nul"),
    pytest.param(b"v1 run-a 1 -\ngarbage\nv1 run-b 1 -\n", id="middle"),
    pytest.param(b"v1 run-a 1 -\n" + b"x" * (MAX_LINE_BYTES + 1), id="long-torn-tail"),
]


@pytest.mark.parametrize("content", CORRUPT)
def test_a_corrupt_file_is_refused_untouched(directory: Path, clock: ManualClock, content: bytes) -> None:
    directory.mkdir(mode=0o700)
    log = directory / LOG_NAME
    log.write_bytes(content)
    ledger = RevocationLedger(directory, clock=clock)
    with pytest.raises(RevocationError) as info:
        ledger.open()
    assert info.value.code == "revocation_ledger_corrupt"
    assert "run-" not in info.value.message
    assert log.read_bytes() == content
    log.write_bytes(b"")
    ledger.open()  # the refused open released the directory lock
    ledger.close()


def test_duplicate_lines_keep_the_longest_lasting_record(directory: Path, clock: ManualClock) -> None:
    directory.mkdir(mode=0o700)
    (directory / LOG_NAME).write_bytes(b"v1 run-a 100 500\nv1 run-a 90 -\nv1 run-b 5 50\nv1 run-b 6 60\n")
    with RevocationLedger(directory, clock=clock) as ledger:
        assert ledger.get("run-a") == RevocationRecord("run-a", datetime.fromtimestamp(90, UTC), None)
        assert ledger.get("run-b") == RevocationRecord(
            "run-b", datetime.fromtimestamp(5, UTC), datetime.fromtimestamp(60, UTC)
        )


# --------------------------------------------------------------------------------------------------- bound


def test_reserve_refuses_at_the_bound_and_compaction_frees_only_expired(directory: Path, clock: ManualClock) -> None:
    ledger = RevocationLedger(directory, max_bytes=1024, clock=clock, compaction_grace_s=0)
    ledger.open()
    soon = START + timedelta(minutes=5)
    later = START + timedelta(days=1)

    def fill(prefix: str, expiries: list[datetime | None]) -> dict[str, datetime | None]:
        made: dict[str, datetime | None] = {}
        refused: CapacityError | None = None
        for n in range(1000):
            identity, expiry = f"{prefix}-{n:04d}", expiries[n % len(expiries)]
            try:
                ledger.reserve(identity, expires_at=expiry)
            except CapacityError as exc:
                refused = exc
                break
            made[identity] = expiry
        assert refused is not None, "the bound was never reached"
        assert refused.code == "revocation_capacity"
        assert ledger.used_bytes + ledger.reserved_bytes <= ledger.max_bytes
        return made

    expiries = fill("run", [None, soon, later])
    assert 10 < len(expiries) < 1000
    for identity, expiry in expiries.items():
        ledger.record(identity, expires_at=expiry)
    assert ledger.reserved_bytes == 0
    assert ledger.used_bytes <= ledger.max_bytes
    live = fill("live", [None])  # identities still running hold the rest of the room
    size_before = ledger.used_bytes

    # Nothing has expired: compaction frees nothing and a new identity is still refused.
    with pytest.raises(CapacityError):
        ledger.reserve("run-new", expires_at=None)
    assert ledger.compact() == 0
    assert ledger.used_bytes == size_before

    clock.advance(301)  # only the "soon" identities have expired
    ledger.reserve("run-new", expires_at=None)  # compacts to make room
    dropped = {identity for identity, expiry in expiries.items() if expiry == soon}
    assert dropped
    for identity, expiry in expiries.items():
        assert ledger.is_revoked(identity) == (identity not in dropped), identity
        assert (RevocationLedger(directory).read_durable(identity) is not None) == (identity not in dropped)
        assert expiry is not None or ledger.is_revoked(identity)
    assert ledger.used_bytes == (directory / LOG_NAME).stat().st_size
    assert mode_of(directory / LOG_NAME) == 0o600

    # The ledger follows the rewritten file: new records land in it and survive a restart.
    ledger.record("run-new", expires_at=None)
    ledger.close()
    with RevocationLedger(directory, max_bytes=1024, clock=clock, compaction_grace_s=0) as reopened:
        assert reopened.is_revoked("run-new")
        assert reopened.record_count == len(expiries) - len(dropped) + 1
        assert not any(reopened.is_revoked(identity) for identity in live)


def test_compaction_keeps_a_record_expiring_exactly_now(ledger: RevocationLedger, clock: ManualClock) -> None:
    ledger.record("run-now", expires_at=START + timedelta(seconds=10))
    ledger.record("run-past", expires_at=START + timedelta(seconds=9))
    clock.advance(10)
    freed = ledger.compact()
    assert freed == len(f"v1 run-past {START_S} {START_S + 9}\n")
    assert ledger.is_revoked("run-now")
    assert not ledger.is_revoked("run-past")


def test_compaction_waits_out_the_grace(directory: Path, clock: ManualClock) -> None:
    # A wall clock stepped back must not revive an expired identity whose record was dropped: keep it a day.
    with RevocationLedger(directory, clock=clock) as ledger:
        ledger.record("run-past", expires_at=START + timedelta(seconds=1))
        clock.advance(3600)
        assert ledger.compact() == 0
        assert ledger.is_revoked("run-past")
        clock.advance(24 * 3600)
        assert ledger.compact() > 0
        assert not ledger.is_revoked("run-past")


def test_records_without_expiry_are_never_compacted(ledger: RevocationLedger, clock: ManualClock) -> None:
    for n in range(5):
        ledger.record(f"run-{n}", expires_at=None)
    clock.advance(10 * 365 * 86400)
    assert ledger.compact() == 0
    assert ledger.record_count == 5


def test_a_revocation_is_never_refused_for_room(directory: Path, clock: ManualClock) -> None:
    a, b, c = "a" * 100, "b" * 100, "c" * 100
    with RevocationLedger(directory, max_bytes=MAX_LINE_BYTES, clock=clock, compaction_grace_s=0) as ledger:
        ledger.reserve(a, expires_at=None)
        with pytest.raises(CapacityError):
            ledger.reserve(b, expires_at=None)
        ledger.record(a, expires_at=None)
        _, newly = ledger.record(c, expires_at=None)  # an identity created without a reservation
        assert newly
        assert ledger.used_bytes > ledger.max_bytes
        assert ledger.is_revoked(c)


def test_failed_compaction_keeps_everything(
    ledger: RevocationLedger, clock: ManualClock, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger.record("run-old", expires_at=START + timedelta(seconds=1))
    ledger.record("run-forever", expires_at=None)
    content = (directory / LOG_NAME).read_bytes()
    clock.advance(5)

    def broken_replace(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(RevocationError) as info:
        ledger.compact()
    assert info.value.code == "revocation_unwritable"
    assert (directory / LOG_NAME).read_bytes() == content
    assert sorted(p.name for p in directory.iterdir()) == ["lock", LOG_NAME]
    assert ledger.is_revoked("run-old")
    assert ledger.is_revoked("run-forever")
    monkeypatch.undo()
    ledger.record("run-next", expires_at=None)  # still appends to the live file
    assert RevocationLedger(directory).read_durable("run-next") is not None
    assert ledger.compact() > 0


def test_max_bytes_below_one_line_is_refused(directory: Path) -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        RevocationLedger(directory, max_bytes=MAX_LINE_BYTES - 1)


# ----------------------------------------------------------------------------------------------- directory


def test_missing_directory_is_created_private(tmp_path: Path, clock: ManualClock) -> None:
    directory = tmp_path / "a" / "b" / "revocations"
    old_umask = os.umask(0)
    try:
        with RevocationLedger(directory, clock=clock, compaction_grace_s=0) as ledger:
            ledger.record("run-a", expires_at=None)
    finally:
        os.umask(old_umask)
    assert mode_of(directory) == 0o700
    assert mode_of(directory / LOG_NAME) == 0o600
    assert mode_of(directory / "lock") == 0o600


def test_an_existing_loose_file_mode_is_tightened(directory: Path, clock: ManualClock) -> None:
    directory.mkdir(mode=0o700)
    (directory / LOG_NAME).write_bytes(b"")
    os.chmod(directory / LOG_NAME, 0o644)
    with RevocationLedger(directory, clock=clock):
        pass
    assert mode_of(directory / LOG_NAME) == 0o600


def test_second_opener_is_refused_until_the_first_closes(directory: Path, clock: ManualClock) -> None:
    first = RevocationLedger(directory, clock=clock)
    first.open()
    second = RevocationLedger(directory, clock=clock)
    with pytest.raises(RevocationError) as info:
        second.open()
    assert info.value.code == "revocation_dir_locked"
    first.close()
    second.open()
    second.close()


def test_another_process_is_refused(ledger: RevocationLedger, directory: Path) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from clawstack.proxy.errors import RevocationError\n"
        "from clawstack.proxy.revocation import RevocationLedger\n"
        "try:\n"
        "    RevocationLedger(Path(sys.argv[1])).open()\n"
        "except RevocationError as exc:\n"
        "    print(exc.code)\n"
        "else:\n"
        "    print('opened')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(directory)], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "revocation_dir_locked"


def _symlinked_dir(tmp_path: Path) -> Path:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    return link


def _loose_dir(mode: int) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        path = tmp_path / "loose"
        path.mkdir()
        os.chmod(path, mode)
        return path

    return make


def _file_not_dir(tmp_path: Path) -> Path:
    path = tmp_path / "file"
    path.write_bytes(b"")
    return path


def _log_symlink(tmp_path: Path) -> Path:
    path = tmp_path / "dir"
    path.mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_bytes(b"")
    (path / LOG_NAME).symlink_to(tmp_path / "elsewhere")
    return path


def _lock_symlink(tmp_path: Path) -> Path:
    path = tmp_path / "dir"
    path.mkdir(mode=0o700)
    (path / "lock").symlink_to(tmp_path / "elsewhere")
    return path


def _log_is_a_directory(tmp_path: Path) -> Path:
    path = tmp_path / "dir"
    path.mkdir(mode=0o700)
    (path / LOG_NAME).mkdir()
    return path


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_symlinked_dir, id="symlink"),
        pytest.param(_loose_dir(0o777), id="world-writable"),
        pytest.param(_loose_dir(0o720), id="group-writable"),
        pytest.param(_loose_dir(0o1777), id="sticky-world-writable"),
        pytest.param(_file_not_dir, id="not-a-directory"),
        pytest.param(_log_symlink, id="log-symlink"),
        pytest.param(_lock_symlink, id="lock-symlink"),
        pytest.param(_log_is_a_directory, id="log-is-a-directory"),
    ],
)
def test_unsafe_directory_is_refused(tmp_path: Path, clock: ManualClock, make: Callable[[Path], Path]) -> None:
    directory = make(tmp_path)
    with pytest.raises(RevocationError) as info:
        RevocationLedger(directory, clock=clock).open()
    assert info.value.code in {"revocation_dir_unsafe", "revocation_unwritable"}
    if make is not _log_is_a_directory:
        assert info.value.code == "revocation_dir_unsafe"


def test_directory_owned_by_someone_else_is_refused(tmp_path: Path, clock: ManualClock) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a directory owned by another user")
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with pytest.raises(RevocationError) as info:
        RevocationLedger(directory, clock=clock).open()
    assert info.value.code == "revocation_dir_unsafe"


# ------------------------------------------------------------------------------------------ state machine


IDS = [f"run-{n}" for n in range(10)]


class LedgerMachine(RuleBasedStateMachine):
    """Any sequence of reserve, record, release, compact, clock moves, torn crashes and restarts keeps every
    acknowledged record whose identity has not expired, and keeps records plus reservations within the bound."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="cs-rev-"))
        self.directory = self.root / "revocations"
        self.clock = ManualClock(start=START)
        self.max_bytes = 600
        self.ledger = RevocationLedger(self.directory, max_bytes=self.max_bytes, clock=self.clock)
        self.ledger.open()
        self.acknowledged: dict[str, datetime | None] = {}
        self.reserved: dict[str, datetime | None] = {}

    def _expiry(self, offset_s: int | None) -> datetime | None:
        return None if offset_s is None else self.clock.now() + timedelta(seconds=offset_s)

    @rule(identity=st.sampled_from(IDS), offset_s=st.none() | st.integers(-50, 500))
    def reserve(self, identity: str, offset_s: int | None) -> None:
        expiry = self._expiry(offset_s)
        before = self.ledger.used_bytes + self.ledger.reserved_bytes
        revoked = self.ledger.is_revoked(identity)
        try:
            self.ledger.reserve(identity, expires_at=expiry)
        except CapacityError:
            assert self.ledger.used_bytes + self.ledger.reserved_bytes <= before
            return
        if not revoked:
            self.reserved.setdefault(identity, expiry)

    @precondition(lambda self: bool(self.reserved))
    @rule(data=st.data())
    def record_reserved(self, data: st.DataObject) -> None:
        identity = data.draw(st.sampled_from(sorted(self.reserved)))
        expiry = self.reserved.pop(identity)
        revoked = self.ledger.is_revoked(identity)
        record, newly = self.ledger.record(identity, expires_at=expiry)
        assert newly == (not revoked)
        if newly:
            self.acknowledged[identity] = record.expires_at

    @rule(identity=st.sampled_from(IDS))
    def record_again(self, identity: str) -> None:
        if identity in self.acknowledged and self.ledger.is_revoked(identity):
            _, newly = self.ledger.record(identity, expires_at=None)
            assert not newly

    @precondition(lambda self: bool(self.reserved))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        identity = data.draw(st.sampled_from(sorted(self.reserved)))
        del self.reserved[identity]
        self.ledger.release(identity)

    @rule()
    def compact(self) -> None:
        self.ledger.compact()

    @rule(seconds=st.integers(0, 200))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(torn=st.binary(max_size=40).filter(lambda b: b"\n" not in b))
    def crash_and_restart(self, torn: bytes) -> None:
        self.ledger.close()
        # What a crash mid-append leaves: the acknowledged lines, then part of one more (never two: an append
        # first truncates any earlier torn tail).
        os.truncate(self.directory / LOG_NAME, self.ledger.used_bytes)
        with (self.directory / LOG_NAME).open("ab") as f:
            f.write(torn)
        self.ledger = RevocationLedger(self.directory, max_bytes=self.max_bytes, clock=self.clock)
        self.ledger.open()
        self.reserved.clear()  # reservations are in memory; the owner re-reserves live identities

    @invariant()
    def never_forgets_a_revocation_that_matters(self) -> None:
        now = self.clock.now()
        for identity, expiry in self.acknowledged.items():
            if expiry is None or expiry >= now:
                assert self.ledger.is_revoked(identity), identity
                assert self.ledger.read_durable(identity) is not None, identity

    @invariant()
    def stays_within_the_bound(self) -> None:
        assert self.ledger.used_bytes + self.ledger.reserved_bytes <= self.max_bytes
        # Every reservation the model holds is counted (the shortest one here is 24 bytes).
        assert self.ledger.reserved_bytes >= 24 * len(self.reserved)
        assert (self.ledger.reserved_bytes == 0) == (not self.reserved)

    def teardown(self) -> None:
        self.ledger.close()
        shutil.rmtree(self.root, ignore_errors=True)


LedgerMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestLedgerMachine = LedgerMachine.TestCase

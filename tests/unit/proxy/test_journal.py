"""The trace journal: capture epochs, the epoch file, records, coverage seals, durability, modes and faults."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from clawstack.common.clock import ManualClock
from clawstack.proxy.errors import JournalError, ProxyError
from clawstack.proxy.journal import EPOCH_FILE, CoverageSeal, TraceJournal, journal_path, read_capture_epoch

START = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
EMPTY_DIGEST = "sha256:" + hashlib.sha256(b"").hexdigest()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=START)


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "journal"


@pytest.fixture
def journal(directory: Path, clock: ManualClock) -> Iterator[TraceJournal]:
    opened = TraceJournal(directory, clock=clock)
    opened.start()
    yield opened
    opened.close()


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def lines_of(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def records_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines_of(path)]


def recompute_coverage(path: Path, identity: str) -> tuple[int, str]:
    """The seal an auditor computes from the file alone."""
    digests = [
        "sha256:" + hashlib.sha256(line).hexdigest()
        for line in lines_of(path)
        if (record := json.loads(line)).get("identity") == identity and record.get("type") != "coverage_seal"
    ]
    return len(digests), "sha256:" + hashlib.sha256("".join(digests).encode("ascii")).hexdigest()


# ------------------------------------------------------------------------------------------------- epochs


def test_start_writes_the_first_epoch(directory: Path, clock: ManualClock) -> None:
    journal = TraceJournal(directory, clock=clock)
    assert journal.start() == 1
    assert journal.epoch == 1
    assert journal.start() == 1  # idempotent while started
    journal.close()
    assert json.loads((directory / EPOCH_FILE).read_bytes()) == {"epoch": 1, "started_at": "2026-03-01T12:00:00Z"}
    assert records_of(journal_path(directory, 1)) == [
        {"type": "epoch_start", "epoch": 1, "seq": 0, "ts": "2026-03-01T12:00:00Z", "capture_content": False}
    ]
    assert read_capture_epoch(directory) == 1


def test_epoch_increments_across_restarts(directory: Path, clock: ManualClock) -> None:
    for expected in (1, 2, 3):
        journal = TraceJournal(directory, clock=clock)
        assert journal.start() == expected
        journal.append({"type": "upstream_request"}, identity_id="run-a")
        journal.close()
        assert read_capture_epoch(directory) == expected
    assert sorted(p.name for p in directory.iterdir()) == [
        "epoch",
        "journal-1.jsonl",
        "journal-2.jsonl",
        "journal-3.jsonl",
    ]
    # The same object started again after close begins a new epoch too.
    assert journal.start() == 4
    journal.close()


def test_epoch_continues_from_the_highest_file_when_the_epoch_file_is_gone(directory: Path) -> None:
    directory.mkdir(mode=0o700)
    journal_path(directory, 7).write_bytes(b"")
    journal_path(directory, 3).write_bytes(b"")
    (directory / "journal-x.jsonl").write_bytes(b"")
    (directory / "journal-09.jsonl").write_bytes(b"")  # not a name the journal writes
    journal = TraceJournal(directory)
    assert journal.start() == 8
    journal.close()


def test_epoch_continues_from_a_garbage_epoch_file_by_the_files(directory: Path) -> None:
    directory.mkdir(mode=0o700)
    journal_path(directory, 2).write_bytes(b"")
    (directory / EPOCH_FILE).write_bytes(b"{not json")
    journal = TraceJournal(directory)
    assert journal.start() == 3
    journal.close()


def test_epoch_continues_from_the_epoch_file_when_it_is_ahead(directory: Path) -> None:
    directory.mkdir(mode=0o700)
    journal_path(directory, 2).write_bytes(b"")
    (directory / EPOCH_FILE).write_bytes(b'{"epoch": 10, "started_at": "2026-01-01T00:00:00Z"}')
    journal = TraceJournal(directory)
    assert journal.start() == 11
    journal.close()


# -------------------------------------------------------------------------------------- read_capture_epoch

VALID = b'{"epoch": 5, "started_at": "2026-01-01T00:00:00Z"}'


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(VALID, 5, id="valid"),
        pytest.param(b'{"epoch":1,"started_at":"2026-01-01T00:00:00+02:00","x":[]}', 1, id="extra-field"),
        pytest.param(b"", None, id="empty"),
        pytest.param(b"garbage", None, id="garbage"),
        pytest.param(b"\xff\xfe", None, id="invalid-utf8"),
        pytest.param(b"[5]", None, id="array"),
        pytest.param(b"5", None, id="bare-int"),
        pytest.param(b'{"epoch": 0, "started_at": "2026-01-01T00:00:00Z"}', None, id="zero"),
        pytest.param(b'{"epoch": -3, "started_at": "2026-01-01T00:00:00Z"}', None, id="negative"),
        pytest.param(b'{"epoch": 1.0, "started_at": "2026-01-01T00:00:00Z"}', None, id="float"),
        pytest.param(b'{"epoch": true, "started_at": "2026-01-01T00:00:00Z"}', None, id="bool"),
        pytest.param(b'{"epoch": "5", "started_at": "2026-01-01T00:00:00Z"}', None, id="string"),
        pytest.param(b'{"epoch": null, "started_at": "2026-01-01T00:00:00Z"}', None, id="null"),
        pytest.param(b'{"epoch": 99999999999999999999, "started_at": "2026-01-01T00:00:00Z"}', None, id="huge"),
        pytest.param(b'{"epoch": 5}', None, id="no-started-at"),
        pytest.param(b'{"epoch": 5, "started_at": "yesterday"}', None, id="bad-started-at"),
        pytest.param(b'{"epoch": 5, "started_at": "2026-01-01T00:00:00"}', None, id="naive-started-at"),
        pytest.param(b'{"epoch": 5, "epoch": 6, "started_at": "2026-01-01T00:00:00Z"}', None, id="duplicate-key"),
        pytest.param(VALID[:-1] + b" " * 5000 + b"}", None, id="oversized"),
    ],
)
def test_read_capture_epoch(tmp_path: Path, content: bytes, expected: int | None) -> None:
    (tmp_path / EPOCH_FILE).write_bytes(content)
    assert read_capture_epoch(tmp_path) == expected


def _symlink_to_valid(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(VALID)
    (tmp_path / EPOCH_FILE).symlink_to(tmp_path / "real")


def _directory_named_epoch(tmp_path: Path) -> None:
    (tmp_path / EPOCH_FILE).mkdir()


def _fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / EPOCH_FILE)  # a reader must not hang waiting for a writer


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: None, id="missing"),
        pytest.param(_symlink_to_valid, id="symlink"),
        pytest.param(_directory_named_epoch, id="directory"),
        pytest.param(_fifo, id="fifo"),
    ],
)
def test_read_capture_epoch_unusable_files(tmp_path: Path, make: Callable[[Path], None]) -> None:
    make(tmp_path)
    assert read_capture_epoch(tmp_path) is None


def test_read_capture_epoch_read_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / EPOCH_FILE).write_bytes(VALID)

    def failing_read(fd: int, size: int) -> bytes:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "read", failing_read)
    assert read_capture_epoch(tmp_path) is None


def test_read_capture_epoch_missing_directory(tmp_path: Path) -> None:
    assert read_capture_epoch(tmp_path / "nowhere") is None
    assert read_capture_epoch(Path("bad\0path")) is None


def test_read_capture_epoch_reads_fresh(tmp_path: Path) -> None:
    (tmp_path / EPOCH_FILE).write_bytes(VALID)
    assert read_capture_epoch(tmp_path) == 5
    (tmp_path / EPOCH_FILE).write_bytes(VALID.replace(b"5", b"6"))
    assert read_capture_epoch(tmp_path) == 6
    (tmp_path / EPOCH_FILE).unlink()
    assert read_capture_epoch(tmp_path) is None


# ------------------------------------------------------------------------------------------------- records


def test_records_carry_epoch_seq_ts_and_identity(journal: TraceJournal, directory: Path, clock: ManualClock) -> None:
    journal.append({"type": "upstream_request", "status": 200}, identity_id="run-a")
    clock.advance(2)
    journal.append({"type": "note"}, identity_id=None)
    journal.append({"type": "upstream_request", "status": 502}, identity_id="run-b")
    records = records_of(journal_path(directory, 1))
    assert records[1:] == [
        {
            "epoch": 1,
            "seq": 1,
            "ts": "2026-03-01T12:00:00Z",
            "identity": "run-a",
            "type": "upstream_request",
            "status": 200,
        },
        {"epoch": 1, "seq": 2, "ts": "2026-03-01T12:00:02Z", "type": "note"},
        {
            "epoch": 1,
            "seq": 3,
            "ts": "2026-03-01T12:00:02Z",
            "identity": "run-b",
            "type": "upstream_request",
            "status": 502,
        },
    ]


def test_seq_restarts_with_each_epoch(directory: Path) -> None:
    for epoch in (1, 2):
        journal = TraceJournal(directory)
        journal.start()
        journal.append({"type": "x"}, identity_id=None)
        journal.close()
        assert [r["seq"] for r in records_of(journal_path(directory, epoch))] == [0, 1]


def test_digest_is_of_the_line_bytes(journal: TraceJournal, directory: Path) -> None:
    digest = journal.append({"type": "x", "text": "café ☕", "multi": "line\nbreak"}, identity_id="run-a")
    last = lines_of(journal_path(directory, 1))[-1]
    assert digest == "sha256:" + hashlib.sha256(last).hexdigest()
    assert "café ☕".encode() in last  # written as UTF-8, not \\u escapes
    assert json.loads(last)["multi"] == "line\nbreak"  # one record is always one line
    assert b" " not in last.replace("café ☕".encode(), b"")  # compact separators


def test_lines_are_written_without_fsync(journal: TraceJournal, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    for n in range(10):
        journal.append({"type": "x", "n": n}, identity_id="run-a")
    assert calls == []


@pytest.mark.parametrize(
    ("record", "match"),
    [
        pytest.param({"seq": 9}, "may not set", id="seq"),
        pytest.param({"epoch": 9}, "may not set", id="epoch"),
        pytest.param({"ts": "x"}, "may not set", id="ts"),
        pytest.param({"identity": "run-z"}, "may not set", id="identity"),
        pytest.param({"type": "coverage_seal"}, "reserved", id="seal-type"),
        pytest.param({"type": "epoch_start"}, "reserved", id="start-type"),
        pytest.param({"value": object()}, "not representable", id="unserialisable"),
        pytest.param({"value": float("nan")}, "not representable", id="nan"),
        pytest.param({"value": "\ud800"}, "not representable", id="lone-surrogate"),
    ],
)
def test_bad_records_are_refused_and_change_nothing(
    journal: TraceJournal, directory: Path, record: dict[str, Any], match: str
) -> None:
    before = journal_path(directory, 1).read_bytes()
    with pytest.raises(ValueError, match=match) as info:
        journal.append(record, identity_id="run-a")
    assert "\ud800" not in str(info.value)
    assert journal_path(directory, 1).read_bytes() == before
    assert journal.coverage("run-a") == (0, EMPTY_DIGEST)
    journal.append({"type": "x"}, identity_id=None)
    assert records_of(journal_path(directory, 1))[-1]["seq"] == 1  # no sequence number was spent


def test_any_json_value_is_a_valid_type_field(journal: TraceJournal, directory: Path) -> None:
    journal.append({"type": ["not", "a", "string"]}, identity_id=None)
    assert records_of(journal_path(directory, 1))[-1]["type"] == ["not", "a", "string"]


def test_capture_content_is_reported_and_recorded(directory: Path) -> None:
    journal = TraceJournal(directory, capture_content=True)
    assert journal.capture_content
    assert not TraceJournal(directory).capture_content
    journal.start()
    journal.close()
    assert records_of(journal_path(directory, 1))[0]["capture_content"] is True


# --------------------------------------------------------------------------------------------------- seals


def test_seal_counts_and_digest_match_the_file(journal: TraceJournal, directory: Path) -> None:
    for n in range(3):
        journal.append({"type": "upstream_request", "n": n}, identity_id="run-a")
        journal.append({"type": "upstream_request", "n": n}, identity_id="run-b")
    journal.append({"type": "tool_dispatch"}, identity_id="run-a")
    journal.append({"type": "note"}, identity_id=None)

    seal = journal.seal("run-a")
    path = journal_path(directory, 1)
    assert (seal.records, seal.digest) == recompute_coverage(path, "run-a")
    assert seal == CoverageSeal(identity_id="run-a", epoch=1, records=4, digest=seal.digest)
    last = records_of(path)[-1]
    assert last == {
        "epoch": 1,
        "seq": 9,
        "ts": "2026-03-01T12:00:00Z",
        "identity": "run-a",
        "type": "coverage_seal",
        "records": 4,
        "digest": seal.digest,
    }
    assert journal.coverage("run-b") == recompute_coverage(path, "run-b")


def test_sealing_again_counts_the_same_plus_anything_new(journal: TraceJournal, directory: Path) -> None:
    journal.append({"type": "x"}, identity_id="run-a")
    first = journal.seal("run-a")
    assert journal.seal("run-a") == first  # the first seal line is not itself counted
    journal.append({"type": "y"}, identity_id="run-a")
    third = journal.seal("run-a")
    assert third.records == 2
    assert (third.records, third.digest) == recompute_coverage(journal_path(directory, 1), "run-a")
    seals = [r for r in records_of(journal_path(directory, 1)) if r.get("type") == "coverage_seal"]
    assert [s["records"] for s in seals] == [1, 1, 2]


def test_seal_of_an_identity_without_records(journal: TraceJournal) -> None:
    assert journal.coverage("run-none") == (0, EMPTY_DIGEST)
    assert journal.seal("run-none") == CoverageSeal("run-none", 1, 0, EMPTY_DIGEST)


def test_seal_is_fsynced_with_the_seal_line_in_the_file(
    journal: TraceJournal, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal.append({"type": "x"}, identity_id="run-a")
    seen: list[bytes] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        assert os.fstat(fd).st_ino == journal_path(directory, 1).stat().st_ino
        seen.append(journal_path(directory, 1).read_bytes())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    journal.seal("run-a")
    assert len(seen) == 1
    assert seen[0] == journal_path(directory, 1).read_bytes()
    assert b'"type":"coverage_seal"' in seen[0].splitlines()[-1]


def test_seal_in_a_new_epoch_covers_only_that_epoch(directory: Path) -> None:
    journal = TraceJournal(directory)
    journal.start()
    journal.append({"type": "x"}, identity_id="run-a")
    journal.close()
    restarted = TraceJournal(directory)
    restarted.start()
    restarted.append({"type": "x"}, identity_id="run-a")
    seal = restarted.seal("run-a")
    restarted.close()
    assert (seal.epoch, seal.records) == (2, 1)  # the pinned epoch (1) no longer matches: coverage is partial


# -------------------------------------------------------------------------------------------- files, modes


def test_directory_and_files_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "journal"
    old_umask = os.umask(0)
    try:
        journal = TraceJournal(directory)
        journal.start()
        journal.append({"type": "x"}, identity_id="run-a")
        journal.seal("run-a")
        journal.close()
    finally:
        os.umask(old_umask)
    assert mode_of(directory) == 0o700
    assert mode_of(journal_path(directory, 1)) == 0o600
    assert mode_of(directory / EPOCH_FILE) == 0o600
    assert sorted(p.name for p in directory.iterdir()) == ["epoch", "journal-1.jsonl"]  # no temporaries


def test_start_makes_the_epoch_start_durable_before_the_epoch_file(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            order.append("dir")
        elif journal_path(directory, 1).exists() and st.st_ino == journal_path(directory, 1).stat().st_ino:
            order.append("journal")
        else:
            order.append("epoch-file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    journal = TraceJournal(directory)
    journal.start()
    assert order == ["journal", "epoch-file", "dir"]
    journal.close()


def test_symlinked_directory_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(JournalError) as info:
        TraceJournal(tmp_path / "link").start()
    assert info.value.code == "journal_dir_unsafe"
    assert str(tmp_path) not in info.value.message


# ---------------------------------------------------------------------------------------------------- faults


def test_not_started(directory: Path) -> None:
    journal = TraceJournal(directory)
    for call in (
        lambda: journal.epoch,
        lambda: journal.append({"type": "x"}, identity_id=None),
        lambda: journal.seal("run-a"),
    ):
        with pytest.raises(JournalError) as info:
            call()
        assert info.value.code == "journal_not_started"
    journal.close()  # idempotent, even unstarted
    assert not directory.exists()


def test_closed_journal_refuses_appends_but_keeps_its_epoch(journal: TraceJournal) -> None:
    journal.close()
    journal.close()
    assert journal.epoch == 1
    with pytest.raises(JournalError):
        journal.append({"type": "x"}, identity_id=None)


def _fail_writes_to(monkeypatch: pytest.MonkeyPatch, name: str, path: Path, err: int, *, partial: bool = False) -> None:
    real = getattr(os, name)

    def fake(fd: int, *args: Any) -> Any:
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            if partial:
                real(fd, bytes(args[0])[:5])
            raise OSError(err, os.strerror(err))
        return real(fd, *args)

    monkeypatch.setattr(os, name, fake)


@pytest.mark.parametrize("partial", [False, True])
def test_a_failed_append_stops_the_journal(
    journal: TraceJournal, directory: Path, monkeypatch: pytest.MonkeyPatch, partial: bool
) -> None:
    path = journal_path(directory, 1)
    journal.append({"type": "x"}, identity_id="run-a")
    before = path.read_bytes()
    _fail_writes_to(monkeypatch, "write", path, errno.ENOSPC, partial=partial)
    with pytest.raises(JournalError) as info:
        journal.append({"type": "x"}, identity_id="run-a")
    assert info.value.code == "journal_unwritable"
    assert isinstance(info.value, ProxyError)
    assert "ENOSPC" in info.value.message
    monkeypatch.undo()
    assert path.read_bytes() == before  # a torn line is cut back off
    for call in (lambda: journal.append({"type": "x"}, identity_id="run-a"), lambda: journal.seal("run-a")):
        with pytest.raises(JournalError) as stopped:
            call()
        assert stopped.value.code == "journal_unwritable"
    assert path.read_bytes() == before  # no seal vouches for a file with a gap
    assert journal.start() == 2  # starting again begins a new epoch
    assert journal.coverage("run-a") == (0, EMPTY_DIGEST)
    journal.append({"type": "x"}, identity_id="run-a")


def test_a_failed_seal_fsync_stops_the_journal(
    journal: TraceJournal, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal.append({"type": "x"}, identity_id="run-a")
    _fail_writes_to(monkeypatch, "fsync", journal_path(directory, 1), errno.EIO)
    with pytest.raises(JournalError) as info:
        journal.seal("run-a")
    assert info.value.code == "journal_unwritable"
    monkeypatch.undo()
    with pytest.raises(JournalError):
        journal.append({"type": "x"}, identity_id="run-a")


def test_a_failed_start_leaves_no_epoch(directory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace

    def broken_replace(src: Any, dst: Any) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", broken_replace)
    journal = TraceJournal(directory)
    with pytest.raises(JournalError) as info:
        journal.start()
    assert info.value.code == "journal_unwritable"
    assert read_capture_epoch(directory) is None
    with pytest.raises(JournalError):
        journal.append({"type": "x"}, identity_id=None)
    monkeypatch.setattr(os, "replace", real_replace)
    assert journal.start() == 2  # the abandoned journal-1.jsonl is never reused
    journal.close()

"""The attachment store: lineage is never lost, a dangling current pointer or junk rows load cleanly, tokens
resume above the highest stored one, and one process writes it."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawstack.connect.agent_session import Attachment, AttachmentStore, AttachmentStoreError


def record(attachment_id: str, *, key: str = "agent:main:s", session_id: str = "s-1", token: int = 1) -> Attachment:
    return Attachment(
        attachment_id=attachment_id,
        session_key=key,
        runtime="fake",
        session_id=session_id,
        created_at_ms=1000,
        updated_at_ms=1000,
        observation_token=token,
        delegated_turn_id="job_1",
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[AttachmentStore]:
    store = AttachmentStore(tmp_path / "data" / "agent_sessions.sqlite3")
    store.open()
    yield store
    store.close()


def test_lineage_is_chained_and_never_deleted(store: AttachmentStore) -> None:
    store.attach(record("att_1"), supersede_reason="unused")
    old = store.attach(record("att_2", session_id="s-2", token=2), supersede_reason="moved on")
    assert old is not None
    assert (old.status, old.superseded_by, old.reason) == ("superseded", "att_2", "moved on")
    current = store.current("agent:main:s")
    assert current is not None
    assert (current.attachment_id, current.replaces_attachment_id) == ("att_2", "att_1")
    detached = store.detach("agent:main:s", "att_2", lambda a: dataclasses.replace(a, reason="done"))
    assert detached is not None
    assert detached.status == "detached"
    assert store.current("agent:main:s") is None
    assert [(a.attachment_id, a.status) for a in store.lineage("agent:main:s")] == [
        ("att_1", "superseded"),
        ("att_2", "detached"),
    ]


def test_freshness_is_enforced_in_the_write(store: AttachmentStore) -> None:
    store.attach(record("att_1", token=5), supersede_reason="")

    def mark(a: Attachment) -> Attachment:
        return dataclasses.replace(a, reported_state="running")

    assert store.write_if_fresh("agent:main:s", "att_1", "job_1", 5, mark) is None  # not newer
    assert store.write_if_fresh("agent:main:s", "att_1", "job_other", 9, mark) is None  # another turn
    assert store.write_if_fresh("agent:main:s", "att_x", "job_1", 9, mark) is None  # not current
    written = store.write_if_fresh("agent:main:s", "att_1", "job_1", 6, mark)
    assert written is not None
    assert (written.observation_token, written.reported_state) == (6, "running")


def test_a_write_that_need_not_be_newer_still_needs_the_turn_and_never_lowers_the_token(
    store: AttachmentStore,
) -> None:
    store.attach(record("att_1", token=5))

    def fail(a: Attachment) -> Attachment:
        return dataclasses.replace(a, last_error={"code": "continue_failed", "operation": "continue"})

    assert store.write_if_fresh("agent:main:s", "att_1", "job_other", 9, fail, require_newer=False) is None
    assert store.write_if_fresh("agent:main:s", "att_x", "job_1", 9, fail, require_newer=False) is None
    written = store.write_if_fresh("agent:main:s", "att_1", "job_1", 3, fail, require_newer=False)
    assert written is not None
    assert written.last_error is not None
    assert (written.observation_token, written.last_error["code"]) == (5, "continue_failed")


def test_tokens_resume_above_the_highest_stored(tmp_path: Path) -> None:
    path = tmp_path / "agent_sessions.sqlite3"
    first = AttachmentStore(path)
    first.open()
    assert first.max_token() == 0
    first.attach(record("att_1", token=41), supersede_reason="")
    first.attach(record("att_2", key="agent:main:t", token=7), supersede_reason="")
    first.close()
    again = AttachmentStore(path)
    again.open()
    assert again.max_token() == 41
    again.close()


def test_one_writer(store: AttachmentStore) -> None:
    second = AttachmentStore(store.path)
    with pytest.raises(AttachmentStoreError) as info:
        second.open()
    assert info.value.code == "attachment_store_locked"


def test_a_dangling_pointer_and_junk_rows_load_and_keep_valid_lineage(tmp_path: Path) -> None:
    path = tmp_path / "agent_sessions.sqlite3"
    store = AttachmentStore(path)
    store.open()
    store.attach(record("att_1"), supersede_reason="")
    store.attach(record("att_2", session_id="s-2", token=2), supersede_reason="replaced")
    store.attach(record("att_9", key="agent:main:other", token=3), supersede_reason="")
    store.close()
    db = sqlite3.connect(path)
    with db:
        rows = [
            ("att_junk1", "agent:main:s", "current", 99, "{not json"),
            ("att_junk2", "agent:main:s", "current", 98, '{"attachmentId": "att_junk2", "runtime": "../bad"}'),
            ("att_junk3", "agent:main:s", "???", "high", "[]"),
        ]
        db.executemany(
            "INSERT INTO attachments (attachment_id, session_key, status, token, record) VALUES (?,?,?,?,?)", rows
        )
        db.execute("UPDATE current SET attachment_id='att_missing' WHERE session_key='agent:main:s'")
        db.execute("INSERT INTO current VALUES ('agent:main:junk', 'att_junk1')")
        db.execute("UPDATE current SET attachment_id='att_1' WHERE session_key='agent:main:other'")  # foreign record
    db.close()
    store = AttachmentStore(path)
    store.open()
    try:
        assert store.current("agent:main:s") is None
        assert store.current("agent:main:junk") is None
        assert store.current("agent:main:other") is None
        assert [(a.attachment_id, a.status) for a in store.lineage("agent:main:s")] == [
            ("att_1", "superseded"),
            ("att_2", "current"),
        ]
        assert store.max_token() == 99
        store.attach(record("att_3", session_id="s-3", token=100), supersede_reason="fresh")
        current = store.current("agent:main:s")
        assert current is not None
        assert current.attachment_id == "att_3"
    finally:
        store.close()


def test_an_unreadable_file_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "agent_sessions.sqlite3"
    path.write_bytes(b"not a database" * 100)
    store = AttachmentStore(path)
    store.open()
    try:
        assert store.moved_aside is not None
        assert store.moved_aside.read_bytes() == b"not a database" * 100
        assert store.current("agent:main:s") is None
    finally:
        store.close()

"""The durable job store: records, logs, the busy rule, durability across reopen, corruption handling, one writer."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawstack.connect import Job, JobStore, JobStoreError, SessionBusyError


def make_job(n: int, *, session: str = "agent:main:channel:clawconnect:s", at: int = 1000) -> Job:
    return Job(
        job_id=f"job_{n}",
        task_id=f"task_{n}",
        run_id=f"run-{n}",
        agent="a",
        openclaw_agent_id="main",
        session_key=session,
        created_at_ms=at + n,
        updated_at_ms=at + n,
        prompt={"task": f"task text {n}"},
        message=f"task text {n}",
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    jobs = JobStore(tmp_path / "connect" / "jobs.sqlite3")
    jobs.open()
    try:
        yield jobs
    finally:
        jobs.close()


def test_create_get_and_update(store: JobStore) -> None:
    job = store.create(make_job(1))
    assert store.get("job_1") == job
    assert store.get_by_task("task_1") == job
    done = store.update(dataclasses.replace(job, status="completed", summary="ok", updated_at_ms=5000))
    assert store.get("job_1") == done
    assert store.running() == []


def test_a_busy_session_refuses_a_second_job_and_changes_nothing(store: JobStore) -> None:
    store.create(make_job(1))
    with pytest.raises(SessionBusyError) as info:
        store.create(make_job(2))
    assert info.value.code == "session_busy"
    assert info.value.data["activeJobId"] == "job_1"
    assert store.count() == 1
    store.create(make_job(3, session="agent:main:channel:clawconnect:other"))
    store.update(dataclasses.replace(store.get("job_1") or make_job(0), status="error"))
    store.create(make_job(4))
    assert store.count() == 3


def test_logs_are_numbered_per_job_and_ordered_per_session(store: JobStore) -> None:
    job = store.create(make_job(1))
    job = store.append_log(job, "agent", "one", 2000)
    job = store.append_log(job, "tool", "two", 2001)
    assert job.log_count == 2
    assert store.get("job_1") == job
    assert [(e.index, e.message) for e in store.logs("job_1")] == [(0, "one"), (1, "two")]
    assert [e.message for e in store.logs("job_1", since_index=1)] == ["two"]
    events = store.session_logs(job.session_key, after=None, limit=1)
    assert [e.message for e in events] == ["two"]
    assert [e.message for e in store.session_logs(job.session_key, after=events[0].seq - 1, limit=5)] == ["two"]


def test_the_final_log_line_and_the_status_are_one_write(store: JobStore) -> None:
    job = store.create(make_job(1))
    store.append_log(dataclasses.replace(job, status="completed"), "end", "done", 3000)
    assert store.running() == []
    stored = store.get("job_1")
    assert stored is not None
    assert stored.status == "completed"


def test_jobs_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    first = JobStore(path)
    first.open()
    first.create(make_job(1))
    first.close()
    second = JobStore(path)
    second.open()
    try:
        assert [job.job_id for job in second.running()] == ["job_1"]
    finally:
        second.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o700


def test_one_writer(tmp_path: Path, store: JobStore) -> None:
    other = JobStore(store.path)
    with pytest.raises(JobStoreError) as info:
        other.open()
    assert info.value.code == "job_store_locked"


def test_recent_and_sessions(store: JobStore) -> None:
    for n in range(5):
        job = store.create(make_job(n, session=f"agent:main:channel:clawconnect:s{n % 2}"))
        if n < 3:
            store.update(dataclasses.replace(job, status="completed"))
    jobs, total = store.recent(active_only=False, limit=2)
    assert ([j.job_id for j in jobs], total) == (["job_4", "job_3"], 5)
    active, count = store.recent(active_only=True, limit=10)
    assert ({j.job_id for j in active}, count) == ({"job_3", "job_4"}, 2)
    sessions = store.sessions(limit=10)
    assert [(key[-2:], n, job.job_id) for key, n, job in sessions] == [("s0", 3, "job_4"), ("s1", 2, "job_3")]


def test_a_corrupt_store_is_moved_aside_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    garbage = b"this is not a database" * 100
    path.write_bytes(garbage)
    store = JobStore(path)
    store.open()
    try:
        assert store.moved_aside is not None
        assert store.moved_aside.read_bytes() == garbage
        assert store.moved_aside.name.startswith("jobs.sqlite3.corrupt-")
        assert store.problem is None
        store.create(make_job(1))
        assert store.count() == 1
    finally:
        store.close()


def test_a_corrupt_store_that_cannot_be_moved_aside_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    garbage = b"SQLite format 3\x00" + b"\xff" * 4096
    path.write_bytes(garbage)

    def refuse(source: Path, target: Path) -> None:
        raise PermissionError(13, "Permission denied")

    store = JobStore(path, rename=refuse)
    store.open()
    try:
        assert store.moved_aside is None
        assert store.problem is not None
        assert "could not be moved aside" in store.problem
        for attempt in (lambda: store.create(make_job(1)), store.running, lambda: store.get("job_1")):
            with pytest.raises(JobStoreError) as info:
                attempt()
            assert info.value.code == "job_store_corrupt"
    finally:
        store.close()
    assert path.read_bytes() == garbage

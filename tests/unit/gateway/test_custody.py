"""The child store's plugin ownership (schema version 2), and the upgrade of a version-1 file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from clawstack.gateway.custody import ChildRecord, ChildStore, PluginOwner


def child(run_id: str, *, created: int, parent_run: str = "turn-1", session_id: str = "s1") -> ChildRecord:
    return ChildRecord(
        run_id=run_id,
        child_key=f"agent:main:subagent:{run_id}",
        agent_id="main",
        parent_key="agent:main:main",
        parent_session_id=session_id,
        parent_run_id=parent_run,
        depth=1,
        label=None,
        task_name=None,
        context="isolated",
        blind=False,
        cleanup="keep",
        model="fake/fake-model",
        created_at_ms=created,
    )


def test_plugin_ownership_is_recorded_with_the_child_and_read_back(tmp_path: Path) -> None:
    store = ChildStore(tmp_path / "children.sqlite3")
    store.open()
    try:
        store.add(child("a", created=1), plugin=PluginOwner("reviewer", "req", "sha256:x"))
        store.add(child("b", created=2), plugin=PluginOwner("reviewer", None, "sha256:y"))
        store.add(child("c", created=2), plugin=PluginOwner("other", None, "sha256:z"))
        store.add(child("d", created=3))  # a sessions_spawn child: no plugin owns it
        store.add(child("e", created=4, session_id="s0"), plugin=PluginOwner("reviewer", None, "sha256:w"))
        found = store.plugin_request("reviewer", "turn-1", "req")
        assert found is not None
        assert (found[0].run_id, found[1]) == ("a", "sha256:x")
        assert store.plugin_request("reviewer", "turn-2", "req") is None
        assert store.plugin_request("other", "turn-1", "req") is None
        assert store.plugin_owner("d") is None
        assert store.plugin_owner("c") == PluginOwner("other", None, "sha256:z")
        listed = store.plugin_children("reviewer", "agent:main:main", "s1", limit=200)
        assert [(record.run_id, request) for record, request in listed] == [("b", None), ("a", "req")]
        assert [r.run_id for r, _ in store.plugin_children("reviewer", "agent:main:main", "s1", limit=1)] == ["b"]
        store.complete("a", "done", result="ok", error=None, usage=None, ended_at_ms=5)
        done = store.plugin_children("reviewer", "agent:main:main", "s1", status="done", limit=1)
        assert [r.run_id for r, _ in done] == ["a"]  # the filter applies before the bound
        queued = store.plugin_children("reviewer", "agent:main:main", "s1", status="queued", limit=200)
        assert [r.run_id for r, _ in queued] == ["b"]
    finally:
        store.close()


def test_a_version_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "children.sqlite3"
    store = ChildStore(path)
    store.open()
    store.add(child("old", created=1))
    store.close()
    with sqlite3.connect(path) as db:  # make it a version-1 file: no plugin_children table
        db.execute("DROP TABLE plugin_children")
        db.execute("PRAGMA user_version=1")
    store = ChildStore(path)
    store.open()
    try:
        record = store.get("old")
        assert record is not None
        assert (record.parent_run_id, record.execution) == ("turn-1", "queued")
        assert store.plugin_owner("old") is None
        store.add(child("new", created=2), plugin=PluginOwner("reviewer", None, "sha256:n"))
        assert store.plugin_owner("new") == PluginOwner("reviewer", None, "sha256:n")
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2

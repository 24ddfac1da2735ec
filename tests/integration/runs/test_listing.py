"""GET /v1/runs over the real socket: newest first, filters applied before the bound, cursors that visit every run
exactly once while runs are still being admitted, the 500-run page, entries equal to the single status read, no
task text, and every malformed query refused with request_invalid.

Runs the listing does not need to watch working are written straight into the supervisor's ledger (terminal or
not, with chosen timestamps); runs that must be admitted while a client pages are launched for real.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from clawstack.pod.artifacts import PodPaths
from clawstack.runs.ledger import RunRecord
from tests.unit.runs.test_listing import make_record, write_v1_ledger

from .conftest import RunsStack

SECRET = "confidential-listing-task-7f3a"


def seed(
    stack: RunsStack,
    run_id: str,
    *,
    installation: str = "acme",
    state: str = "stopped",
    accepted_at: str = "2025-06-01T10:00:00Z",
    **fields: Any,
) -> RunRecord:
    record = make_record(run_id, installation=installation, state=state, accepted_at=accepted_at)
    record.spec = {"template": "worker", "task": f"{SECRET} {run_id}"}
    for name, value in fields.items():
        setattr(record, name, value)
    stack.supervisor.ledger.insert(record)
    return record


def key(status: dict[str, Any]) -> tuple[str, str]:
    return status["installation"], status["run_id"]


async def page(stack: RunsStack, **query: Any) -> dict[str, Any]:
    resp = await stack.call("GET", "/v1/runs" + ("?" + urlencode(query) if query else ""))
    assert resp.status == 200, resp.body
    assert SECRET.encode() not in resp.body
    body: dict[str, Any] = resp.json()
    assert set(body) == {"runs", "next_cursor"}
    return body


async def every_page(stack: RunsStack, **query: Any) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    cursor = None
    while True:
        body = await page(stack, **query, **({"cursor": cursor} if cursor else {}))
        runs.extend(body["runs"])
        cursor = body["next_cursor"]
        if cursor is None:
            return runs


async def launch(stack: RunsStack, run_id: str) -> None:
    resp = await stack.call("POST", "/v1/runs", stack.launch_body(run_id, f"{SECRET}\n@fake reply: listed"))
    assert resp.status == 202, resp.body


async def wait_stopped(stack: RunsStack, run_ids: list[str]) -> None:
    for run_id in run_ids:
        done = (await stack.call("GET", f"/v1/runs/acme/{run_id}?wait=stopped&timeout=60s")).json()
        assert done["state"] == "stopped", done


async def test_newest_first_each_entry_the_single_status_and_never_the_task(stack: RunsStack) -> None:
    for i, accepted_at in enumerate(["2025-06-01T10:00:00Z", "2025-06-03T10:00:00Z", "2025-06-02T10:00:00Z"]):
        seed(stack, f"old-{i}", accepted_at=accepted_at, state="failed", failure="timeout")
    for installation, run_id in (("acme", "tie-b"), ("acme", "tie-a"), ("beta", "tie-a"), ("zulu", "tie-0")):
        seed(stack, run_id, installation=installation, accepted_at="2025-06-02T12:00:00Z")
    seed(stack, "mid-run", state="running", accepted_at="2025-06-04T00:00:00Z", started_at="2025-06-04T00:00:01Z")
    launched = ["new-c", "new-b", "new-a"]  # admitted in the reverse order of their run ids
    for run_id in launched:
        await launch(stack, run_id)
    await wait_stopped(stack, launched)
    body = await page(stack)
    runs = body["runs"]
    assert body["next_cursor"] is None
    assert len(runs) == 11
    assert [s["accepted_at"] for s in runs] == sorted((s["accepted_at"] for s in runs), reverse=True)
    # Admitted now, most likely within one second: the one admitted last first, whatever their run ids.
    assert [key(s) for s in runs[:3]] == [("acme", r) for r in reversed(launched)]
    # Within one accepted_at, the run admitted last comes first: total and repeatable.
    assert [key(s) for s in runs[3:]] == [
        ("acme", "mid-run"),
        ("acme", "old-1"),
        ("zulu", "tie-0"),
        ("beta", "tie-a"),
        ("acme", "tie-a"),
        ("acme", "tie-b"),
        ("acme", "old-2"),
        ("acme", "old-0"),
    ]
    for status in runs:
        single = await stack.call("GET", f"/v1/runs/{status['installation']}/{status['run_id']}")
        assert status == single.json()
    assert body == await page(stack)  # the same ledger, the same page


async def test_filters_are_applied_before_the_bound(stack: RunsStack) -> None:
    for i in range(4):
        seed(stack, f"failed-{i}", state="failed", failure="exit_nonzero", accepted_at=f"2025-01-0{i + 1}T00:00:00Z")
    for i in range(30):
        seed(stack, f"beta-{i:02d}", installation="beta", accepted_at=f"2025-03-01T00:00:{i:02d}Z")
    for i in range(20):
        seed(stack, f"acme-{i:02d}", accepted_at=f"2025-02-01T00:00:{i:02d}Z")
    beta = await page(stack, installation="beta", limit=5)
    assert [key(s) for s in beta["runs"]] == [("beta", f"beta-{i:02d}") for i in (29, 28, 27, 26, 25)]
    # The four failed runs are the oldest of 54: bounding first and filtering after would find none.
    failed = await page(stack, state="failed", limit=3)
    assert [s["run_id"] for s in failed["runs"]] == ["failed-3", "failed-2", "failed-1"]
    assert failed["next_cursor"] is not None
    rest = await page(stack, state="failed", limit=3, cursor=failed["next_cursor"])
    assert ([s["run_id"] for s in rest["runs"]], rest["next_cursor"]) == (["failed-0"], None)
    both = await page(stack, installation="acme", state="failed", limit=4)
    assert ([s["run_id"] for s in both["runs"]], both["next_cursor"]) == ([f"failed-{i}" for i in (3, 2, 1, 0)], None)
    assert all(s["state"] == "stopped" for s in (await every_page(stack, state="stopped")))
    assert len(await every_page(stack, installation="acme", limit=7)) == 24
    assert await page(stack, installation="nobody") == {"runs": [], "next_cursor": None}
    assert await page(stack, state="revoking") == {"runs": [], "next_cursor": None}


async def test_cursors_visit_every_run_exactly_once_while_runs_are_admitted(stack: RunsStack) -> None:
    seeded = set()
    for i in range(150):
        installation = ("acme", "beta", "gamma")[i % 3]
        seed(stack, f"s-{i:03d}", installation=installation, accepted_at=f"2025-05-01T00:00:0{i % 4}Z")
        seeded.add((installation, f"s-{i:03d}"))
    launched: list[str] = []
    visited: list[tuple[str, str]] = []
    cursor = None
    while True:
        run_id = f"during-{len(launched)}"
        await launch(stack, run_id)  # a new run admitted between every two pages
        launched.append(run_id)
        body = await page(stack, limit=9, **({"cursor": cursor} if cursor else {}))
        visited.extend(key(s) for s in body["runs"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(visited) == len(set(visited)), "a run was listed twice"
    assert seeded <= set(visited), "a run was skipped"
    assert set(visited) - seeded <= {("acme", r) for r in launched}
    assert len(launched) >= 17
    await wait_stopped(stack, launched)
    listed = await every_page(stack, limit=500)
    assert {key(s) for s in listed} == seeded | {("acme", r) for r in launched}


async def test_a_page_holds_100_runs_by_default_and_at_most_500(stack: RunsStack) -> None:
    for i in range(620):
        seed(stack, f"bulk-{i:04d}", accepted_at=f"2025-04-01T00:{i // 60:02d}:{i % 60:02d}Z")
    default = await page(stack)
    assert len(default["runs"]) == 100
    assert default["runs"][0]["run_id"] == "bulk-0619"
    assert default["next_cursor"] is not None
    full = await page(stack, limit=500)
    assert len(full["runs"]) == 500
    last = await page(stack, limit=500, cursor=full["next_cursor"])
    assert (len(last["runs"]), last["next_cursor"]) == (120, None)
    assert last["runs"][-1]["run_id"] == "bulk-0000"
    exact = await page(stack, limit=120, cursor=full["next_cursor"])
    assert exact["next_cursor"] is None  # the last page has no cursor, even when it is exactly full
    over = await stack.call("GET", "/v1/runs?limit=501")
    assert (over.status, over.json()["error"]["code"]) == (400, "request_invalid")


BAD_QUERIES: list[tuple[str, str]] = [
    ("unknown parameter", "?wait=stopped"),
    ("unknown parameter beside good ones", "?limit=5&offset=10"),
    ("parameter names are case-sensitive", "?Limit=5"),
    ("repeated limit", "?limit=5&limit=5"),
    ("repeated state", "?state=running&state=failed"),
    ("repeated installation", "?installation=acme&installation=acme"),
    ("limit zero", "?limit=0"),
    ("limit 501", "?limit=501"),
    ("negative limit", "?limit=-1"),
    ("signed limit", "?limit=%2B5"),
    ("fractional limit", "?limit=2.5"),
    ("limit word", "?limit=all"),
    ("empty limit", "?limit="),
    ("bare limit", "?limit"),
    ("limit with a trailing parameter glued on", "?limit=5;state=running"),
    ("unknown state", "?state=cancelled"),
    ("state in capitals", "?state=STOPPED"),
    ("empty state", "?state="),
    ("bad installation", "?installation=Acme"),
    ("installation with a slash", "?installation=acme%2Fbeta"),
    ("installation too long", "?installation=" + "a" * 65),
    ("empty installation", "?installation="),
    ("garbage cursor", "?cursor=not-a-cursor"),
    ("cursor outside the alphabet", "?cursor=%FF%FE"),
    ("empty cursor", "?cursor="),
    ("invalid percent-encoding", "?cursor=%zz"),
]


async def test_bad_queries_are_refused(stack: RunsStack) -> None:
    seed(stack, "present")
    before = await page(stack)
    for name, query in BAD_QUERIES:  # one supervisor for the whole table: each case is one request
        resp = await stack.call("GET", "/v1/runs" + query)
        body = resp.json()
        assert (resp.status, body["error"]["code"]) == (400, "request_invalid"), (name, body)
        assert set(body) == {"error", "run"}, name
        assert body["run"] is None, name
        assert set(body["error"]) == {"code", "message"}, name
        assert SECRET.encode() not in resp.body
    assert await page(stack) == before


async def test_edited_and_foreign_cursors_are_refused(stack: RunsStack) -> None:
    for i in range(5):
        seed(stack, f"c-{i}", accepted_at=f"2025-06-01T10:00:0{i}Z")
    cursor = (await page(stack, limit=2))["next_cursor"]
    assert isinstance(cursor, str)
    for edited in (cursor[:-1], cursor + "A", cursor + "==", cursor.upper(), cursor[::-1]):
        resp = await stack.call("GET", "/v1/runs?" + urlencode({"cursor": edited}))
        assert (resp.status, resp.json()["error"]["code"]) == (400, "request_invalid"), edited
    assert [s["run_id"] for s in (await page(stack, limit=2, cursor=cursor))["runs"]] == ["c-2", "c-1"]


async def test_a_version_1_ledger_is_migrated_and_listed(stack: RunsStack) -> None:
    await stack.server.stop()
    runs_dir = PodPaths(stack.pod.resolve()).runs
    for suffix in ("", "-wal", "-shm"):
        (runs_dir / f"ledger.sqlite3{suffix}").unlink(missing_ok=True)
    old = [
        make_record("v1-a", accepted_at="2025-06-01T10:00:00Z", state="failed"),
        make_record("v1-b", accepted_at="2025-06-02T10:00:00Z"),
        make_record("v1-c", installation="beta", accepted_at="2025-06-02T10:00:00Z"),
    ]
    write_v1_ledger(runs_dir / "ledger.sqlite3", old)
    await stack.restart()
    body = await every_page(stack, limit=2)
    assert [key(s) for s in body] == [("beta", "v1-c"), ("acme", "v1-b"), ("acme", "v1-a")]
    for status in body:
        assert status == (await stack.call("GET", f"/v1/runs/{status['installation']}/{status['run_id']}")).json()
    await launch(stack, "after-migration")
    await wait_stopped(stack, ["after-migration"])
    assert (await page(stack, limit=1))["runs"][0]["run_id"] == "after-migration"

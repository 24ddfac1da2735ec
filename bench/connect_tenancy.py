"""What do ClawConnect's ownership checks cost? (1) ``run_task`` -> terminal ``check_task`` over MCP (stdio, the
official client) in a new session, continuing a short name and continuing a full key, against the gateway's own
``chat.send`` -> ``final`` and, with ``--baseline-src``, against the same calls served by another source tree of
clawstack (the code before the checks, say a ``git worktree``), same gateway, same run. (2) The per-call cost of
the owner lookups with 10,000 jobs of three callers in the store: a session's owner record and the owner-scoped
queries every read makes, against the same lookups unscoped and against a job's primary-key read.

Run: .venv/bin/python bench/connect_tenancy.py [--runs 30] [--calls 2000] [--stored 10000] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from connect_overhead import call, connect_session, direct_runs, gateway
from mcp.client.session import ClientSession

from clawstack.connect.jobs import Job, JobStore

TASK = "@fake reply: pong"
CALLERS = ("user:Alice", "user:Bob", "public")


async def task_runs(url: str, data_dir: Path, runs: int, source: Path | None, label: str) -> dict[str, float]:
    """Medians of run_task -> terminal check_task: a new session, an owned short name, an owned full key (each
    pass in gateway sessions of its own, ``label`` naming them, so that no pass continues a longer transcript)."""
    samples: dict[str, list[float]] = {"new session": [], "short name": [], "full key": []}
    async with connect_session(url, data_dir, source) as session:
        name_key = f"bench-{label}-name"
        full_key = (await until_terminal(session, {"task": TASK, "sessionKey": f"bench-{label}-key"}))["sessionKey"]
        await until_terminal(session, {"task": TASK, "sessionKey": name_key})
        for _ in range(runs):
            for name, extra in (
                ("new session", {}),
                ("short name", {"sessionKey": name_key}),
                ("full key", {"sessionKey": full_key}),
            ):
                started = time.perf_counter()
                snap = await until_terminal(session, {"task": TASK, **extra})
                samples[name].append(time.perf_counter() - started)
                assert snap["summary"] == "pong", snap
    return {name: statistics.median(values) for name, values in samples.items()}


async def until_terminal(session: ClientSession, arguments: dict[str, Any]) -> dict[str, Any]:
    job = await call(session, "run_task", arguments)
    while True:
        snap = await call(session, "check_task", {"jobId": job["jobId"], "waitMs": 10000})
        if snap["isTerminal"]:
            return snap


def seed(path: Path, count: int) -> None:
    """``count`` ended jobs of three callers in 1,000 sessions (each session one caller's)."""
    store = JobStore(path)
    store.open()
    try:
        now = int(time.time() * 1000)
        for n in range(count):
            session = n % 1000
            store.create(
                Job(
                    job_id=f"job_bench{n:06d}",
                    task_id=f"task_bench{n:06d}",
                    run_id=str(uuid.uuid4()),
                    agent="openclaw",
                    openclaw_agent_id="main",
                    session_key=f"agent:main:channel:clawconnect:bench{session}",
                    created_at_ms=now - count + n,
                    updated_at_ms=now - count + n,
                    status="completed",
                    summary="s" * 800,
                    caller=CALLERS[session % len(CALLERS)],
                )
            )
            store.append_log(store.get(f"job_bench{n:06d}"), "end", "ended", now)  # type: ignore[arg-type]
    finally:
        store.close()


def lookups(path: Path, calls: int) -> dict[str, float]:
    """Median seconds per store call, with and without the owner scope."""
    store = JobStore(path)
    store.open()
    key, owner = "agent:main:channel:clawconnect:bench3", CALLERS[3 % len(CALLERS)]
    cases: dict[str, Callable[[], Any]] = {
        "job by id (baseline)": lambda: store.get("job_bench005003"),
        "session owner": lambda: store.session_owner(key),
        "session jobs, unscoped": lambda: store.for_session(key),
        "session jobs, owner": lambda: store.for_session(key, owner),
        "session log tail, unscoped": lambda: store.session_logs(key, after=None, limit=50),
        "session log tail, owner": lambda: store.session_logs(key, after=None, limit=50, scope=owner),
        "100 newest, unscoped": lambda: store.recent(active_only=False, limit=100),
        "100 newest, owner": lambda: store.recent(active_only=False, limit=100, scope=owner),
        "sessions, unscoped": lambda: store.sessions(limit=100),
        "sessions, owner": lambda: store.sessions(limit=100, scope=owner),
    }
    try:
        timings: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(calls):
            for name, case in cases.items():
                started = time.perf_counter()
                case()
                timings[name].append(time.perf_counter() - started)
    finally:
        store.close()
    return {name: statistics.median(values) for name, values in timings.items()}


async def bench(runs: int, calls: int, stored: int, baseline_src: Path | None) -> None:
    root = Path(tempfile.mkdtemp(prefix="cc-tenancy-bench-"))
    try:
        with gateway(root) as url:
            direct = statistics.median(await direct_runs(url, runs))
            # The baseline first, so that the checks never run on the warmer gateway.
            before = await task_runs(url, root / "baseline", runs, baseline_src, "b") if baseline_src else None
            checked = await task_runs(url, root / "checked", runs, None, "c")
        print(f"\nrun_task -> terminal check_task over stdio ({runs} runs each; medians)")
        print(f"  gateway chat.send -> final      {direct * 1e3:8.2f} ms")
        for name, value in checked.items():
            line = f"  {name:<13} with the checks {value * 1e3:8.2f} ms   {value / direct:5.2f}x direct"
            if before is not None:
                line += f"   {value / before[name]:5.3f}x baseline ({before[name] * 1e3:.2f} ms)"
            print(line)
        path = root / "many" / "jobs.sqlite3"
        seed(path, stored)
        medians = lookups(path, calls)
        base = medians["job by id (baseline)"]
        print(f"\nstore calls with {stored} jobs of {len(CALLERS)} callers ({calls} calls; medians)")
        for name, value in medians.items():
            print(f"  {name:<28} {value * 1e6:9.1f} us   {value / base:6.2f}x job by id")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--stored", type=int, default=10_000)
    parser.add_argument("--baseline-src", type=Path, help="another clawstack checkout to serve the baseline from")
    args = parser.parse_args()
    asyncio.run(bench(args.runs, args.calls, args.stored, args.baseline_src))


if __name__ == "__main__":
    main()

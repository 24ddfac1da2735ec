"""How many durable admissions per second can the supervisor make? Sequential POST /v1/runs over its Unix socket,
each answered only after the run's record is committed (SQLite WAL, synchronous=FULL), against a bare SQLite
insert+commit with fsync in the same run. The pod's proxy runs for real; workers are not started (a backend
that records spawns and reports an instant answer), so the figure is the supervisor's own cost.

Run: .venv/bin/python bench/runs_admission.py [--runs 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from clawstack.common.clock import SystemClock
from clawstack.common.digest import spec_digest
from clawstack.common.uds import AsyncUnixClient
from clawstack.llm.fake import FakeModelServer
from clawstack.pod.up import down, up
from clawstack.runs.backends.base import Isolation, RunLabels, WorkerSpec, WorkerState
from clawstack.runs.server import RunsServer
from clawstack.runs.supervisor import Supervisor

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pod"


class InstantBackend:
    """Every worker 'answers' at once: isolates the supervisor's own work from sandbox start-up."""

    isolation: Isolation = "none"

    def __init__(self) -> None:
        self.spawned: set[RunLabels] = set()

    async def spawn(self, spec: WorkerSpec) -> None:
        self.spawned.add(spec.labels)

    async def inspect(self, labels: RunLabels) -> WorkerState:
        exists = labels in self.spawned
        return WorkerState(
            exists=exists,
            running=False,
            exit_code=0 if exists else None,
            timed_out=False,
            stdout="\n🦞 ok\n".encode() if exists else b"",
            stdout_truncated=False,
            isolation="none",
        )

    async def remove(self, labels: RunLabels) -> None:
        self.spawned.discard(labels)

    async def list_workers(self) -> Sequence[RunLabels]:
        return sorted(self.spawned, key=lambda labels: (labels.installation, labels.run_id))


def sqlite_baseline(path: Path, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT)")
    payload = "x" * 1200  # about the size of a run record
    start = time.perf_counter()
    for i in range(n):
        db.execute("INSERT INTO t VALUES (?, ?)", (f"{time.time_ns()}-{i}", payload))
    elapsed = time.perf_counter() - start
    db.close()
    return n / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    os.chmod(base, 0o700)
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    sock = base / "sock"
    sock.mkdir(mode=0o700)
    try:
        async with FakeModelServer() as fake:
            await asyncio.to_thread(up, pod, detach=True, environ={"CLAW_FAKE_LLM_URL": fake.base_url})
            authority = (SystemClock().now() + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
            rates: dict[str, list[float]] = {"admission only": [], "admission while every run is driven": []}
            baselines: list[float] = []
            for index, label in enumerate(rates):
                supervisor = Supervisor(pod, InstantBackend())
                if label == "admission only":
                    supervisor.drive = lambda key: None  # type: ignore[method-assign]  # admission alone
                server = RunsServer(supervisor, sock)
                await server.start()
                async with AsyncUnixClient(sock / "runs.sock") as client:
                    for repeat in range(args.repeats):
                        start = time.perf_counter()
                        for i in range(args.runs):
                            spec = {"template": "worker", "task": f"task {index}-{repeat}-{i}"}
                            body = {
                                "installation": "bench",
                                "run_id": f"r{index}-{repeat}-{i}",
                                "generation": 1,
                                "spec_digest": spec_digest(spec),
                                "spec": spec,
                                "authority_expires_at": authority,
                            }
                            resp = await client.request("POST", "/v1/runs", json_body=body)
                            assert resp.status == 202, resp.body
                        rates[label].append(args.runs / (time.perf_counter() - start))
                        baselines.append(await asyncio.to_thread(sqlite_baseline, base / "baseline.sqlite3", args.runs))
                await server.stop()
            await asyncio.to_thread(down, pod)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    baseline = statistics.median(baselines)
    print(f"{args.repeats} repetitions x {args.runs} sequential launches; medians")
    print(f"{'bare SQLite insert+commit with fsync':<40} {baseline:8.0f} /s")
    for label, values in rates.items():
        rate = statistics.median(values)
        print(f"{label:<40} {rate:8.0f} /s  ({rate / baseline:.2f}x the bare commit rate)")


if __name__ == "__main__":
    asyncio.run(main())

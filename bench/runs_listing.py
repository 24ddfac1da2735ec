"""What does listing runs cost with 10,000 runs in the ledger? The latency of the first page of GET /v1/runs (the
default 100 runs, and limit=500) against a single GET /v1/runs/{installation}/{run_id} status read, in one run, on
the supervisor's Unix socket. Also shown: a filtered first page and a page deep in the ledger (reached by cursor),
which keyset paging should keep as cheap as the first.

The 10,000 runs are written straight into the ledger before the supervisor starts (one transaction, through
:meth:`Ledger.insert`), all terminal, so no driver runs: the figures are the cost of reading and answering, not of
admission (bench/runs_admission.py measures that). The pod's proxy runs for real (`claw up`, needed for the
supervisor's start-up self-test); the backend never has a worker. Each figure is the median of the per-repetition
medians, the requests of the kinds measured interleaved.

Run: .venv/bin/python bench/runs_listing.py [--runs 10000] [--repeats 5] [--samples 40]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _backends import NoWorkers

from clawstack.common.clock import format_timestamp
from clawstack.common.uds import AsyncUnixClient
from clawstack.llm.fake import FakeModelServer
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.up import down, up
from clawstack.runs.ledger import Ledger, RunRecord
from clawstack.runs.server import RunsServer
from clawstack.runs.supervisor import Supervisor

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pod"
INSTALLATIONS = [f"inst-{i}" for i in range(10)]


def seed(pod: Path, n: int) -> tuple[str, str]:
    """``n`` terminal runs, one accepted per second (several installations, some failed); returns a key in the
    middle, for the single status read."""
    ledger = Ledger(PodPaths(pod.resolve()).runs)
    ledger.open()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    db = ledger._conn()  # one transaction for the whole seed: a bench shortcut, not an API
    db.execute("BEGIN")
    for i in range(n):
        accepted = start + timedelta(seconds=i)
        ledger.insert(
            RunRecord(
                installation=INSTALLATIONS[i % len(INSTALLATIONS)],
                run_id=f"run-{i:06d}",
                generation=1,
                spec_digest="sha256:" + "ab" * 32,
                spec={"template": "worker", "task": f"Summarize ticket {i} " + "x" * 160},
                template="worker",
                template_id="sha256:" + "cd" * 32,
                models=[{"slot": "primary", "ref": "local/fake-model"}],
                tools=["ticket-api.get_ticket"],
                authority_expires_at=format_timestamp(accepted + timedelta(minutes=30)),
                accepted_at=format_timestamp(accepted),
                state="failed" if i % 7 == 0 else "stopped",
                failure="exit_nonzero" if i % 7 == 0 else None,
                run_agent_id=f"run-agent-{i:06d}",
                revoked=True,
                revocation_proof="cllama_ack",
                exit_code=1 if i % 7 == 0 else 0,
                result_bytes=None if i % 7 == 0 else 120,
                deadline=format_timestamp(accepted + timedelta(minutes=15)),
                started_at=format_timestamp(accepted + timedelta(seconds=1)),
                exited_at=format_timestamp(accepted + timedelta(seconds=20)),
                ended_at=format_timestamp(accepted + timedelta(seconds=21)),
                isolation="none",
                spawned=True,
            )
        )
    db.execute("COMMIT")
    ledger.close()
    middle = n // 2
    return INSTALLATIONS[middle % len(INSTALLATIONS)], f"run-{middle:06d}"


async def measure(client: AsyncUnixClient, paths: dict[str, str], repeats: int, samples: int) -> dict[str, float]:
    per_repeat: dict[str, list[float]] = {label: [] for label in paths}
    sizes: dict[str, int] = {}
    for _ in range(repeats):
        times: dict[str, list[float]] = {label: [] for label in paths}
        for _ in range(samples):
            for label, path in paths.items():  # interleaved, so drift hits every kind alike
                start = time.perf_counter()
                resp = await client.request("GET", path)
                times[label].append(time.perf_counter() - start)
                assert resp.status == 200, resp.body[:200]
                sizes[label] = len(resp.body)
        for label, values in times.items():
            per_repeat[label].append(statistics.median(values))
    for label in paths:
        print(f"  {label:<44} {sizes[label] / 1024:8.1f} KiB")
    return {label: statistics.median(values) for label, values in per_repeat.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=40)
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
            try:
                started = time.perf_counter()
                installation, run_id = await asyncio.to_thread(seed, pod, args.runs)
                print(f"seeded {args.runs:,} runs in {time.perf_counter() - started:.1f} s")
                server = RunsServer(Supervisor(pod, NoWorkers()), sock)
                await server.start()
                try:
                    async with AsyncUnixClient(sock / "runs.sock") as client:
                        deep_cursor = (await client.request("GET", "/v1/runs?limit=500")).json()["next_cursor"]
                        for _ in range(args.runs // 500 - 2):  # the cursor of a page near the oldest runs
                            body = (await client.request("GET", f"/v1/runs?limit=500&cursor={deep_cursor}")).json()
                            deep_cursor = body["next_cursor"]
                        paths = {
                            "single status read (baseline)": f"/v1/runs/{installation}/{run_id}",
                            "first page, default limit (100)": "/v1/runs",
                            "first page, limit=500": "/v1/runs?limit=500",
                            "first page, installation filter (100)": f"/v1/runs?installation={installation}",
                            "deep page by cursor (100)": f"/v1/runs?cursor={deep_cursor}",
                        }
                        for path in paths.values():  # warm up: caches, connection
                            await client.request("GET", path)
                        print("response sizes:")
                        medians = await measure(client, paths, args.repeats, args.samples)
                finally:
                    await server.stop()
            finally:
                await asyncio.to_thread(down, pod)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    baseline = medians["single status read (baseline)"]
    print(
        f"{args.runs:,} runs in the ledger; {args.repeats} repetitions x {args.samples} requests of each kind, "
        "interleaved; medians"
    )
    for label, value in medians.items():
        ratio = "" if value is baseline else f"  ({value / baseline:.1f}x the single status read)"
        print(f"{label:<44} {value * 1e3:8.2f} ms{ratio}")


if __name__ == "__main__":
    asyncio.run(main())

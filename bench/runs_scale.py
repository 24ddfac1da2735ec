"""How does the supervisor hold up at scale? (1) Memory and CPU of `claw runs serve` while 1,000 long-polls wait
on a running run, against the same process idle; (2) start-up time (lock, self-test, orphan check, reconcile)
with 10,000 runs in the ledger, against an empty ledger.

Run: .venv/bin/python bench/runs_scale.py [--polls 1000] [--ledger 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import aiohttp
from _backends import NoWorkers

from clawstack.common.clock import SystemClock
from clawstack.common.digest import spec_digest
from clawstack.common.uds import AsyncUnixClient
from clawstack.llm.fake import FakeModelServer
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.up import down, up
from clawstack.runs.ledger import Ledger, RunRecord
from clawstack.runs.supervisor import Supervisor

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pod"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def long_polls(pod: Path, base: Path, polls: int) -> None:
    sock = base / "sock"
    sock.mkdir(mode=0o700)
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawstack", "runs", "serve", "--pod", str(pod), "--socket-dir", str(sock)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("runs listening")
    try:
        spec = {"template": "worker", "task": "@fake reply: slow\n@fake delay-ms: 120000"}
        body = {
            "installation": "bench",
            "run_id": "held",
            "generation": 1,
            "spec_digest": spec_digest(spec),
            "spec": spec,
            "authority_expires_at": (SystemClock().now() + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        async with AsyncUnixClient(sock / "runs.sock") as client:
            assert (await client.request("POST", "/v1/runs", json_body=body)).status == 202
            await client.request("GET", "/v1/runs/bench/held?wait=running&timeout=60s", timeout_s=90)
        idle_rss, idle_cpu = rss_kib(proc.pid), cpu_s(proc.pid)
        time.sleep(5)
        idle_cpu_rate = (cpu_s(proc.pid) - idle_cpu) / 5
        connector = aiohttp.UnixConnector(path=str(sock / "runs.sock"), limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def poll() -> None:
                async with session.get("http://claw/v1/runs/bench/held?wait=stopped&timeout=30s") as resp:
                    await resp.read()

            tasks = [asyncio.create_task(poll()) for _ in range(polls)]
            await asyncio.sleep(3)  # let every poll arrive and park
            held_rss, held_cpu = rss_kib(proc.pid), cpu_s(proc.pid)
            await asyncio.sleep(10)
            held_cpu_rate = (cpu_s(proc.pid) - held_cpu) / 10
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        print(f"{polls} concurrent long-polls on one running run (claw runs serve as its own process):")
        print(
            f"  RSS idle {idle_rss / 1024:.1f} MiB, with the polls {held_rss / 1024:.1f} MiB "
            f"(+{(held_rss - idle_rss) / polls:.1f} KiB per poll)"
        )
        print(f"  CPU idle {idle_cpu_rate * 100:.1f}%, while the polls wait {held_cpu_rate * 100:.1f}% of one core")
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()


async def reconcile(pod: Path, n: int) -> None:
    paths = PodPaths(pod.resolve())

    async def startup() -> float:
        supervisor = Supervisor(pod, NoWorkers())
        start = time.perf_counter()
        await supervisor.start()
        elapsed = time.perf_counter() - start
        await supervisor.stop()
        return elapsed

    shutil.rmtree(paths.runs / "ledger.sqlite3", ignore_errors=True)
    (paths.runs / "ledger.sqlite3").unlink(missing_ok=True)
    empty = min([await startup() for _ in range(3)])
    ledger = Ledger(paths.runs)
    ledger.open()
    db = ledger._conn()
    db.execute("BEGIN")
    for i in range(n):
        record = RunRecord(
            installation="bench",
            run_id=f"old-{i}",
            generation=1,
            spec_digest="sha256:x",
            spec={"template": "worker", "task": "t"},
            template="worker",
            template_id="sha256:y",
            models=[],
            tools=[],
            authority_expires_at="2030-01-01T00:00:00Z",
            accepted_at="2026-01-01T00:00:00Z",
            state="stopped",
        )
        ledger.insert(record)
    db.execute("COMMIT")
    ledger.close()
    full = min([await startup() for _ in range(3)])
    print(
        f"start-up with an empty ledger {empty * 1e3:.0f} ms; with {n:,} runs in it {full * 1e3:.0f} ms "
        f"({full / empty:.2f}x); best of 3, proxy self-test included"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--polls", type=int, default=1000)
    parser.add_argument("--ledger", type=int, default=10000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    os.chmod(base, 0o700)
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    try:
        async with FakeModelServer() as fake:
            await asyncio.to_thread(up, pod, detach=True, environ={"CLAW_FAKE_LLM_URL": fake.base_url})
            try:
                await long_polls(pod, base, args.polls)
                await reconcile(pod, args.ledger)
            finally:
                await asyncio.to_thread(down, pod)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())

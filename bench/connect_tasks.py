"""What do ClawConnect's native MCP tasks cost? Over stdio with the official SDK's session (protocol 2025-11-25),
against the same gateway and scripted model in the same run: (1) a task-augmented ``run_task`` followed by
``tasks/result`` against the gateway's own ``chat.send`` -> ``final`` on a raw WebSocket and against ``run_task`` ->
terminal ``check_task``; (2) ``tasks/get`` and a ``tasks/list`` page with 1,000 stored tasks (ended ones: see
``connect_overhead.seed``) against ``tools/list``; (3) ``tasks/cancel`` of a running task -> its ``cancelled``
answer, against ``chat.abort`` of a run on the raw WebSocket.

Run: .venv/bin/python bench/connect_tasks.py [--runs 30] [--calls 200] [--stored 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from connect_overhead import connect_runs, connect_session, direct_runs, gateway, seed
from mcp.client.session import ClientSession

TASK = "@fake reply: pong"
SLOW = "@fake reply: late\n@fake delay-ms: 30000"


async def raw(session: ClientSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One request as sent and answered on the wire (the session would reshape a task-augmented result)."""
    return await session._dispatcher.send_raw_request(method, params, None)  # type: ignore[attr-defined,no-any-return]


async def native_runs(url: str, data_dir: Path, runs: int) -> list[float]:
    samples = []
    async with connect_session(url, data_dir) as session:
        for _ in range(runs):
            started = time.perf_counter()
            created = await raw(session, "tools/call", {"name": "run_task", "arguments": {"task": TASK}, "task": {}})
            result = await raw(session, "tasks/result", {"taskId": created["task"]["taskId"]})
            samples.append(time.perf_counter() - started)
            assert result["structuredContent"]["summary"] == "pong", result
    return samples


async def task_reads(url: str, data_dir: Path, calls: int, stored: int) -> dict[str, float]:
    async with connect_session(url, data_dir) as session:
        timings: dict[str, list[float]] = {"tools/list": [], "tasks/get": [], "tasks/list page": []}
        for _ in range(calls):
            started = time.perf_counter()
            await session.list_tools()
            timings["tools/list"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await raw(session, "tasks/get", {"taskId": f"job_bench{stored // 2:06d}"})
            timings["tasks/get"].append(time.perf_counter() - started)
            started = time.perf_counter()
            page = await raw(session, "tasks/list", {})
            timings["tasks/list page"].append(time.perf_counter() - started)
            assert len(page["tasks"]) == 50
            assert page.get("nextCursor")
    return {name: statistics.median(values) for name, values in timings.items()}


async def cancels(url: str, data_dir: Path, runs: int) -> list[float]:
    samples = []
    async with connect_session(url, data_dir) as session:
        for _ in range(runs):
            created = await raw(session, "tools/call", {"name": "run_task", "arguments": {"task": SLOW}, "task": {}})
            task_id = created["task"]["taskId"]
            while True:  # until the gateway has the run, so that only the abort is timed
                poll = {"name": "check_task", "arguments": {"jobId": task_id, "mode": "poll"}}
                snap = (await raw(session, "tools/call", poll))["structuredContent"]
                if any("accepted the run" in line.get("message", "") for line in snap.get("logs", [])):
                    break
                await asyncio.sleep(0.02)
            started = time.perf_counter()
            answer = await raw(session, "tasks/cancel", {"taskId": task_id})
            samples.append(time.perf_counter() - started)
            assert answer["status"] == "cancelled", answer
    return samples


async def bench(runs: int, calls: int, stored: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="cc-tasks-bench-"))
    try:
        with gateway(root) as url:
            direct = statistics.median(await direct_runs(url, runs))
            tools = statistics.median(await connect_runs(url, root / "tools", runs))
            native = statistics.median(await native_runs(url, root / "native", runs))
            print(f"\nrun_task -> result ({runs} runs; medians)")
            print(f"  gateway chat.send -> final            {direct * 1e3:9.2f} ms")
            print(f"  run_task -> terminal check_task       {tools * 1e3:9.2f} ms   {tools / direct:5.2f}x")
            print(f"  run_task task -> tasks/result         {native * 1e3:9.2f} ms   {native / direct:5.2f}x")
            many = root / "many"
            seed(many, stored)
            reads = await task_reads(url, many, calls, stored)
            print(f"\nwith {stored} stored tasks ({calls} calls; medians)")
            for name, value in reads.items():
                print(f"  {name:<16} {value * 1e3:9.3f} ms   {value / reads['tools/list']:5.2f}x tools/list")
            cancel = statistics.median(await cancels(url, root / "cancel", max(5, runs // 3)))
            print(f"\ntasks/cancel of a running task -> cancelled: {cancel * 1e3:.2f} ms (median)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--stored", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(bench(args.runs, args.calls, args.stored))


if __name__ == "__main__":
    main()

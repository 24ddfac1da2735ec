"""What does ClawConnect add? (1) ``run_task`` → terminal ``check_task`` over MCP (stdio, the official client)
against the gateway's own ``chat.send`` → ``final`` on a raw WebSocket, same gateway, same scripted model, same run.
(2) ``get_task`` and ``list_tasks`` latency with 10,000 stored tasks, against the same calls on a store of 1 task
and against ``tools/list`` (the MCP round trip alone). Every part is its own process, as in production.

Run: .venv/bin/python bench/connect_overhead.py [--runs 30] [--calls 200] [--stored 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from clawstack.connect.jobs import Job, JobStore

PASSWORD = "bench-gateway-password"
TASK = "@fake reply: pong"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def process(args: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawstack", *args, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()


@contextmanager
def gateway(directory: Path) -> Iterator[str]:
    with process(["fake-llm", "serve"]) as fake_line:
        base_url = fake_line.rsplit(" ", 1)[1]
        port = free_port()
        config = directory / "gateway.json5"
        document = {
            "models": {"providers": {"fake": {"baseUrl": base_url, "apiKey": "k", "models": [{"id": "m"}]}}},
            "agents": {"defaults": {"model": {"primary": "fake/m"}, "maxConcurrent": 4}},
            "gateway": {"port": port, "auth": {"mode": "password", "password": PASSWORD}},
        }
        config.write_text(json.dumps(document))
        args = ["gateway", "serve", "--config", str(config), "--data-dir", str(directory / "gw")]
        with process(args) as line:
            assert line.startswith("gateway listening on "), line
            yield f"ws://127.0.0.1:{port}"


async def direct_runs(url: str, runs: int) -> list[float]:
    """chat.send → the run's final event, on one raw WebSocket (what the gateway itself takes)."""
    samples = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        await ws.receive_json()
        params = {
            "minProtocol": 4,
            "maxProtocol": 4,
            "client": {"id": "gateway-client", "mode": "backend", "version": "bench", "platform": "linux"},
            "role": "operator",
            "scopes": ["operator.admin"],
            "auth": {"password": PASSWORD},
        }
        await ws.send_json({"type": "req", "id": "c", "method": "connect", "params": params})
        assert (await ws.receive_json())["ok"] is True
        for n in range(runs):
            run_id = str(uuid.uuid4())
            key = f"agent:main:channel:bench:{n}"
            started = time.perf_counter()
            frame = {"sessionKey": key, "message": TASK, "idempotencyKey": run_id}
            await ws.send_json({"type": "req", "id": run_id, "method": "chat.send", "params": frame})
            while True:
                msg = await ws.receive_json()
                payload = msg.get("payload") or {}
                if msg.get("event") == "chat" and payload.get("runId") == run_id and payload.get("state") == "final":
                    break
            samples.append(time.perf_counter() - started)
    return samples


@asynccontextmanager
async def connect_session(url: str, data_dir: Path, source: Path | None = None) -> AsyncIterator[ClientSession]:
    """``claw connect mcp`` over stdio, served from ``source``'s ``src`` when given (else this tree's)."""
    env = {"HOME": str(data_dir), "OPENCLAW_URL": url, "OPENCLAW_PASSWORD": PASSWORD}
    if source is not None:
        env["PYTHONPATH"] = str(source / "src")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "clawstack", "connect", "mcp", "--data-dir", str(data_dir), "--log-level", "warning"],
        env=env,
    )
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(name, arguments)
    assert not result.is_error, result.structured_content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def connect_runs(url: str, data_dir: Path, runs: int) -> list[float]:
    """run_task → the first check_task (wait mode) that is terminal, through claw connect over stdio."""
    samples = []
    async with connect_session(url, data_dir) as session:
        for _ in range(runs):
            started = time.perf_counter()
            job = await call(session, "run_task", {"task": TASK})
            while True:
                snap = await call(session, "check_task", {"jobId": job["jobId"], "waitMs": 10000})
                if snap["isTerminal"]:
                    break
            samples.append(time.perf_counter() - started)
            assert snap["summary"] == "pong", snap
    return samples


def seed(data_dir: Path, count: int) -> None:
    store = JobStore(data_dir / "jobs.sqlite3")
    store.open()
    try:
        now = int(time.time() * 1000)
        for n in range(count):
            store.create(
                Job(
                    job_id=f"job_bench{n:06d}",
                    task_id=f"task_bench{n:06d}",
                    run_id=str(uuid.uuid4()),
                    agent="openclaw",
                    openclaw_agent_id="main",
                    session_key=f"agent:main:channel:clawconnect:bench{n % 1000}",
                    created_at_ms=now - count + n,
                    updated_at_ms=now - count + n,
                    status="completed",
                    terminal_reason="final",
                    result_source="parent",
                    summary="s" * 800,
                    ended_at_ms=now,
                    prompt={"task": "t"},
                    message="t",
                )
            )
    finally:
        store.close()


async def tool_latency(url: str, data_dir: Path, calls: int) -> dict[str, float]:
    async with connect_session(url, data_dir) as session:
        timings: dict[str, list[float]] = {"tools/list": [], "get_task": [], "list_tasks": []}
        for _ in range(calls):
            started = time.perf_counter()
            await session.list_tools()
            timings["tools/list"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await call(session, "get_task", {"taskId": "task_bench000000"})
            timings["get_task"].append(time.perf_counter() - started)
            started = time.perf_counter()
            await call(session, "list_tasks", {"view": "all"})
            timings["list_tasks"].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in timings.items()}


async def bench(runs: int, calls: int, stored: int, repeats: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="cc-bench-"))
    try:
        with gateway(root) as url:
            direct, through = [], []
            for repeat in range(repeats):
                direct.append(statistics.median(await direct_runs(url, runs)))
                through.append(statistics.median(await connect_runs(url, root / f"runs{repeat}", runs)))
            d, t = statistics.median(direct), statistics.median(through)
            print(f"\nrun_task -> terminal check_task vs chat.send -> final ({repeats} x {runs} runs; medians)")
            print(f"  gateway chat.send -> final      {d * 1e3:9.2f} ms")
            print(f"  claw connect run -> terminal    {t * 1e3:9.2f} ms")
            print(f"  overhead                        {(t - d) * 1e3:9.2f} ms   ratio {t / d:6.2f}x")

            small, large = root / "small", root / "large"
            seed(small, 1)
            started = time.perf_counter()
            seed(large, stored)
            print(f"\nseeded {stored} tasks in {time.perf_counter() - started:.1f} s (one durable write each)")
            rows: dict[str, dict[str, list[float]]] = {}
            for _ in range(repeats):
                for label, directory in (("1 task", small), (f"{stored} tasks", large)):
                    for name, value in (await tool_latency(url, directory, calls)).items():
                        rows.setdefault(name, {}).setdefault(label, []).append(value)
            print(f"tool-call latency over stdio ({repeats} x {calls} calls; medians)")
            print(f"  {'':<12} {'1 task ms':>10} {f'{stored} ms':>10} {'vs 1 task':>10} {'vs tools/list':>14}")
            baseline = statistics.median(rows["tools/list"][f"{stored} tasks"])
            for name, by_label in rows.items():
                one = statistics.median(by_label["1 task"])
                many = statistics.median(by_label[f"{stored} tasks"])
                print(f"  {name:<12} {one * 1e3:10.3f} {many * 1e3:10.3f} {many / one:9.2f}x {many / baseline:13.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--stored", type=int, default=10000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(bench(args.runs, args.calls, args.stored, args.repeats))


if __name__ == "__main__":
    main()

"""How much does HTTP over our peer-checked Unix socket cost? Median and p99 latency of a small request to a
UnixSocketServer (through AsyncUnixClient, which re-verifies the directory and the server's UID, and through the
httpx UnixSocketTransport), against a raw Unix-socket echo of the same size in the same run.

Run: .venv/bin/python bench/uds_http.py [--requests 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from clawstack.common.uds import AsyncUnixClient, UnixSocketServer, sync_client

PAYLOAD = b'{"installation":"acme","run_id":"r-1"}'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def time_calls(call: Callable[[], Awaitable[None]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def echo_server(path: Path) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_unix_server(handle, str(path))


def serve_in_thread(app: web.Application, path: Path) -> Callable[[], None]:
    """Run the HTTP server on its own loop in a thread, as a separate process would, and return a stopper."""
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    server = UnixSocketServer(app, path)

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(server.stop())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return stop


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="requests per repetition and case")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    os.chmod(base, 0o700)
    try:
        echo_path = base / "echo.sock"
        http_path = base / "api.sock"
        echo = await echo_server(echo_path)

        async def health(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post("/v1/health", health)
        stop_http = serve_in_thread(app, http_path)

        reader, writer = await asyncio.open_unix_connection(str(echo_path))

        async def raw_echo() -> None:
            writer.write(PAYLOAD)
            got = 0
            while got < len(PAYLOAD):
                got += len(await reader.read(65536))

        client = AsyncUnixClient(http_path)

        async def http_async() -> None:
            resp = await client.request("POST", "/v1/health", body=PAYLOAD)
            assert resp.status == 200

        sclient = sync_client(http_path)

        async def http_sync() -> None:
            assert sclient.post("/v1/health", content=PAYLOAD).status_code == 200

        cases: dict[str, Callable[[], Awaitable[None]]] = {
            "raw Unix-socket echo (baseline)": raw_echo,
            "HTTP via AsyncUnixClient (aiohttp)": http_async,
            "HTTP via UnixSocketTransport (httpx)": http_sync,
        }
        medians: dict[str, list[float]] = {k: [] for k in cases}
        p99s: dict[str, list[float]] = {k: [] for k in cases}
        for call in cases.values():
            await time_calls(call, 200)  # warm up
        for _ in range(args.repeats):
            for name, call in cases.items():
                samples = await time_calls(call, args.requests)
                medians[name].append(statistics.median(samples))
                p99s[name].append(percentile(samples, 0.99))

        writer.close()
        await client.close()
        sclient.close()
        echo.close()
        stop_http()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    base_med = statistics.median(medians["raw Unix-socket echo (baseline)"])
    print(
        f"{args.repeats} repetitions x {args.requests} sequential requests, {len(PAYLOAD)}-byte body; "
        "medians across repetitions"
    )
    print(f"{'case':<40} {'median µs':>10} {'p99 µs':>10} {'median vs baseline':>19}")
    for name in cases:
        med = statistics.median(medians[name])
        p99 = statistics.median(p99s[name])
        print(f"{name:<40} {med * 1e6:>10.1f} {p99 * 1e6:>10.1f} {med / base_med:>18.1f}x")


if __name__ == "__main__":
    asyncio.run(main())

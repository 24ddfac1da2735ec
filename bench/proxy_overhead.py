"""How much does the proxy add? Latency per non-streaming request (p50, p99) at concurrency 1 and 64, time to the
first streamed byte, requests per second and CPU per request (of the proxy process; of the fake for the direct
row), each through `claw proxy serve` (the default data policy on, its upstream attested; the hosted-tool guard
on every request) and against the same scripted fake model called directly in the same run. The fake and the proxy run as their own processes, as in production.

Run: .venv/bin/python bench/proxy_overhead.py [--requests 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import aiohttp

from clawstack.common.clock import SystemClock
from clawstack.common.ids import new_secret
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.identities import ChainEntry

TOKEN = "bench-operator-" + "t" * 32
BODY = {"model": "primary", "messages": [{"role": "user", "content": "@fake reply: pong"}]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


STARTS: list[tuple[int, float]] = []  # (pid, seconds from spawn to the readiness line)


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextmanager
def process(args: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    spawned = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawstack", *args, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
        STARTS.append((proc.pid, time.perf_counter() - spawned))
        yield line
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()


async def timed_requests(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], total: int, concurrency: int, stream: bool
) -> tuple[list[float], float]:
    """Send ``total`` requests with ``concurrency`` in flight; return per-request latencies (or time to first
    byte, when streaming) and the wall time of the whole batch."""
    payload = json.dumps({**BODY, "stream": stream}).encode()
    samples: list[float] = []
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as resp:
                if stream:
                    await resp.content.readany()
                    samples.append(time.perf_counter() - start)
                    await resp.read()
                else:
                    await resp.read()
                    samples.append(time.perf_counter() - start)
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - started


async def measure(direct_url: str, proxy_url: str, credential: str, requests: int, repeats: int) -> None:
    direct_headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
    proxy_headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    cases = [
        ("non-streaming, concurrency 1", 1, False),
        ("non-streaming, concurrency 64", 64, False),
        ("streaming first byte, concurrency 1", 1, True),
    ]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for name, concurrency, stream in cases:
            n = requests if concurrency == 1 else requests * 2
            await timed_requests(session, direct_url, direct_headers, 200, concurrency, stream)  # warm up
            await timed_requests(session, proxy_url, proxy_headers, 200, concurrency, stream)
            rows: dict[str, dict[str, list[float]]] = {"direct": {}, "proxy": {}}
            for _ in range(repeats):
                for label, url, headers in (
                    ("direct", direct_url, direct_headers),
                    ("proxy", proxy_url, proxy_headers),
                ):
                    pid = STARTS[-1][0] if label == "proxy" else STARTS[0][0]
                    cpu_before = cpu_s(pid)
                    samples, wall = await timed_requests(session, url, headers, n, concurrency, stream)
                    rows[label].setdefault("cpu", []).append((cpu_s(pid) - cpu_before) / n)
                    rows[label].setdefault("p50", []).append(statistics.median(samples))
                    rows[label].setdefault("p99", []).append(percentile(samples, 0.99))
                    rows[label].setdefault("rps", []).append(n / wall)
            print(f"\n{name} ({repeats} x {n} requests; medians across repetitions)")
            print(f"{'':<8} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>9} {'CPU us/req':>11}")
            med = {label: {k: statistics.median(v) for k, v in row.items()} for label, row in rows.items()}
            for label in ("direct", "proxy"):
                m = med[label]
                print(
                    f"{label:<8} {m['p50'] * 1e3:>9.3f} {m['p99'] * 1e3:>9.3f} {m['rps']:>9.0f} {m['cpu'] * 1e6:>11.0f}"
                )
            added50 = (med["proxy"]["p50"] - med["direct"]["p50"]) * 1e3
            added99 = (med["proxy"]["p99"] - med["direct"]["p99"]) * 1e3
            ratio = med["proxy"]["p50"] / med["direct"]["p50"]
            print(
                f"added by the proxy: p50 {added50:+.3f} ms, p99 {added99:+.3f} ms; p50 ratio {ratio:.2f}x; "
                f"throughput ratio {med['proxy']['rps'] / med['direct']['rps']:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    os.chmod(base, 0o700)
    try:
        with process(["fake-llm", "serve", "--port", "0"]) as ready:
            fake_url = ready.removeprefix("fake-llm listening on ")
            config = base / "proxy.json"
            config.write_text(
                json.dumps(
                    {
                        "worker": {"port": 0},
                        "operator": {"port": 0},
                        "state_dir": "state",
                        "revocation_dir": "rev",
                        "env": {"OPENAI_API_KEY": "sk-bench"},
                        "upstreams": {"openai": {"base_url": fake_url, "api_key_env": "OPENAI_API_KEY"}},
                        "data_policy": {  # the default policy, the fake attested: every request is checked
                            "attestations": [
                                {
                                    "provider": "openai",
                                    "endpoint": fake_url,
                                    "guarantees": ["processing:us", "training:none", "retention:none"],
                                }
                            ]
                        },
                    }
                )
            )
            env = {**os.environ, "CLAW_PROXY_OPERATOR_TOKEN": TOKEN}
            with process(["proxy", "serve", "--config", str(config)], env=env) as line:
                fields = dict(part.split("=", 1) for part in line.removeprefix("proxy listening: ").split())
                worker_url, operator_url = fields["worker"], fields["operator"]
                secret = new_secret()

                async def run() -> None:
                    async with ProxyOperatorClient(token=TOKEN, base_url=operator_url) as op:
                        await op.create_identity(
                            identity_id="bench-run",
                            secret=secret,
                            chain=[ChainEntry("primary", "openai/bench")],
                            tools=[],
                            expires_at=SystemClock().now() + timedelta(hours=1),
                        )
                    await measure(
                        fake_url + "/chat/completions",
                        worker_url + "/chat/completions",
                        f"bench-run:{secret}",
                        args.requests,
                        args.repeats,
                    )

                asyncio.run(run())
                pid, started = STARTS[-1]
                print(
                    f"\nproxy start to readiness: {started:.3f} s (the fake model: {STARTS[0][1]:.3f} s); "
                    f"proxy RSS after the load: {rss_mib(pid):.1f} MiB"
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()

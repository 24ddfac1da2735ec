"""What do a plugin's subagent calls cost in a real in-process gateway, against the scripted fake model over TCP?

1. Latency: ``api.runtime.subagent.run`` then ``wait_for_run`` (sequential runs, a fresh session key
   ``agent:main:subagent:bench-<i>`` per run, so no run reads a growing transcript), against the same streamed chat
   completion (the messages and tools the gateway sent, captured from a warm-up run) sent straight to the fake with
   ``LLMClient.stream_chat_completion``, as the agent loop sends it, one direct call before each run.
2. Throughput: ``api.runtime.subagent.complete`` with ``--calls`` calls in flight at once, in completions per
   second, at ``agents.defaults.subagents.maxConcurrent`` 1, 8 and 32 (a fresh gateway for each), with the fake
   answering at once and after a fixed delay (``@fake delay-ms``), as a ratio to maxConcurrent 1 and to the same
   completion streamed straight to the fake with at most maxConcurrent in flight.

Run: .venv/bin/python bench/gateway_subagent.py [--runs 200] [--calls 256] [--delay-ms 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from clawstack.gateway.config import parse_config
from clawstack.gateway.plugins import PluginApi
from clawstack.gateway.server import GatewayServer
from clawstack.llm import LLMClient
from clawstack.llm.fake import FakeModelServer

API_KEY = "sk-bench-gateway-subagent"
TOKEN = "bench-gateway-token-" + "t" * 32
REPLY = "@fake reply: pong"
LIMITS = (1, 8, 32)
PLUGIN = """
def register(api):
    pass
"""


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def write_plugin(root: Path) -> Path:
    directory = root / "bench"
    directory.mkdir(parents=True)
    manifest = {"id": "bench", "version": "1.0.0", "entry": "plugin.py"}
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    return directory


@asynccontextmanager
async def gateway(base: Path, name: str, fake_url: str, max_concurrent: int) -> AsyncIterator[PluginApi]:
    """A gateway on 127.0.0.1 with one trusted plugin; yields that plugin's ``api``."""
    root = base / name
    root.mkdir()
    document = {
        "models": {"providers": {"fake": {"baseUrl": fake_url, "apiKey": API_KEY, "models": [{"id": "fake-model"}]}}},
        "agents": {
            "defaults": {"model": {"primary": "fake/fake-model"}, "subagents": {"maxConcurrent": max_concurrent}}
        },
        "gateway": {"port": 0, "auth": {"mode": "token", "token": TOKEN}},
        "plugins": {"entries": {"bench": {"trust": "trusted"}}},
    }
    config = parse_config(document, base_dir=root, environ={})
    paths = [write_plugin(root / "plugins")]
    async with GatewayServer(config, data_dir=root / "data", plugin_paths=paths) as server:
        record = {p.id: p for p in server.plugins}["bench"]
        assert record.state == "loaded", record.error
        assert record.api is not None
        yield record.api


async def run_and_wait(api: PluginApi, session_key: str) -> float:
    start = time.perf_counter()
    accepted = await api.runtime.subagent.run(session_key=session_key, message=REPLY)
    result = await api.runtime.subagent.wait_for_run(accepted.run_id, timeout_ms=60_000)
    elapsed = time.perf_counter() - start
    assert (result.status, result.terminal_reply) == ("ok", "pong"), result
    return elapsed


async def direct(client: LLMClient, body: dict[str, Any]) -> float:
    start = time.perf_counter()
    async with client.stream_chat_completion(
        model=body["model"], messages=body["messages"], tools=body.get("tools")
    ) as stream:
        async for _chunk in stream:
            pass
        completion = await stream.final_completion()
    elapsed = time.perf_counter() - start
    assert completion.content == "pong", completion
    return elapsed


async def latency(api: PluginApi, client: LLMClient, body: dict[str, Any], n: int) -> tuple[list[float], list[float]]:
    """``n`` sequential gateway runs and ``n`` direct calls, alternating, so both see the same machine load."""
    gw, baseline = [], []
    for i in range(n):
        baseline.append(await direct(client, body))
        gw.append(await run_and_wait(api, f"agent:main:subagent:bench-{i}"))
    return gw, baseline


async def completions_per_second(api: PluginApi, calls: int, message: str) -> float:
    async def one() -> None:
        result = await api.runtime.subagent.complete("main", message, timeout_ms=600_000)
        assert result.text == "pong", result

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    return calls / (time.perf_counter() - start)


async def direct_per_second(client: LLMClient, body: dict[str, Any], calls: int, in_flight: int) -> float:
    """The same completion straight to the fake, ``calls`` at once, at most ``in_flight`` of them running."""
    slots = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with slots, client.stream_chat_completion(model=body["model"], messages=body["messages"]) as stream:
            async for _chunk in stream:
                pass
            completion = await stream.final_completion()
        assert completion.content == "pong", completion

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    return calls / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200, help="sequential runs for the latency figures")
    parser.add_argument("--calls", type=int, default=256, help="concurrent complete() calls per throughput batch")
    parser.add_argument("--delay-ms", type=int, default=20, help="the fake's delay per answer in the delayed case")
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="throughput batches per delayed case (median reported); the undelayed cases run 5x as many",
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    os.chmod(base, 0o700)
    throughput: dict[tuple[int, int], float] = {}
    reference: dict[tuple[int, int], float] = {}
    try:
        async with FakeModelServer(api_key=API_KEY) as fake:
            async with (
                gateway(base, "latency", fake.base_url, 8) as api,
                LLMClient(fake.base_url, api_key=API_KEY, timeout_s=None) as client,
            ):
                for i in range(10):  # warm up both paths
                    await run_and_wait(api, f"agent:main:subagent:warm-{i}")
                body = fake.requests[-1].body  # what the gateway sent for a run: the baseline sends the same
                for _ in range(10):
                    await direct(client, body)
                gw, baseline = await latency(api, client, body, args.runs)
            fake.clear_requests()
            for delay in (0, args.delay_ms):
                repeats = args.repeats if delay else 5 * args.repeats  # undelayed batches take ~0.1 s
                message = f"@fake delay-ms: {delay}\n{REPLY}" if delay else REPLY
                for limit in LIMITS:
                    async with gateway(base, f"complete-{delay}-{limit}", fake.base_url, limit) as api:
                        await completions_per_second(api, min(args.calls, 2 * limit), message)  # warm up
                        rates = [await completions_per_second(api, args.calls, message) for _ in range(repeats)]
                    throughput[delay, limit] = statistics.median(rates)
                    body = fake.requests[-1].body
                    fake.clear_requests()
                    async with LLMClient(fake.base_url, api_key=API_KEY, timeout_s=None) as client:
                        await direct_per_second(client, body, min(args.calls, 2 * limit), limit)
                        rates = [await direct_per_second(client, body, args.calls, limit) for _ in range(repeats)]
                    reference[delay, limit] = statistics.median(rates)
                    fake.clear_requests()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"1. subagent.run + wait_for_run: {args.runs} sequential runs, a fresh session key each, "
        "alternating with the direct calls"
    )
    print(f"{'':<44} {'median ms':>10} {'p95 ms':>9}")
    for label, values in (
        ("run + wait_for_run through the gateway", gw),
        ("same streamed completion, straight to fake", baseline),
    ):
        print(f"{label:<44} {statistics.median(values) * 1e3:>10.2f} {p95(values) * 1e3:>9.2f}")
    added50 = (statistics.median(gw) - statistics.median(baseline)) * 1e3
    added95 = (p95(gw) - p95(baseline)) * 1e3
    print(
        f"added by the gateway: median {added50:+.2f} ms, p95 {added95:+.2f} ms; "
        f"median ratio {statistics.median(gw) / statistics.median(baseline):.2f}x, "
        f"p95 ratio {p95(gw) / p95(baseline):.2f}x"
    )

    print(
        f"\n2. subagent.complete throughput: {args.calls} concurrent calls per batch, median of {args.repeats} "
        f"batches ({5 * args.repeats} when the fake answers at once)"
    )
    for delay in (0, args.delay_ms):
        print(f"\nfake answers {'at once' if not delay else f'after {delay} ms'}")
        print(
            f"{'maxConcurrent':<14} {'completions/s':>14} {'vs 1':>7} {'direct/s':>10} {'vs direct':>10}"
            + (f" {'ceiling/s':>10}" if delay else "")
        )
        for limit in LIMITS:
            rate, ref = throughput[delay, limit], reference[delay, limit]
            row = f"{limit:<14} {rate:>14.1f} {rate / throughput[delay, 1]:>6.2f}x {ref:>10.1f} {rate / ref:>9.2f}x"
            print(row + (f" {limit * 1000 / delay:>10.0f}" if delay else ""))
    print(
        json.dumps(
            {
                "note": "direct: the same completion streamed straight to the fake with LLMClient, at most "
                "maxConcurrent in flight; ceiling: maxConcurrent / delay"
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())

"""What does a plan-route call cost against an API-key call? Latency (p50, p99) of one non-streaming and one
streaming worker request through one proxy, served (a) from a signed-in ChatGPT plan by the synthetic identity
provider and plan backend (HTTPS with a throwaway CA, the Responses shape, the plan's SSE read to completion) and
(b) by an API key against the scripted fake model, in the same run. The plan backend is the test suite's
synthetic one (tests/integration/proxy/plan_idp.py), so the figures are the proxy's own cost, not OpenAI's.

Run (from the repository root): .venv/bin/python bench/proxy_plan_route.py [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.proxy.plan_idp import PlanIdP

from clawstack.common.clock import SystemClock
from clawstack.common.ids import new_secret
from clawstack.llm.fake import FakeModelServer
from clawstack.proxy.client import ProxyOperatorClient
from clawstack.proxy.config import parse_config
from clawstack.proxy.identities import ChainEntry
from clawstack.proxy.plan import AuthStore
from clawstack.proxy.server import ProxyServer

TOKEN = "bench-operator-" + "t" * 32
ALL = ["processing:us", "training:none", "retention:none"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(session: aiohttp.ClientSession, url: str, credential: str, n: int, stream: bool) -> list[float]:
    body = json.dumps(
        {"model": "primary", "messages": [{"role": "user", "content": "@fake reply: pong"}], "stream": stream}
    )
    headers = {"Authorization": f"Bearer {credential}", "Content-Type": "application/json"}
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        async with session.post(url, data=body.encode(), headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
        samples.append(time.perf_counter() - started)
    return samples


async def main(requests: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="cs-plan-bench-"))
    idp = PlanIdP(base / "idp")
    await idp.start()
    async with FakeModelServer() as fake:
        config = parse_config(
            {
                "worker": {"port": 0},
                "operator": {"port": 0},
                "state_dir": "state",
                "revocation_dir": "rev",
                "env": {"OPENAI_API_KEY": "sk-bench"},
                "upstreams": {"openai": {"base_url": fake.base_url, "api_key_env": "OPENAI_API_KEY"}},
                "auth_dir": "auth",
                "plan_routes": {
                    "chatgpt": {"issuer": idp.issuer, "base_url": idp.base_url, "ca_file": str(idp.ca_file)}
                },
                "data_policy": {
                    "attestations": [
                        {"provider": "openai", "endpoint": fake.base_url, "guarantees": ALL},
                        {"provider": "chatgpt", "endpoint": "https://api.openai.com/v1", "guarantees": ALL},
                    ]
                },
            },
            base_dir=base,
            environ={},
        )
        proxy = ProxyServer(config, environ={"CLAW_PROXY_OPERATOR_TOKEN": TOKEN})
        await proxy.start()
        AuthStore(base / "auth").save(idp.mint_signin(datetime.now(UTC), expires_in_s=86400))
        credentials = {}
        async with ProxyOperatorClient(token=TOKEN, base_url=proxy.operator_base_url) as operator:
            for name, ref in (("plan", "chatgpt/gpt-5.6-terra"), ("api_key", "openai/gpt-5.6-terra")):
                secret = new_secret()
                await operator.create_identity(
                    identity_id=f"bench-{name}",
                    secret=secret,
                    chain=[ChainEntry("primary", ref)],
                    tools=[],
                    expires_at=SystemClock().now() + timedelta(hours=1),
                )
                credentials[name] = f"bench-{name}:{secret}"
        url = proxy.worker_base_url + "/chat/completions"
        try:
            async with aiohttp.ClientSession() as session:
                for stream in (False, True):
                    rows = {}
                    for name, credential in credentials.items():
                        await timed(session, url, credential, 30, stream)  # warm up
                        rows[name] = await timed(session, url, credential, requests, stream)
                    print(f"\n{'streaming' if stream else 'non-streaming'}, concurrency 1, {requests} requests")
                    print(f"{'':<9} {'p50 ms':>8} {'p99 ms':>8}")
                    for name, samples in rows.items():
                        print(
                            f"{name:<9} {statistics.median(samples) * 1e3:>8.3f} {percentile(samples, 0.99) * 1e3:>8.3f}"
                        )
                    ratio = statistics.median(rows["plan"]) / statistics.median(rows["api_key"])
                    print(f"plan / api_key p50 ratio {ratio:.2f}x")
        finally:
            await proxy.stop()
            await idp.stop()
    print(f"\nplan backend requests: {len(idp.requests)}; token refreshes: {idp.refreshes}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    asyncio.run(main(parser.parse_args().requests))

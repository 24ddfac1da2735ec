"""How does `claw gateway serve` compare with the real OpenClaw gateway? Side by side, on the same scripted fake
model and the same offline config, in the same run: start-up time from process spawn to a listening socket (and
to the first `hello-ok`: the real gateway listens before it accepts connections), resident memory after start-up
(VmRSS of the whole process tree), and chat.send -> final latency (median and p95) with the fake model answering
at once. The real gateway comes from scripts/openclaw-up; without it only clawstack is measured.

Run: .venv/bin/python bench/gateway_vs_openclaw.py [--claw-starts 5] [--openclaw-starts 2] [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

# The peer helpers live with the tests that share them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.gateway.peers import (
    Peer,
    PeerClient,
    descendants,
    openclaw_missing_reason,
    start_fake_model,
    start_peer,
    wait_ready,
)

WARMUP_TURNS = 2
SETTLE_S = 1.0


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


@dataclass
class Figures:
    listen_s: list[float] = field(default_factory=list)
    ready_s: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    rss_after_turns_mib: float = 0.0


async def turns(peer: Peer, n: int) -> list[float]:
    """``n`` chat.send -> final round trips on one session, after a warm-up; seconds each."""
    samples = []
    key = f"agent:main:main:thread:bench{uuid.uuid4().hex[:12]}"
    async with aiohttp.ClientSession() as http:
        client = await PeerClient.connected(http, peer.url)
        for i in range(WARMUP_TURNS + n):
            run_id = str(uuid.uuid4())
            start = time.perf_counter()
            await client.request("chat.send", {"sessionKey": key, "message": f"ping {i}", "idempotencyKey": run_id})
            final = await client.wait_for_chat(run_id, "final", "error", "aborted")
            elapsed = time.perf_counter() - start
            assert final["payload"]["state"] == "final", final
            client.events.clear()
            if i >= WARMUP_TURNS:
                samples.append(elapsed)
        await client.ws.close()
    return samples


def measure(name: str, starts: int, n_turns: int, fake_base_url: str, workdir: Path) -> Figures:
    figures = Figures()
    for i in range(starts):
        peer = start_peer(name, workdir / f"{name}-{i}", fake_base_url)
        try:
            asyncio.run(wait_ready(peer))
            time.sleep(SETTLE_S)
            figures.listen_s.append(peer.startup_s)
            figures.ready_s.append(peer.ready_s)
            figures.rss_mib.append(peer.rss_kib() / 1024)
            processes = 1 + len(descendants(peer.proc.pid))
            if i == starts - 1:
                figures.latency_s = asyncio.run(turns(peer, n_turns))
                figures.rss_after_turns_mib = peer.rss_kib() / 1024
        finally:
            peer.stop()
        print(
            f"  {name} start {i + 1}/{starts}: listening {peer.startup_s:.2f} s, hello-ok {peer.ready_s:.2f} s, "
            f"{figures.rss_mib[-1]:.0f} MiB in {processes} process(es)",
            file=sys.stderr,
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claw-starts", type=int, default=5)
    parser.add_argument("--openclaw-starts", type=int, default=2)
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-gw-", dir="/tmp"))
    fake = start_fake_model(workdir / "fake-llm.log")
    results: dict[str, Figures] = {}
    try:
        results["claw"] = measure("claw", args.claw_starts, args.turns, fake.base_url, workdir)
        missing = openclaw_missing_reason()
        if missing is None:
            results["openclaw"] = measure("openclaw", args.openclaw_starts, args.turns, fake.base_url, workdir)
        else:
            print(f"note: openclaw not measured: {missing}")
    finally:
        fake.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nstarts: claw {args.claw_starts}, openclaw {args.openclaw_starts}; {args.turns} turns after a warm-up")
    print(
        f"{'':<9} {'listen s':>9} {'hello s':>8} {'RSS MiB':>8} {'RSS after turns':>16} "
        f"{'final median ms':>16} {'p95 ms':>8}"
    )
    medians: dict[str, tuple[float, float, float, float, float]] = {}
    for name, f in results.items():
        row = (
            statistics.median(f.listen_s),
            statistics.median(f.ready_s),
            statistics.median(f.rss_mib),
            statistics.median(f.latency_s) * 1e3,
            p95(f.latency_s) * 1e3,
        )
        medians[name] = row
        print(
            f"{name:<9} {row[0]:>9.2f} {row[1]:>8.2f} {row[2]:>8.0f} {f.rss_after_turns_mib:>16.0f} "
            f"{row[3]:>16.1f} {row[4]:>8.1f}"
        )
    if "openclaw" in medians:
        claw, real = medians["claw"], medians["openclaw"]
        print(
            f"\nopenclaw / claw: listening {real[0] / claw[0]:.1f}x, hello-ok {real[1] / claw[1]:.1f}x, "
            f"RSS {real[2] / claw[2]:.1f}x, chat.send -> final median {real[3] / claw[3]:.1f}x, "
            f"p95 {real[4] / claw[4]:.1f}x"
        )


if __name__ == "__main__":
    main()

"""What does a native child cost? `sessions_spawn` -> collected result, and 100 children on 8 subagent slots, on
`claw gateway serve` and on the real OpenClaw gateway, in the same run, on the same scripted fake model.

1. Overhead: a spawn turn (the parent calls `sessions_spawn`, the child answers) followed by a collect turn (the
   parent calls `agents_wait` on the child's run id), against the same two turns with a cheap tool call
   (`session_status`) in place of the spawn and the wait, plus one plain turn for the child's own model call. The
   overhead is (pair - baseline pair - child call): what spawning, custody and collection add.
2. Fan-out: one turn spawning 100 children (`maxConcurrent` 8, each child's model call held 100 ms), then
   `agents_wait` turns until all 100 are collected: wall time from the spawn turn's start, and the peak resident
   memory of the gateway's process tree.

Both gateways run as processes; the scripted fake model runs in this process. The real gateway comes from
scripts/openclaw-up (it needs `tools.swarm.enabled`, direct tool schemas and the
`full` tool profile to offer the collector tools); without it only clawstack is measured.

Run: .venv/bin/python bench/gateway_children.py [--reps 5] [--children 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.gateway import peers

from clawstack.llm.fake import FakeModelServer, parse_script

MAX_CONCURRENT = 8
CHILD_DELAY_MS = 100


def _document(name: str, port: int, model_port: int, workdir: Path, children: int) -> dict[str, Any]:
    document = peers.offline_config(port, f"http://127.0.0.1:{model_port}/v1", workdir)
    # OpenClaw caps maxChildrenPerAgent at 20 and does not count collector children against it; clawstack counts
    # every native child, so it needs the whole fan-out as its limit.
    document["agents"]["defaults"]["subagents"] = {
        "maxConcurrent": MAX_CONCURRENT,
        "maxChildrenPerAgent": min(children, 20) if name == "openclaw" else children,
        "runTimeoutSeconds": 300,
    }
    if name == "openclaw":
        document["tools"] = {"swarm": {"enabled": True}, "toolSearch": False, "profile": "full"}
    return document


def _start(name: str, workdir: Path, model_port: int, children: int) -> peers.Peer:
    port = peers.free_port()
    (workdir / "workspace").mkdir(parents=True, exist_ok=True)
    config_path = workdir / ("home/.openclaw/openclaw.json" if name == "openclaw" else "gateway.json5")
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(_document(name, port, model_port, workdir, children)))
    argv, env = peers._command(name, workdir, config_path)
    log_path = workdir / f"{name}.log"
    with log_path.open("ab") as log:
        spawned = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=env, cwd=workdir, start_new_session=True)
    while not peers._listening(port):
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {peers._tail(log_path)}")
        time.sleep(0.02)
    return peers.Peer(name, proc, port, workdir, log_path, spawned, time.perf_counter())


class Driver:
    def __init__(self, client: peers.PeerClient) -> None:
        self.client = client
        self.n = 0

    async def turn(self, message: str) -> tuple[float, list[dict[str, Any]]]:
        self.n += 1
        key = "agent:main:main"
        started = time.perf_counter()
        res = await self.client.request(
            "chat.send", {"sessionKey": key, "message": message, "idempotencyKey": f"bench-{self.n}-{time.time()}"}
        )
        run_id = res["payload"]["runId"]
        await asyncio.wait_for(self.client.wait_for_chat(run_id, "final", "error"), 600)
        elapsed = time.perf_counter() - started
        history = await self.client.request("chat.history", {"sessionKey": key, "limit": 1000})
        results = []
        for message_ in history["payload"]["messages"]:
            if message_.get("role") in ("tool", "toolResult") and _run_of(message_) == run_id:
                for block in message_.get("content") or []:
                    if block.get("type") == "text":
                        try:
                            results.append(json.loads(block["text"]))
                        except ValueError:
                            results.append({"text": block["text"]})
        return elapsed, results


def _run_of(message: dict[str, Any]) -> str | None:
    return message.get("runId") or (message.get("__openclaw") or {}).get("runId")


async def measure(name: str, reps: int, children: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-children-{name}-", dir="/tmp"))
    # One fake model for the whole run, in this process: each phase adds its steps, so a child that starts late
    # (the real gateway may start one after the spawning turn ended) still finds its step.
    async with FakeModelServer(api_key=peers.FAKE_API_KEY, model_ids=(peers.MODEL,)) as fake:
        model_port = int(fake.base_url.rsplit(":", 1)[1].split("/")[0])
        peer = _start(name, workdir, model_port, children)
        try:
            await peers.wait_ready(peer)
            async with aiohttp.ClientSession() as http:
                client = await peers.PeerClient.connected(http, peer.url, auth=peer.credentials)
                driver = Driver(client)
                fake.add_script_steps(parse_script([{"match_user": "WARM", "reply": "warm"}] * 2))
                for _ in range(2):
                    await driver.turn("WARM up")
                pairs, baselines, plains = [], [], []
                for rep in range(reps):
                    m = f"R{rep}X"
                    spawn = {"name": "sessions_spawn", "arguments": {"task": f"CHILD-{m}", "collect": True}}
                    status = {"name": "session_status", "arguments": {}}
                    fake.add_script_steps(
                        parse_script(
                            [
                                {"match_user": f"SPAWN-{m}", "tool_calls": [spawn]},
                                {"match_user": f"CHILD-{m}", "reply": "child answer"},
                                {"match_user": f"SPAWN-{m}", "reply": "spawned"},
                                {"match_user": f"STATUS1-{m}", "tool_calls": [status]},
                                {"match_user": f"STATUS1-{m}", "reply": "ok"},
                                {"match_user": f"STATUS2-{m}", "tool_calls": [status]},
                                {"match_user": f"STATUS2-{m}", "reply": "ok"},
                                {"match_user": f"PLAIN-{m}", "reply": "plain"},
                            ]
                        )
                    )
                    spawn_s, [receipt] = await driver.turn(f"SPAWN-{m}")
                    wait = {"name": "agents_wait", "arguments": {"ids": [receipt["runId"]], "timeoutSeconds": 60}}
                    fake.add_script_steps(
                        parse_script(
                            [
                                {"match_user": f"WAIT-{m}", "tool_calls": [wait]},
                                {"match_user": f"WAIT-{m}", "reply": "collected"},
                            ]
                        )
                    )
                    wait_s, [state] = await driver.turn(f"WAIT-{m}")
                    assert state["completed"][0]["result"] == "child answer", state
                    status1, _ = await driver.turn(f"STATUS1-{m}")
                    status2, _ = await driver.turn(f"STATUS2-{m}")
                    plain, _ = await driver.turn(f"PLAIN-{m}")
                    pairs.append(spawn_s + wait_s)
                    baselines.append(status1 + status2)
                    plains.append(plain)
                # Fan-out.
                spawns = [
                    {"name": "sessions_spawn", "arguments": {"task": f"FAN-{i:03d}", "collect": True}}
                    for i in range(children)
                ]
                steps: list[dict[str, Any]] = [
                    {"match_user": "FANOUT", "tool_calls": spawns},
                    {"match_user": "FANOUT", "reply": "spawned"},
                ]
                steps += [
                    {"match_user": f"FAN-{i:03d}", "reply": f"r{i}", "delay_ms": CHILD_DELAY_MS}
                    for i in range(children)
                ]
                fake.add_script_steps(parse_script(steps))
                rss_peak = peers.tree_rss_kib(peer.proc.pid)
                started = time.perf_counter()
                _, receipts = await driver.turn("FANOUT spawn them all")
                ids = [r["runId"] for r in receipts if r.get("status") == "accepted"]
                refused = len(receipts) - len(ids)
                pending, rounds = list(ids), 0
                while pending:
                    rounds += 1
                    # At most 20 ids per call: the real gateway cuts long tool results in its transcript.
                    wait = {"name": "agents_wait", "arguments": {"ids": pending[:20], "timeoutSeconds": 60}}
                    fake.add_script_steps(
                        parse_script(
                            [
                                {"match_user": f"COLLECT-{rounds}", "tool_calls": [wait]},
                                {"match_user": f"COLLECT-{rounds}", "reply": "collected"},
                            ]
                        )
                    )
                    _, [state] = await driver.turn(f"COLLECT-{rounds}")
                    if "pending" not in state:
                        raise RuntimeError(f"{name}: agents_wait answered {str(state)[:500]}")
                    done = {c["runId"] for c in state["completed"]}
                    pending = [run_id for run_id in pending if run_id not in done]
                    rss_peak = max(rss_peak, peers.tree_rss_kib(peer.proc.pid))
                fanout_s = time.perf_counter() - started
                await client.ws.close()
        finally:
            peer.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "pair_ms": statistics.median(pairs) * 1000,
        "baseline_ms": statistics.median(baselines) * 1000,
        "child_call_ms": statistics.median(plains) * 1000,
        "fanout_s": fanout_s,
        "fanout_refused": refused,
        "fanout_rounds": rounds,
        "rss_peak_mib": rss_peak / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--children", type=int, default=100)
    args = parser.parse_args()
    names = ["claw"] + ([] if peers.openclaw_missing_reason() else ["openclaw"])
    rows = {name: asyncio.run(measure(name, args.reps, args.children)) for name in names}
    print(f"\n{args.reps} spawn/collect pairs; fan-out of {args.children} children on {MAX_CONCURRENT} slots")
    print(
        f"{'':10}{'pair ms':>10}{'baseline':>10}{'child':>8}{'overhead':>10}{'fan-out s':>11}{'rounds':>8}{'refused':>9}{'RSS MiB':>9}"
    )
    for name, r in rows.items():
        overhead = r["pair_ms"] - r["baseline_ms"] - r["child_call_ms"]
        print(
            f"{name:10}{r['pair_ms']:10.1f}{r['baseline_ms']:10.1f}{r['child_call_ms']:8.1f}{overhead:10.1f}"
            f"{r['fanout_s']:11.2f}{r['fanout_rounds']:8d}{r['fanout_refused']:9d}{r['rss_peak_mib']:9.0f}"
        )
    if "openclaw" in rows:
        c, o = rows["claw"], rows["openclaw"]
        print(
            f"fan-out wall time claw/openclaw: {c['fanout_s'] / o['fanout_s']:.2f}x; RSS {c['rss_peak_mib'] / o['rss_peak_mib']:.2f}x"
        )


if __name__ == "__main__":
    main()

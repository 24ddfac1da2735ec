"""What does a plugin's native child cost? `ctx.runtime_context.subagents` spawn -> collect, and 50 command-scoped
children on 8 subagent slots, on `claw gateway serve` (in this process) against the scripted fake model.

1. Overhead: a command turn that spawns one child and joins its result (`collect(await_results=True)`), against
   the same command turn doing nothing plus one direct chat completion on the fake model (the child's own model
   call). The overhead is (spawn turn - empty turn - direct call): what the facade, custody, the child session
   and its run add.
2. Fan-out: one command spawning 50 children (`maxConcurrent` 8, each child's model call held 200 ms) and joining
   them all: wall time against the ideal (ceil(50 / 8) rounds of 200 ms).

Run: .venv/bin/python bench/gateway_native.py [--reps 15] [--children 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.gateway.test_ws_protocol import API_KEY, config_document, connected

from clawstack.gateway.config import parse_config
from clawstack.gateway.server import GatewayServer
from clawstack.llm.fake import FakeModelServer

MAX_CONCURRENT = 8
CHILD_DELAY_MS = 200
PLUGIN = """
import json


async def fan_out(ctx):
    native = ctx.runtime_context.subagents
    ask = json.loads(ctx.args)
    delay = ask.get("delay", 0)
    ids = []
    for i in range(ask["n"]):
        child = await native.spawn(task=f"@fake delay-ms: {delay}\\n@fake reply: child {i}")
        ids.append(child["run_id"])
    done = await native.collect(ids=ids, await_results=True)
    return str(len(done["results"]))


async def nothing(ctx):
    return "0"


def register(api):
    kw = dict(accepts_args=True, runtime_capabilities=["subagents"])
    api.register_command("fanout", fan_out, description="Spawn and join", **kw)
    api.register_command("nothing", nothing, description="No children", **kw)
"""


def write_plugin(root: Path) -> Path:
    directory = root / "bench"
    directory.mkdir(parents=True)
    manifest = {
        "id": "bench",
        "version": "1.0.0",
        "entry": "plugin.py",
        "contracts": {"commandRuntimeCapabilities": ["subagents"]},
    }
    (directory / "claw.plugin.json").write_text(json.dumps(manifest))
    (directory / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    return directory


async def main(reps: int, children: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-native-") as scratch:
        base = Path(scratch)
        async with FakeModelServer(api_key=API_KEY) as fake:
            document = config_document(fake.base_url)
            document["agents"]["defaults"]["subagents"] = {
                "maxConcurrent": MAX_CONCURRENT,
                "maxChildrenPerAgent": children,
                "runTimeoutSeconds": 300,
            }
            config = parse_config(document, base_dir=base, environ={})
            plugins = [write_plugin(base / "plugins")]
            async with (
                GatewayServer(config, data_dir=base / "data", plugin_paths=plugins) as server,
                aiohttp.ClientSession() as http,
            ):
                client = await connected(http, server.port)
                turns = 0

                async def command(text: str) -> tuple[float, str]:
                    nonlocal turns
                    turns += 1
                    started = time.perf_counter()
                    sent = await client.request(
                        "chat.send", {"sessionKey": "agent:main:main", "message": text, "idempotencyKey": f"b{turns}"}
                    )
                    final = await client.wait_for_chat(sent["payload"]["runId"], "final", "error")
                    return time.perf_counter() - started, str(final["payload"]["message"]["content"][0]["text"])

                async def direct() -> float:
                    body = {"model": "fake-model", "messages": [{"role": "user", "content": "@fake reply: direct"}]}
                    started = time.perf_counter()
                    async with http.post(
                        f"{fake.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
                    ) as response:
                        await response.read()
                    return time.perf_counter() - started

                await command('/fanout {"n": 1}')  # warm up
                spawn_turns, empty_turns, calls = [], [], []
                for _ in range(reps):
                    spawn_turns.append((await command('/fanout {"n": 1}'))[0])
                    empty_turns.append((await command('/nothing {"n": 0}'))[0])
                    calls.append(await direct())
                spawn_ms = statistics.median(spawn_turns) * 1000
                empty_ms = statistics.median(empty_turns) * 1000
                call_ms = statistics.median(calls) * 1000
                overhead = spawn_ms - empty_ms - call_ms
                print(f"(1) spawn+collect turn p50 {spawn_ms:.1f} ms; empty command turn {empty_ms:.1f} ms; ", end="")
                print(f"direct model call {call_ms:.1f} ms (median of {reps})")
                print(f"(1) overhead of one native child {overhead:.1f} ms = {overhead / call_ms:.1f}x the model call")
                wall, answer = await command("/fanout " + json.dumps({"n": children, "delay": CHILD_DELAY_MS}))
                ideal = math.ceil(children / MAX_CONCURRENT) * CHILD_DELAY_MS / 1000
                print(
                    f"(2) {children} children at maxConcurrent {MAX_CONCURRENT}, {CHILD_DELAY_MS} ms each: "
                    f"{answer} collected in {wall:.2f} s; ideal {ideal:.2f} s ({wall / ideal:.2f}x)"
                )
                await client.ws.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--children", type=int, default=50)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.reps, arguments.children))

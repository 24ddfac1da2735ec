"""Native children survive a SIGKILLed ``claw gateway serve`` in a defined state, and nothing runs twice.

One parent turn spawns three children on a subagent lane of one slot: the first finishes, the second is running
(its model call is held by a long delay) and the third is queued behind it when the gateway is killed. After a
restart on the same data directory the finished child keeps its result, the other two are interrupted (collected
as ``failed``), and the fake model never sees a second call for any of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from clawstack.gateway.custody import INTERRUPTED_CHILD_ERROR
from clawstack.llm.fake import FakeModelServer, parse_script
from tests.integration.gateway import peers
from tests.integration.gateway.test_ws_protocol import API_KEY, TOKEN, config_document

KEY = "agent:main:main"
WAIT_S = 30.0


@pytest.fixture
async def fake() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer(api_key=API_KEY) as server:
        yield server


class Process:
    def __init__(self, config_path: Path, data_dir: Path, port: int) -> None:
        self.config_path, self.data_dir, self.port = config_path, data_dir, port
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        argv = [peers.claw_executable(), "gateway", "serve", "--config", str(self.config_path)]
        argv += ["--data-dir", str(self.data_dir), "--log-level", "warning"]
        self.proc = await asyncio.to_thread(
            subprocess.Popen, argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
        )
        assert self.proc.stdout is not None
        line = await asyncio.to_thread(self.proc.stdout.readline)
        self.proc.stdout.close()
        assert line.startswith(b"gateway listening on "), line

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def gateway(tmp_path: Path, fake: FakeModelServer) -> Iterator[Process]:
    document = config_document(fake.base_url)
    port = peers.free_port()
    document["gateway"]["port"] = port
    document["agents"]["defaults"]["subagents"] = {"maxConcurrent": 1}
    config_path = tmp_path / "gateway.json5"
    config_path.write_text(json.dumps(document))
    process = Process(config_path, tmp_path / "data", port)
    yield process
    process.stop()


async def chat(http: aiohttp.ClientSession, port: int, message: str, idem: str) -> list[dict[str, Any]]:
    client = await peers.PeerClient.connected(http, f"ws://127.0.0.1:{port}/ws", auth={"token": TOKEN})
    res = await client.request("chat.send", {"sessionKey": KEY, "message": message, "idempotencyKey": idem})
    assert res["ok"], res
    async with asyncio.timeout(WAIT_S):
        await client.wait_for_chat(res["payload"]["runId"], "final", "error")
    history = await client.request("chat.history", {"sessionKey": KEY, "limit": 200})
    await client.ws.close()
    return [
        json.loads(m["content"][0]["text"])
        for m in history["payload"]["messages"]
        if m["role"] == "tool" and m.get("runId") == res["payload"]["runId"]
    ]


def calls_for(fake: FakeModelServer, marker: str) -> int:
    return sum(
        1
        for request in fake.requests
        if any(marker in str(m.get("content")) for m in request.body["messages"] if m.get("role") == "user")
    )


async def test_children_queued_running_and_finished_survive_sigkill(gateway: Process, fake: FakeModelServer) -> None:
    spawns = [{"name": "sessions_spawn", "arguments": {"task": f"CHILD-R{i} work"}} for i in (1, 2, 3)]
    fake.add_script_steps(
        parse_script(
            [
                {"match_user": "PARENT-R", "tool_calls": spawns},
                {"match_user": "PARENT-R", "reply": "spawned"},
                {"match_user": "CHILD-R1", "reply": "finished before the crash"},
                {"match_user": "CHILD-R2", "reply": "never delivered", "delay_ms": 600_000},
                {"match_user": "CHILD-R3", "reply": "never asked"},
            ]
        )
    )
    await gateway.start()
    async with aiohttp.ClientSession() as http:
        receipts = await chat(http, gateway.port, "PARENT-R spawn three", "spawn")
        assert [r["status"] for r in receipts] == ["accepted"] * 3
        ids = [r["runId"] for r in receipts]
        # The parent's two model calls, the first child's, and the second child's (held by its delay).
        async with asyncio.timeout(WAIT_S):
            await fake.wait_for_requests(4)
        assert calls_for(fake, "CHILD-R1") == 1
        assert calls_for(fake, "CHILD-R2") == 1
        gateway.kill()

        await gateway.start()
        fake.add_script_steps(
            parse_script(
                [
                    {
                        "match_user": "WAIT-R",
                        "tool_calls": [{"name": "agents_wait", "arguments": {"ids": ids, "timeoutSeconds": 5}}],
                    },
                    {"match_user": "WAIT-R", "reply": "collected"},
                ]
            )
        )
        [state] = await chat(http, gateway.port, "WAIT-R collect", "wait")
    assert state["pending"] == []
    by_id = {c["runId"]: c for c in state["completed"]}
    assert by_id[ids[0]]["status"] == "done"
    assert by_id[ids[0]]["result"] == "finished before the crash"
    for run_id in ids[1:]:
        assert by_id[run_id]["status"] == "failed"
        assert by_id[run_id]["error"] == INTERRUPTED_CHILD_ERROR
    # Nothing ran twice: the running child's call was not repeated, the queued one never started.
    assert calls_for(fake, "CHILD-R1") == 1
    assert calls_for(fake, "CHILD-R2") == 1
    assert calls_for(fake, "CHILD-R3") == 0

"""SIGKILL the supervisor again and again while runs are admitted, spawned, watched and revoked; restart it each
time. Whatever step each kill lands on, no run gets a second worker, every run still ends, and every identity is
revoked."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clawstack.common.uds import AsyncUnixClient, SocketUnavailableError, UnixResponse
from clawstack.pod.artifacts import PodPaths, existing_operator_token
from clawstack.proxy.client import ProxyOperatorClient

from .conftest import BACKENDS, RunsStack, make_server

RUNS = 8
KILLS = 6

pytestmark = pytest.mark.parametrize("stack", BACKENDS, indirect=True)


def serve(pod: Path, socket_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawstack", "runs", "serve", "--pod", str(pod), "--socket-dir", str(socket_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("runs listening: ")
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


async def launch(client: AsyncUnixClient, body: dict[str, Any]) -> UnixResponse:
    """``POST /v1/runs`` until a supervisor answers, as an orchestrator does: a launch torn by a kill, or sent
    while no supervisor listens, is sent again with the same body (a launch is idempotent)."""
    async with asyncio.timeout(60):
        while True:
            try:
                return await client.request("POST", "/v1/runs", json_body=body)
            except SocketUnavailableError as exc:
                if exc.code != "socket_unavailable":
                    raise
            await asyncio.sleep(0.05)


async def test_repeated_sigkill_never_duplicates_a_worker_or_loses_a_run(stack: RunsStack) -> None:
    await stack.server.stop()
    rng = random.Random(7)
    client = AsyncUnixClient(stack.socket_dir / "runs.sock")
    proc = serve(stack.pod, stack.socket_dir)
    bodies = [
        stack.launch_body(f"chaos-{i}", f"@fake reply: answer {i}\n@fake delay-ms: {rng.randint(50, 400)}")
        for i in range(RUNS)
    ]
    try:
        pending = list(bodies)
        for _ in range(KILLS):
            # Launch some runs (the kill may land during admission), then kill at a random moment. A launch the
            # kill tears is sent again until the restarted supervisor answers it. Kill and restart run in a thread:
            # the fake model the workers call is served by this event loop.
            batch, pending = pending[:2], pending[2:]
            launches = [asyncio.create_task(launch(client, body)) for body in batch]
            await asyncio.sleep(rng.uniform(0.01, 0.4))
            await asyncio.to_thread(kill, proc)
            proc = await asyncio.to_thread(serve, stack.pod, stack.socket_dir)
            for answer in await asyncio.gather(*launches):
                assert answer.status in (200, 202), answer.body
            # Launching an admitted run again with the same spec answers it and starts no second worker.
            for body in batch:
                again = await launch(client, body)
                assert again.status in (200, 202), again.body
        for body in pending:
            assert (await launch(client, body)).status in (200, 202)
        statuses = []
        for i in range(RUNS):
            answer = await client.request("GET", f"/v1/runs/acme/chaos-{i}?wait=stopped&timeout=60s", timeout_s=90)
            statuses.append(answer.json())
    finally:
        await client.close()
        kill(proc)
    assert [s["state"] for s in statuses] == ["stopped"] * RUNS, [
        (s["run_id"], s["state"], s["failure"], s["failure_detail"], s["pending"]) for s in statuses
    ]
    assert all(s["revoked"] and s["revocation_proof"] == "cllama_ack" for s in statuses)
    # One worker per run: the fake model saw exactly one chat request per run.
    chat = [r for r in stack.fake.requests if r.path.endswith("/chat/completions")]
    tasks = sorted(r.body["messages"][-1]["content"].split("\n")[0] for r in chat)
    assert tasks == sorted(f"@fake reply: answer {i}" for i in range(RUNS)), tasks
    # Every run's identity is revoked at the proxy.
    paths = PodPaths(stack.pod.resolve())
    token = existing_operator_token(paths)
    assert token is not None
    async with ProxyOperatorClient(token=token, unix_socket=str(paths.operator_socket)) as operator:
        for status in statuses:
            assert (await operator.get_identity(status["run_agent_id"]))["state"] == "revoked"
    stack.server = make_server(stack.pod, stack.socket_dir)
    await stack.server.start()

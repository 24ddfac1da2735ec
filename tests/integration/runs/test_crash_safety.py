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

from clawstack.common.uds import AsyncUnixClient
from clawstack.pod.artifacts import PodPaths, existing_operator_token
from clawstack.proxy.client import ProxyOperatorClient

from .conftest import RunsStack, make_server

RUNS = 8
KILLS = 6


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
            # Launch some runs (the kill may land during admission), then kill at a random moment.
            batch, pending = pending[:2], pending[2:]
            launches = [asyncio.create_task(client.request("POST", "/v1/runs", json_body=b)) for b in batch]
            await asyncio.sleep(rng.uniform(0.01, 0.4))
            kill(proc)
            await asyncio.gather(*launches, return_exceptions=True)
            proc = serve(stack.pod, stack.socket_dir)
            # A launch that may not have been admitted is retried with the same spec: idempotent.
            for body in batch:
                again = await client.request("POST", "/v1/runs", json_body=body)
                assert again.status in (200, 202), again.body
        for body in pending:
            await client.request("POST", "/v1/runs", json_body=body)
        statuses = []
        for i in range(RUNS):
            answer = await client.request("GET", f"/v1/runs/acme/chaos-{i}?wait=stopped&timeout=60s", timeout_s=90)
            statuses.append(answer.json())
    finally:
        await client.close()
        kill(proc)
    assert [s["state"] for s in statuses] == ["stopped"] * RUNS, statuses
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

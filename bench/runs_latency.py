"""How long from launch to running and to stopped, on the local backend? Median and p95 over sequential runs
through the whole stack (supervisor, proxy, sandbox, runner, scripted fake model), against the same runner in the
same sandbox started directly through the backend, without the supervisor or the proxy's identity steps, in the
same run.

Run: .venv/bin/python bench/runs_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from clawstack.common.clock import SystemClock
from clawstack.common.digest import spec_digest
from clawstack.common.uds import AsyncUnixClient
from clawstack.llm.fake import FakeModelServer
from clawstack.pod.artifacts import PodPaths, read_pod_manifest
from clawstack.pod.up import down, up
from clawstack.runs.backends.base import RunLabels, WorkerSpec
from clawstack.runs.backends.local import LocalBackend
from clawstack.runs.server import RunsServer
from clawstack.runs.supervisor import Supervisor
from clawstack.worker.contract import WorkerConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pod"
TASK = "@fake reply: pong"


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def through_supervisor(client: AsyncUnixClient, n: int, prefix: str) -> tuple[list[float], list[float]]:
    to_running, to_stopped = [], []
    authority = (SystemClock().now() + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for i in range(n):
        spec = {"template": "worker", "task": f"{TASK} {i}"}
        body = {
            "installation": "bench",
            "run_id": f"{prefix}-{i}",
            "generation": 1,
            "spec_digest": spec_digest(spec),
            "spec": spec,
            "authority_expires_at": authority,
        }
        start = time.perf_counter()
        assert (await client.request("POST", "/v1/runs", json_body=body)).status == 202
        await client.request("GET", f"/v1/runs/bench/{prefix}-{i}?wait=running&timeout=60s", timeout_s=90)
        to_running.append(time.perf_counter() - start)
        done = await client.request("GET", f"/v1/runs/bench/{prefix}-{i}?wait=stopped&timeout=60s", timeout_s=90)
        to_stopped.append(time.perf_counter() - start)
        assert done.json()["state"] == "stopped", done.json()
    return to_running, to_stopped


async def direct(backend: LocalBackend, socket: Path, n: int, prefix: str) -> list[float]:
    """The runner in the same sandbox, started by the backend directly; the fake needs no identity."""
    samples = []
    for i in range(n):
        labels = RunLabels(pod="pod", installation="direct", run_id=f"{prefix}-{i}")
        config = WorkerConfig(
            credential="direct:" + "s" * 32, model="m", contract="", model_unix_socket="/run/claw/proxy.sock"
        )
        start = time.perf_counter()
        await backend.spawn(
            WorkerSpec(
                labels=labels,
                task=f"{TASK} {i}",
                config=config.to_json().encode(),
                proxy_socket=socket,
                memory_bytes=512 * 1024**2,
                pids=128,
                max_runtime_s=60,
                max_output_bytes=65536,
            )
        )
        while True:
            state = await backend.inspect(labels)
            if state.exit_code is not None:
                break
            await asyncio.sleep(0.005)
        samples.append(time.perf_counter() - start)
        assert state.exit_code == 0, state
        await backend.remove(labels)
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    os.chmod(base, 0o700)
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    sock = base / "sock"
    sock.mkdir(mode=0o700)
    try:
        fake_socket_dir = base / "fake"
        fake_socket_dir.mkdir(mode=0o700)
        async with FakeModelServer() as fake, FakeModelServer(unix_socket=fake_socket_dir / "m.sock"):
            os.chmod(fake_socket_dir / "m.sock", 0o666)  # the sandbox runs as uid 65534, like the proxy's socket
            await asyncio.to_thread(up, pod, detach=True, environ={"CLAW_FAKE_LLM_URL": fake.base_url})
            paths = PodPaths(pod.resolve())
            name = read_pod_manifest(paths)["pod"]
            server = RunsServer(Supervisor(pod, LocalBackend(paths.runs / "workers", pod=name)), sock)
            await server.start()
            async with AsyncUnixClient(sock / "runs.sock") as client:
                await through_supervisor(client, 2, "warm")
                running, stopped = await through_supervisor(client, args.runs, "lat")
            await server.stop()
            backend = LocalBackend(base / "direct-workers", pod="pod")
            await direct(backend, fake_socket_dir / "m.sock", 2, "warm")
            baseline = await direct(backend, fake_socket_dir / "m.sock", args.runs, "d")
            await asyncio.to_thread(down, pod)
            isolation = backend.isolation
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{args.runs} sequential runs each, isolation: {isolation}")
    print(f"{'':<44} {'median ms':>10} {'p95 ms':>9}")
    for label, values in (
        ("launch -> running (supervisor)", running),
        ("launch -> stopped (supervisor)", stopped),
        ("spawn -> exited, same sandbox, no supervisor", baseline),
    ):
        print(f"{label:<44} {statistics.median(values) * 1e3:>10.1f} {p95(values) * 1e3:>9.1f}")
    print(
        f"launch -> stopped vs the bare sandboxed runner: {statistics.median(stopped) / statistics.median(baseline):.2f}x"
    )
    print(json.dumps({"note": "stopped includes revocation of the run's identity and removal of its sandbox"}))


if __name__ == "__main__":
    asyncio.run(main())

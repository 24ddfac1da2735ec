"""What does the compose backend cost against the local one? (1) launch -> stopped of a trivial run, p50 and p95
over sequential runs, on compose and on local (bubblewrap) in the same run; (2) 20 compose runs launched at once:
wall time until all are stopped, and the peak memory of the supervisor, its children and every worker container;
(3) a supervisor restart (a real process, SIGTERM) with 20 live worker containers: time until it serves and until
every run is adopted, still running, with no second container; (4) what a network per run would add: a fresh
``docker network create --internal`` + ``docker network rm``, against the launch -> stopped latency of (1).

The supervisor is ``claw runs serve`` as its own process on both backends; the fake model (and, on local, the
ticket tool service) run in this process.

Run: .venv/bin/python bench/runs_compose.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import docker
from aiohttp import web

from clawstack.cli.demo import make_compose_pod
from clawstack.common.clock import SystemClock
from clawstack.common.digest import spec_digest
from clawstack.common.uds import AsyncUnixClient
from clawstack.llm.fake import FakeModelServer
from clawstack.pod.imagebuild import PROXY_IMAGE, WORKER_IMAGE, build_images
from clawstack.pod.up import down, up

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pod"
TRIVIAL = "@fake reply: ok"
SHORT = "@fake reply: ok\n@fake delay-ms: 500"
LONG = "@fake reply: ok\n@fake delay-ms: 30000"
CONCURRENT = 20
NETWORKS = 10
SAMPLE_S = 0.2


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def mib(n_bytes: float) -> str:
    return f"{n_bytes / 1024**2:.1f} MiB"


def seconds_between(earlier: str | None, later: str | None) -> float:
    """Between two ledger timestamps (whole seconds); NaN when either is missing."""
    if earlier is None or later is None:
        return float("nan")
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


def launch_body(run_id: str, task: str) -> dict[str, Any]:
    spec = {"template": "worker", "task": task}
    return {
        "installation": "bench",
        "run_id": run_id,
        "generation": 1,
        "spec_digest": spec_digest(spec),
        "spec": spec,
        "authority_expires_at": (SystemClock().now() + timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


async def tool_service() -> tuple[web.AppRunner, str]:
    """The example pod's ticket API on the host, for the local backend's proxy."""
    spec = importlib.util.spec_from_file_location("example_ticket_api", EXAMPLE / "ticket_api.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runner = web.AppRunner(module.make_app("example-ticket-token-change-me"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


class Serve:
    """``claw runs serve`` as a child process, stopped with SIGTERM."""

    def __init__(self, pod: Path, sock: Path, log: Path) -> None:
        self.pod, self.sock, self.log = pod, sock, log
        self.proc: subprocess.Popen[str] | None = None
        self.started = 0.0

    def start(self) -> None:
        with self.log.open("a") as err:
            self.started = time.perf_counter()
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "clawstack",
                    "runs",
                    "serve",
                    "--pod",
                    str(self.pod),
                    "--socket-dir",
                    str(self.sock),
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )

    def wait_ready_line(self) -> float:
        assert self.proc is not None
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("runs listening"):
            raise RuntimeError(f"claw runs serve did not start; see {self.log}:\n{self.log.read_text()[-2000:]}")
        return time.perf_counter() - self.started

    def stop(self) -> float:
        if self.proc is None:
            return 0.0
        start = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None
        return time.perf_counter() - start


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def worker_containers(client: docker.DockerClient, pod: str) -> list[Any]:
    return client.containers.list(filters={"label": [f"claw.pod={pod}", "claw.role=worker"]})


def container_memory(container: Any) -> int:
    """The container's cgroup memory usage; through the stats API where the cgroup file is not at hand."""
    for path in (
        f"/sys/fs/cgroup/memory/docker/{container.id}/memory.usage_in_bytes",
        f"/sys/fs/cgroup/docker/{container.id}/memory.current",
        f"/sys/fs/cgroup/system.slice/docker-{container.id}.scope/memory.current",
    ):
        try:
            return int(Path(path).read_text())
        except (OSError, ValueError):
            continue
    try:
        return int(container.stats(stream=False)["memory_stats"].get("usage", 0))
    except Exception:  # the container went away between the listing and the read
        return 0


class MemorySampler:
    """Every SAMPLE_S: the supervisor's RSS, its descendants' RSS (docker compose) and the workers' memory."""

    def __init__(self, client: docker.DockerClient, pod: str, pid: int) -> None:
        self.client, self.pod, self.pid = client, pod, pid
        self.peak_total = self.peak_supervisor = self.peak_children = self.peak_workers = 0
        self.peak_containers = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            supervisor = rss_bytes(self.pid)
            children = sum(rss_bytes(pid) for pid in descendants(self.pid))
            try:
                listed = worker_containers(self.client, self.pod)
            except Exception:  # a container removed mid-listing; the next sample sees it gone
                listed = []
            workers = sum(container_memory(c) for c in listed)
            self.peak_supervisor = max(self.peak_supervisor, supervisor)
            self.peak_children = max(self.peak_children, children)
            self.peak_workers = max(self.peak_workers, workers)
            self.peak_containers = max(self.peak_containers, len(listed))
            self.peak_total = max(self.peak_total, supervisor + children + workers)
            self.samples += 1
            self._stop.wait(max(0.0, SAMPLE_S - (time.perf_counter() - start)))

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def wait_state(client: AsyncUnixClient, run_id: str, state: str, timeout_s: float = 120) -> dict[str, Any]:
    """Long-poll (at most 60 s a request) until the run is ``state`` or stopped, or ``timeout_s`` has passed."""
    deadline = time.perf_counter() + timeout_s
    while True:
        left = max(0, min(60, round(deadline - time.perf_counter())))
        answer = await client.request(
            "GET", f"/v1/runs/bench/{run_id}?wait={state}&timeout={left}s", timeout_s=left + 30
        )
        body = answer.json()
        if answer.status != 200:
            raise RuntimeError(f"status of {run_id}: {answer.status} {body}")
        if body["state"] in (state, "stopped") or time.perf_counter() >= deadline:
            return body


async def launch(client: AsyncUnixClient, run_id: str, task: str) -> None:
    answer = await client.request("POST", "/v1/runs", json_body=launch_body(run_id, task), timeout_s=120)
    assert answer.status == 202, (answer.status, answer.json())


async def sequential(client: AsyncUnixClient, n: int, prefix: str) -> list[float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await launch(client, f"{prefix}-{i}", TRIVIAL)
        done = await wait_state(client, f"{prefix}-{i}", "stopped")
        samples.append(time.perf_counter() - start)
        if done["state"] != "stopped" or done["exit_code"] != 0:
            raise RuntimeError(f"run {prefix}-{i} did not end cleanly: {done}")
    return samples


async def concurrent(client: AsyncUnixClient, prefix: str) -> tuple[float, float, list[dict[str, Any]]]:
    """Launch CONCURRENT runs at once; seconds until the last is running, until the last is stopped."""
    start = time.perf_counter()
    running: list[float] = []

    async def one(run_id: str) -> dict[str, Any]:
        await launch(client, run_id, SHORT)
        await wait_state(client, run_id, "running")
        running.append(time.perf_counter() - start)
        return await wait_state(client, run_id, "stopped")

    done = await asyncio.gather(*(one(f"{prefix}-{i}") for i in range(CONCURRENT)))
    return max(running), time.perf_counter() - start, list(done)


async def start_serving(serve: Serve, sock: Path) -> tuple[float, float]:
    """Start the supervisor; seconds until its readiness line, until GET /v1/health answers."""
    serve.start()
    ready, _ = await asyncio.gather(asyncio.to_thread(serve.wait_ready_line), health_poll(sock))
    return ready, time.perf_counter() - serve.started


@contextmanager
def private_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="cs-b-", dir="/tmp"))
    os.chmod(base, 0o700)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def local_latency(base: Path, n: int) -> list[float]:
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    sock = base / "sock"
    sock.mkdir(mode=0o700)
    async with FakeModelServer(host="127.0.0.1") as fake:
        tools, tools_url = await tool_service()
        serve = Serve(pod, sock, base / "serve.log")
        try:
            await asyncio.to_thread(
                up, pod, detach=True, environ={"CLAW_FAKE_LLM_URL": fake.base_url, "TICKET_API_URL": tools_url}
            )
            serve.start()
            await asyncio.to_thread(serve.wait_ready_line)
            async with AsyncUnixClient(sock / "runs.sock") as client:
                await sequential(client, 2, "warm")
                return await sequential(client, n, "lat")
        finally:
            serve.stop()
            await asyncio.to_thread(down, pod)
            await tools.cleanup()


async def health_poll(sock: Path) -> None:
    while True:
        try:
            async with AsyncUnixClient(sock / "runs.sock") as probe:
                if (await probe.request("GET", "/v1/health", timeout_s=5)).status == 200:
                    return
        except Exception:  # not listening yet
            pass
        await asyncio.sleep(0.01)


async def restart(serve: Serve, docker_client: docker.DockerClient, name: str, sock: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    ids = [f"live-{i}" for i in range(CONCURRENT)]
    async with AsyncUnixClient(sock / "runs.sock") as client:
        start = time.perf_counter()
        await asyncio.gather(*(launch(client, run_id, LONG) for run_id in ids))
        states = await asyncio.gather(*(wait_state(client, run_id, "running") for run_id in ids))
        out["all_running"] = time.perf_counter() - start
        assert all(s["state"] == "running" for s in states), [s["state"] for s in states]
    before = {c.id for c in worker_containers(docker_client, name)}
    out["containers_before"] = len(before)
    out["stop"] = serve.stop()
    out["containers_down"] = len(worker_containers(docker_client, name))
    out["ready_line"], out["health"] = await start_serving(serve, sock)
    async with AsyncUnixClient(sock / "runs.sock") as client:
        states = await asyncio.gather(*(wait_state(client, run_id, "running", 5) for run_id in ids))
        out["adopted"] = time.perf_counter() - serve.started
        out["still_running"] = sum(s["state"] == "running" for s in states)
        after = {c.id for c in worker_containers(docker_client, name)}
        out["containers_after"] = len(after)
        out["same_containers"] = float(after == before)
        start = time.perf_counter()
        cancels = await asyncio.gather(
            *(
                client.request("POST", f"/v1/runs/bench/{run_id}/cancel", json_body={"generation": 1}, timeout_s=60)
                for run_id in ids
            )
        )
        assert all(c.status == 200 for c in cancels), [c.json() for c in cancels if c.status != 200]
        done = await asyncio.gather(*(wait_state(client, run_id, "stopped") for run_id in ids))
        out["cancel"] = time.perf_counter() - start
        out["stopped"] = sum(s["state"] == "stopped" for s in done)
    return out


async def compose_all(base: Path, n: int, docker_client: docker.DockerClient, name: str) -> dict[str, Any]:
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    make_compose_pod(pod, worker_image=WORKER_IMAGE, tool_image=PROXY_IMAGE, name=name)
    sock = base / "sock"
    sock.mkdir(mode=0o700)
    results: dict[str, Any] = {}
    async with FakeModelServer(host="0.0.0.0") as fake:
        environ = {"CLAW_FAKE_LLM_URL": fake.base_url.replace("0.0.0.0", "host.docker.internal", 1)}
        serve = Serve(pod, sock, base / "serve.log")
        try:
            await asyncio.to_thread(up, pod, detach=True, environ=environ)
            results["ready_line"], results["health"] = await start_serving(serve, sock)
            assert serve.proc is not None
            async with AsyncUnixClient(sock / "runs.sock") as client:
                await sequential(client, 2, "warm")
                results["latency"] = await sequential(client, n, "lat")
                idle = rss_bytes(serve.proc.pid)
                with MemorySampler(docker_client, name, serve.proc.pid) as sampler:
                    results["all_running"], results["wall"], done = await concurrent(client, "many")
                results["sampler"] = sampler
                results["idle_rss"] = idle
                results["many_stopped"] = sum(d["state"] == "stopped" and d["exit_code"] == 0 for d in done)
                results["exit_to_end"] = [seconds_between(d["exited_at"], d["ended_at"]) for d in done]
                results["start_to_exit"] = [seconds_between(d["started_at"], d["exited_at"]) for d in done]
            results["restart"] = await restart(serve, docker_client, name, sock)
        finally:
            serve.stop()
            await asyncio.to_thread(down, pod)
    return results


def networks(docker_client: docker.DockerClient, name: str) -> tuple[list[float], list[float]]:
    cli, api = [], []
    label = f"claw.bench={name}"
    for i in range(NETWORKS + 1):
        net = f"{name}-n{i}"
        start = time.perf_counter()
        subprocess.run(
            ["docker", "network", "create", "--internal", "--label", label, net], check=True, capture_output=True
        )
        subprocess.run(["docker", "network", "rm", net], check=True, capture_output=True)
        if i:
            cli.append(time.perf_counter() - start)
        start = time.perf_counter()
        network = docker_client.networks.create(f"{net}-api", internal=True, labels={"claw.bench": name})
        network.remove()
        if i:
            api.append(time.perf_counter() - start)
    return cli, api


def leftovers(docker_client: docker.DockerClient, name: str) -> tuple[list[str], list[str]]:
    containers = docker_client.containers.list(all=True, filters={"label": f"claw.pod={name}"})
    nets = docker_client.networks.list(filters={"label": f"claw.bench={name}"})
    for network in nets:
        network.remove()
    return [c.name for c in containers], [n.name for n in nets]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    wall = time.perf_counter()
    await asyncio.to_thread(build_images)
    docker_client = docker.from_env(timeout=60)
    name = "b" + uuid.uuid4().hex[:10]
    try:
        with private_dir() as base:
            local = await local_latency(base, args.runs)
        with private_dir() as base:
            compose = await compose_all(base, args.runs, docker_client, name)
        cli, api = await asyncio.to_thread(networks, docker_client, name)
    finally:
        left_containers, left_networks = leftovers(docker_client, name)
        docker_client.close()

    lat = compose["latency"]
    c50, l50 = statistics.median(lat), statistics.median(local)
    print(f"pod {name}; {args.runs} sequential runs per backend, {CONCURRENT} concurrent; claw runs serve as a process")
    print(f"(1) launch -> stopped, local   p50 {ms(l50):>8}  p95 {ms(p95(local)):>8}")
    print(f"(1) launch -> stopped, compose p50 {ms(c50):>8}  p95 {ms(p95(lat)):>8}")
    print(f"(1) compose / local            p50 {c50 / l50:>6.2f}x  p95 {p95(lat) / p95(local):>6.2f}x")
    sampler: MemorySampler = compose["sampler"]
    print(
        f"(2) {CONCURRENT} compose runs launched at once (500 ms fake delay): all running {compose['all_running']:.2f} s, "
        f"all stopped {compose['wall']:.2f} s ({compose['many_stopped']}/{CONCURRENT} exit 0; "
        f"{compose['wall'] / c50:.1f}x one sequential run, {CONCURRENT * c50 / compose['wall']:.2f}x the throughput)"
    )
    print(
        f"(2)   from the ledger (1 s resolution): worker started -> exited median "
        f"{statistics.median(compose['start_to_exit']):.0f} s, max {max(compose['start_to_exit']):.0f} s; "
        f"exited -> stopped median {statistics.median(compose['exit_to_end']):.0f} s, "
        f"max {max(compose['exit_to_end']):.0f} s"
    )
    print(
        f"(2) peak memory {mib(sampler.peak_total)} = supervisor + its docker compose children + worker cgroups, "
        f"sampled every {SAMPLE_S:g} s ({sampler.samples} samples)"
    )
    print(
        f"(2)   peaks: supervisor RSS {mib(sampler.peak_supervisor)} (idle {mib(compose['idle_rss'])}); "
        f"docker compose children {mib(sampler.peak_children)}; workers {mib(sampler.peak_workers)} over at most "
        f"{sampler.peak_containers} containers ({mib(sampler.peak_workers / max(1, sampler.peak_containers))} each)"
    )
    r = compose["restart"]
    print(f"(3) {CONCURRENT} long runs launched at once, all running after {r['all_running']:.2f} s")
    print(
        f"(3) SIGTERM stop {ms(r['stop'])}; worker containers before {r['containers_before']:.0f}, "
        f"while down {r['containers_down']:.0f}, after restart {r['containers_after']:.0f} "
        f"(same container ids: {'yes' if r['same_containers'] else 'NO'})"
    )
    print(
        f"(3) restart -> ready line {ms(r['ready_line'])}, -> GET /v1/health {ms(r['health'])} "
        f"(first start, no workers: {ms(compose['ready_line'])}, {ms(compose['health'])}; "
        f"{r['health'] / compose['health']:.2f}x)"
    )
    print(
        f"(3) restart -> all {CONCURRENT} adopted and running {ms(r['adopted'])} "
        f"({r['still_running']:.0f}/{CONCURRENT} running); cancel all -> stopped {r['cancel']:.2f} s "
        f"({r['stopped']:.0f}/{CONCURRENT} stopped)"
    )
    n50, a50 = statistics.median(cli), statistics.median(api)
    print(
        f"(4) network create --internal + rm, fresh, median of {NETWORKS}: CLI {ms(n50)}, API {ms(a50)}; "
        f"+{n50 / c50 * 100:.0f}% (CLI) / +{a50 / c50 * 100:.0f}% (API) of compose launch -> stopped p50"
    )
    print(
        f"total {time.perf_counter() - wall:.0f} s; left behind: containers {left_containers}, networks {left_networks}"
    )


if __name__ == "__main__":
    asyncio.run(main())

"""What does a task-home run cost, and what do deliverables cost? (1) launch -> stopped p50 of a first turn (a new
home, a new Hermes session) and of a resumed turn (the same home, ``--resume``), with Hermes against an instant
scripted model, through the whole stack (supervisor, proxy, the wrapper in a bubblewrap sandbox, its forwarder
and the home meter), against Hermes alone on a home of its own outside any sandbox, in the same run; (2) a
deliverables list of 200 files and a fetch of a 512 KiB file through the supervisor's socket, against a plain
listing and read of the same files.

Run: .venv/bin/python bench/runs_task_home.py [--turns 5] [--backend local|compose]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from clawstack.common.clock import SystemClock
from clawstack.common.digest import spec_digest
from clawstack.common.uds import AsyncUnixClient
from clawstack.llm.fake import FakeModelServer
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.hermes import hermes_installation
from clawstack.pod.up import down, up
from clawstack.runs.backends import backend_for
from clawstack.runs.server import RunsServer
from clawstack.runs.supervisor import Supervisor

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "pod"
FILES = 200
BIG = 512 * 1024


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def launch_body(run_id: str, home: str, task: str) -> dict[str, Any]:
    spec = {"template": "researcher", "task": task, "home": home}
    expires = (SystemClock().now() + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "installation": "bench",
        "run_id": run_id,
        "generation": 1,
        "spec_digest": spec_digest(spec),
        "spec": spec,
        "authority_expires_at": expires,
    }


async def run_once(client: AsyncUnixClient, run_id: str, home: str, task: str) -> float:
    started = time.perf_counter()
    answer = await client.request("POST", "/v1/runs", json_body=launch_body(run_id, home, task))
    assert answer.status == 202, answer.body
    done = await client.request("GET", f"/v1/runs/bench/{run_id}?wait=stopped&timeout=60s", timeout_s=90)
    elapsed = time.perf_counter() - started
    assert done.json()["state"] == "stopped", done.json()
    return elapsed


def hermes_alone(base_url: str, home: Path, task: str, session: str | None) -> tuple[float, str]:
    """One turn of Hermes itself, on ``home`` as its HERMES_HOME, outside any sandbox."""
    site = hermes_installation().site
    config = {
        "model": {"provider": "custom", "default": "bench", "base_url": base_url, "api_key": "x",
                  "context_length": 128000},
        "security": {"tirith_enabled": False, "allow_lazy_installs": False},
        "approvals": {"mode": "off"},
        "agent": {"environment_probe": False},
    }  # fmt: skip
    import json

    (home / "config.yaml").write_text(json.dumps(config))
    (home / ".update_check").write_text('{"ts": 9999999999, "behind": 0, "rev": null, "ver": "0.19.0"}')
    launch = "import site, sys; site.addsitedir(sys.argv.pop(1)); from hermes_cli.main import main; sys.exit(main())"
    argv = [
        sys.executable,
        "-S",
        "-c",
        launch,
        str(site),
        "chat",
        "-Q",
        "-q",
        task,
        "-t",
        "terminal,file,memory,skills,todo",
    ]
    if session is not None:
        argv += ["--resume", session]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "HERMES_HOME": str(home), "LANG": "C.UTF-8"}
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=home, capture_output=True, check=True, timeout=120)
    elapsed = time.perf_counter() - started
    line = [x for x in done.stderr.decode().splitlines() if x.startswith("session_id: ")][-1]
    return elapsed, line.split(": ", 1)[1]


async def main(turns: int, backend: str) -> None:
    base = Path(tempfile.mkdtemp(prefix="cs-bench-", dir="/tmp"))
    os.chmod(base, 0o700)
    pod = base / "pod"
    shutil.copytree(EXAMPLE, pod)
    if backend == "compose":
        from clawstack.cli.demo import make_compose_pod
        from clawstack.pod.imagebuild import PROXY_IMAGE, WORKER_IMAGE, build_images

        build_images()
        make_compose_pod(pod, worker_image=WORKER_IMAGE, tool_image=PROXY_IMAGE, name=f"bench{os.getpid()}")
    sock = base / "sock"
    sock.mkdir(mode=0o700)
    try:
        async with FakeModelServer(host="0.0.0.0" if backend == "compose" else "127.0.0.1") as fake:
            upstream = fake.base_url.replace("0.0.0.0", "host.docker.internal" if backend == "compose" else "127.0.0.1")
            environ = {"CLAW_FAKE_LLM_URL": upstream, "TICKET_API_URL": "http://127.0.0.1:9"}
            await asyncio.to_thread(up, pod, detach=True, environ=environ)
            server = RunsServer(Supervisor(pod, backend_for(PodPaths(pod.resolve())), callback_origin=None), sock)
            await server.start()
            client = AsyncUnixClient(sock / "runs.sock")
            try:
                first = [await run_once(client, f"f{i}", f"home-{i}", "@fake reply: first") for i in range(turns)]
                resumed = [await run_once(client, f"r{i}", f"home-{i}", "@fake reply: again") for i in range(turns)]
                alone_first, alone_resumed = [], []
                for i in range(turns):
                    home = base / f"alone-{i}"
                    home.mkdir()
                    took, session = await asyncio.to_thread(
                        hermes_alone, fake.base_url, home, "@fake reply: first", None
                    )
                    alone_first.append(took)
                    took, _ = await asyncio.to_thread(hermes_alone, fake.base_url, home, "@fake reply: again", session)
                    alone_resumed.append(took)
                f, r = statistics.median(first), statistics.median(resumed)
                af, ar = statistics.median(alone_first), statistics.median(alone_resumed)
                print(f"backend {backend}, {turns} turns each")
                print(f"(1) first turn launch->stopped p50 {ms(f)}; Hermes alone {ms(af)} ({f / af:.2f}x)")
                print(f"(1) resumed turn launch->stopped p50 {ms(r)}; Hermes alone {ms(ar)} ({r / ar:.2f}x)")
                print(f"    overhead of the stack per turn: first {ms(f - af)}, resumed {ms(r - ar)}")
                # (2) deliverables through the socket against plain reads.
                home = server.supervisor.homes.path("bench", "home-0") / "deliverables"
                for i in range(FILES):
                    (home / f"file-{i:03}.txt").write_bytes(os.urandom(1024))
                (home / "big.bin").write_bytes(os.urandom(BIG))
                for path in home.iterdir():
                    path.chmod(0o644)
                lists, fetches, plain_lists, plain_reads = [], [], [], []
                for _ in range(20):
                    started = time.perf_counter()
                    listed = (await client.request("GET", "/v1/homes/bench/home-0/deliverables")).json()
                    lists.append(time.perf_counter() - started)
                    assert len(listed["deliverables"]) == FILES  # 201 files: the first 200, truncated
                    assert listed["truncated"]
                    started = time.perf_counter()
                    big = await client.request("GET", "/v1/homes/bench/home-0/deliverables/big.bin")
                    fetches.append(time.perf_counter() - started)
                    assert big.json()["bytes"] == BIG
                    started = time.perf_counter()
                    for name in sorted(os.listdir(home))[:FILES]:
                        (home / name).read_bytes()
                    plain_lists.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    (home / "big.bin").read_bytes()
                    plain_reads.append(time.perf_counter() - started)
                lp, fp = statistics.median(lists), statistics.median(fetches)
                pl, pr = statistics.median(plain_lists), statistics.median(plain_reads)
                print(
                    f"(2) list of {FILES} deliverables p50 {lp * 1e3:.1f} ms; plain listing+read {pl * 1e3:.2f} ms ({lp / pl:.0f}x)"
                )
                print(
                    f"(2) fetch of a 512 KiB deliverable p50 {fp * 1e3:.1f} ms; plain read {pr * 1e3:.2f} ms ({fp / pr:.0f}x)"
                )
            finally:
                await client.close()
                await server.stop()
                await asyncio.to_thread(down, pod)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--backend", choices=("local", "compose"), default="local")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.turns, arguments.backend))

"""A whole stack on real sockets: the scripted fake model, the example pod's tool service, the pod's proxy
(started by ``claw up -d``), and the supervisor with the pod's backend, served on its Unix socket.

``stack`` runs on the local backend unless a test module parametrises it (``indirect``) with :data:`BACKENDS`:
then every test runs on both, the compose one with the proxy and the tool service in containers, each run its
own Compose project, and the fake model on the host (``host.docker.internal``)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from clawstack.cli.demo import make_compose_pod
from clawstack.common.clock import SystemClock
from clawstack.common.digest import spec_digest
from clawstack.common.uds import AsyncUnixClient, UnixResponse
from clawstack.llm.fake import FakeModelServer
from clawstack.pod.artifacts import PodPaths
from clawstack.pod.up import down, up
from clawstack.runs.backends import backend_for
from clawstack.runs.server import RunsServer
from clawstack.runs.supervisor import Supervisor
from tests.docker_images import requires_docker

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pod"
BACKENDS = ["local", pytest.param("compose", marks=requires_docker.marks)]
"""For ``pytest.mark.parametrize("stack", BACKENDS, indirect=True)``."""


def unique_pod_name() -> str:
    """A pod name of its own: compose pods on one engine are told apart by name (projects, labels, networks)."""
    return f"t{uuid.uuid4().hex[:12]}"


@dataclass
class RunsStack:
    pod: Path
    fake: FakeModelServer
    server: RunsServer
    client: AsyncUnixClient
    socket_dir: Path
    environ: dict[str, str] = field(default_factory=dict)  # what claw up interpolates (the fake's and tools' URLs)

    @property
    def supervisor(self) -> Supervisor:
        return self.server.supervisor

    async def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> UnixResponse:
        return await self.client.request(method, path, json_body=body, body=raw, timeout_s=90)

    def launch_body(self, run_id: str, task: str = "@fake reply: done", **spec_extra: Any) -> dict[str, Any]:
        spec = {"template": "worker", "task": task, **spec_extra}
        return {
            "installation": "acme",
            "run_id": run_id,
            "generation": 1,
            "spec_digest": spec_digest(spec),
            "spec": spec,
            "authority_expires_at": (SystemClock().now() + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    async def restart(self, **kwargs: Any) -> None:
        await self.server.stop()
        self.server = make_server(self.pod, self.socket_dir, **kwargs)
        await self.server.start()

    async def recompile(self, edit: Callable[[str], str], **kwargs: Any) -> None:
        """Drain-free recompile for tests: stop the supervisor, rewrite claw-pod.yml, claw up, start again."""
        await self.server.stop()
        pod_file = self.pod / "claw-pod.yml"
        pod_file.write_text(edit(pod_file.read_text()))
        await asyncio.to_thread(up, self.pod, detach=True, environ=self.environ)
        self.server = make_server(self.pod, self.socket_dir, **kwargs)
        await self.server.start()


async def eventually(check: Callable[[], Any], *, timeout_s: float = 30.0, what: str = "the condition") -> Any:
    """Poll ``check`` (sync, or async returning an awaitable) until it returns something truthy; return that."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                value = check()
                if asyncio.iscoroutine(value):
                    value = await value
                if value:
                    return value
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"{what} did not hold within {timeout_s:g} s") from None


def make_server(pod: Path, socket_dir: Path, *, body_timeout_s: float = 10.0, **kwargs: Any) -> RunsServer:
    backend = backend_for(PodPaths(pod.resolve()))
    return RunsServer(Supervisor(pod, backend, **kwargs), socket_dir, body_timeout_s=body_timeout_s)


async def tool_service() -> tuple[web.AppRunner, str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("example_ticket_api", EXAMPLE / "ticket_api.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runner = web.AppRunner(module.make_app("example-ticket-token-change-me"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.fixture(scope="session")
def clawstack_images() -> None:
    """clawstack's proxy and worker images, built once per session (``claw images build`` is idempotent)."""
    from clawstack.pod.imagebuild import build_images

    build_images()


@contextlib.asynccontextmanager
async def running_stack(short_dir: Path, backend: str, *, worker_image: str | None = None) -> AsyncIterator[RunsStack]:
    """The example pod on ``backend``, its proxy up and its supervisor serving; under compose its worker template
    runs ``worker_image`` (default: clawstack/worker) and the pod gets a name of its own."""
    pod = short_dir / "pod"
    shutil.copytree(EXAMPLE, pod)
    socket_dir = short_dir / "sock"
    socket_dir.mkdir(mode=0o700)
    if backend == "compose":
        from clawstack.pod.imagebuild import PROXY_IMAGE, WORKER_IMAGE

        image = worker_image or WORKER_IMAGE
        make_compose_pod(pod, worker_image=image, tool_image=PROXY_IMAGE, name=unique_pod_name())
    async with FakeModelServer(host="0.0.0.0" if backend == "compose" else "127.0.0.1") as fake:
        tools, tools_url = await tool_service()
        environ = {"CLAW_FAKE_LLM_URL": fake.base_url, "TICKET_API_URL": tools_url}
        if backend == "compose":
            environ["CLAW_FAKE_LLM_URL"] = fake.base_url.replace("0.0.0.0", "host.docker.internal", 1)
        try:
            await asyncio.to_thread(up, pod, detach=True, environ=environ)
            server = make_server(pod, socket_dir, callback_origin=None)
            await server.start()
            client = AsyncUnixClient(socket_dir / "runs.sock")
            state = RunsStack(pod, fake, server, client, socket_dir, environ)
            try:
                yield state
            finally:
                await client.close()
                await state.server.stop()
        finally:
            # Whatever failed above, the pod comes down (under compose: its containers, network and host guard).
            await asyncio.to_thread(down, pod)
            await tools.cleanup()


@pytest.fixture
async def stack(request: pytest.FixtureRequest, short_dir: Path) -> AsyncIterator[RunsStack]:
    backend = getattr(request, "param", "local")
    if backend == "compose":
        request.getfixturevalue("clawstack_images")
    async with running_stack(short_dir, backend) as state:
        yield state

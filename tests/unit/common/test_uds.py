"""HTTP over Unix sockets: peer-UID admission on the server, directory and peer-UID checks on the clients."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from clawstack.common.files import UnsafePathError
from clawstack.common.uds import (
    AsyncUnixClient,
    PeerCredentialError,
    SocketUnavailableError,
    UnixSocketServer,
    request_peer,
    sync_client,
    verify_socket,
)

from .conftest import NOBODY, requires_root

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


def make_app(release: asyncio.Event | None = None, started: asyncio.Event | None = None) -> web.Application:
    async def whoami(request: web.Request) -> web.Response:
        peer = request_peer(request)
        return web.json_response({"uid": peer.uid, "pid": peer.pid})

    async def slow(request: web.Request) -> web.Response:
        assert release is not None
        assert started is not None
        started.set()
        await release.wait()
        return web.json_response({"done": True})

    app = web.Application()
    app.router.add_get("/whoami", whoami)
    app.router.add_get("/slow", slow)
    return app


def sock_dir_in(base: Path, mode: int = 0o700) -> Path:
    path = base / "sock"
    path.mkdir()
    os.chmod(path, mode)
    return path


async def test_async_client_round_trip_reports_our_peer_credentials(short_dir: Path) -> None:
    path = sock_dir_in(short_dir) / "api.sock"
    async with UnixSocketServer(make_app(), path), AsyncUnixClient(path) as client:
        resp = await client.request("GET", "/whoami")
        assert resp.status == 200
        assert resp.json() == {"uid": os.geteuid(), "pid": os.getpid()}
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o660)
    assert not path.exists()  # stop removes the socket


async def test_sync_client_round_trip(short_dir: Path) -> None:
    path = sock_dir_in(short_dir) / "api.sock"
    async with UnixSocketServer(make_app(), path):

        def call() -> dict[str, int]:
            with sync_client(path) as client:
                return client.get("/whoami").json()  # type: ignore[no-any-return]

        assert (await asyncio.to_thread(call))["uid"] == os.geteuid()


async def test_server_refuses_an_unsafe_directory(short_dir: Path) -> None:
    for mode in (0o755, 0o777):
        loose = short_dir / f"d{mode:o}"
        loose.mkdir()
        os.chmod(loose, mode)
        with pytest.raises(UnsafePathError):
            await UnixSocketServer(make_app(), loose / "api.sock").start()
        assert not (loose / "api.sock").exists()


async def test_clients_refuse_a_socket_in_an_unsafe_directory(short_dir: Path) -> None:
    sock_dir = sock_dir_in(short_dir)
    path = sock_dir / "api.sock"
    async with UnixSocketServer(make_app(), path):
        os.chmod(sock_dir, 0o777)
        async with AsyncUnixClient(path) as client:
            with pytest.raises(UnsafePathError, match="mode 0777"):
                await client.request("GET", "/whoami")

        def call() -> None:
            with sync_client(path) as client:
                client.get("/whoami")

        with pytest.raises(UnsafePathError, match="mode 0777"):
            await asyncio.to_thread(call)
        os.chmod(sock_dir, 0o700)
        os.chmod(short_dir, 0o777)  # an ancestor made world-writable
        with pytest.raises(UnsafePathError, match="ancestor"):
            verify_socket(path)


async def test_client_refuses_a_non_socket_and_a_missing_socket(short_dir: Path) -> None:
    sock_dir = sock_dir_in(short_dir)
    with pytest.raises(SocketUnavailableError, match="no socket"):
        verify_socket(sock_dir / "api.sock")
    (sock_dir / "file").write_text("x")
    with pytest.raises(SocketUnavailableError) as info:
        verify_socket(sock_dir / "file")
    assert info.value.code == "socket_invalid"


async def test_socket_path_length_is_checked(short_dir: Path) -> None:
    deep = sock_dir_in(short_dir) / ("d" * 100)
    deep.mkdir(mode=0o700)
    with pytest.raises(SocketUnavailableError) as info:
        await UnixSocketServer(make_app(), deep / "api.sock").start()
    assert info.value.code == "socket_path_too_long"


async def test_stale_socket_is_replaced_and_a_live_one_refused(short_dir: Path) -> None:
    path = sock_dir_in(short_dir) / "api.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # a socket file nobody listens on, as a SIGKILLed server leaves
    async with UnixSocketServer(make_app(), path):
        with pytest.raises(SocketUnavailableError) as info:
            await UnixSocketServer(make_app(), path).start()
        assert info.value.code == "socket_in_use"
        async with AsyncUnixClient(path) as client:
            assert (await client.request("GET", "/whoami")).status == 200
    path.write_text("not a socket")
    with pytest.raises(SocketUnavailableError) as info:
        await UnixSocketServer(make_app(), path).start()
    assert info.value.code == "socket_in_use"


async def test_stop_waits_for_in_flight_requests(short_dir: Path) -> None:
    release, started = asyncio.Event(), asyncio.Event()
    path = sock_dir_in(short_dir) / "api.sock"
    server = UnixSocketServer(make_app(release, started), path, shutdown_timeout_s=10)
    await server.start()
    async with AsyncUnixClient(path) as client:
        in_flight = asyncio.create_task(client.request("GET", "/slow"))
        await started.wait()
        stopping = asyncio.create_task(server.stop())
        done, _ = await asyncio.wait([stopping], timeout=0.3)
        assert not done  # stop is waiting for the request in flight
        release.set()
        resp = await in_flight
        await stopping
    assert resp.status == 200
    assert resp.json() == {"done": True}
    await server.stop()  # idempotent


def _raw_request_as(uid: int, path: Path) -> str:
    assert SYSTEM_PYTHON is not None
    script = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "s.sendall(b'GET /whoami HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "out=b''\n"
        "while True:\n"
        "    b=s.recv(65536)\n"
        "    if not b: break\n"
        "    out+=b\n"
        "sys.stdout.write(out.decode())\n"
    )
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", script, str(path)],
        user=uid,
        group=uid,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        timeout=20,
        check=True,
    )
    return done.stdout.decode()


@requires_root
@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs a system python3 that another user can run")
@pytest.mark.parametrize("allowed", [False, True])
async def test_server_admits_only_allowed_uids(short_dir: Path, allowed: bool) -> None:
    os.chmod(short_dir, 0o711)
    sock_dir = sock_dir_in(short_dir, 0o750)
    os.chown(sock_dir, 0, NOBODY)
    path = sock_dir / "api.sock"
    async with UnixSocketServer(make_app(), path, allowed_uids=[NOBODY] if allowed else []) as server:
        os.chown(path, 0, NOBODY)
        assert NOBODY in server.allowed_uids or not allowed
        answer = await asyncio.to_thread(_raw_request_as, NOBODY, path)
    head, _, body = answer.partition("\r\n\r\n")
    if allowed:
        assert head.startswith("HTTP/1.1 200")
        assert json.loads(body)["uid"] == NOBODY
    else:
        assert head.startswith("HTTP/1.1 403")
        assert json.loads(body)["error"]["code"] == "peer_forbidden"


@requires_root
async def test_clients_refuse_a_server_running_as_another_uid(short_dir: Path) -> None:
    sock_dir = sock_dir_in(short_dir)
    path = sock_dir / "api.sock"
    async with UnixSocketServer(make_app(), path):
        # The directory claims the server is NOBODY, but root answers on the socket: an impostor.
        os.chown(sock_dir, NOBODY, NOBODY)
        async with AsyncUnixClient(path, server_uid=NOBODY) as client:
            with pytest.raises(PeerCredentialError, match="expected uid 65534"):
                await client.request("GET", "/whoami")

        def call() -> None:
            with sync_client(path, server_uid=NOBODY) as client:
                client.get("/whoami")

        with pytest.raises(PeerCredentialError, match="expected uid 65534"):
            await asyncio.to_thread(call)


# httpcore does not close a Unix socket whose connect() was refused; the garbage collector does, with a warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_client_reports_an_unreachable_server(short_dir: Path) -> None:
    path = sock_dir_in(short_dir) / "api.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    async with AsyncUnixClient(path) as client:
        with pytest.raises(SocketUnavailableError):
            await client.request("GET", "/whoami")
    with pytest.raises(SocketUnavailableError), sync_client(path) as sclient:
        sclient.get("/whoami")


async def test_client_bounds_the_answer(short_dir: Path) -> None:
    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 5000)

    app = web.Application()
    app.router.add_get("/big", big)
    path = sock_dir_in(short_dir) / "api.sock"
    async with UnixSocketServer(app, path), AsyncUnixClient(path, max_body_bytes=4096) as client:
        with pytest.raises(SocketUnavailableError) as info:
            await client.request("GET", "/big")
        assert info.value.code == "response_too_large"


async def test_client_reads_a_large_answer_whole(short_dir: Path) -> None:
    body = os.urandom(3 * 1024 * 1024)

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = len(body)
        await response.prepare(request)
        for start in range(0, len(body), 65536):  # arrives in many pieces
            await response.write(body[start : start + 65536])
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/big", big)
    path = sock_dir_in(short_dir) / "api.sock"
    async with UnixSocketServer(app, path), AsyncUnixClient(path) as client:
        resp = await client.request("GET", "/big")
        assert resp.body == body


# A server in its own process, so that SIGKILL closes its end of every connection at once, as a crash would.
_COUNTING_SERVER = """
import asyncio, os, sys
from aiohttp import web
from clawstack.common.uds import UnixSocketServer

async def main():
    async def answer(request):
        return web.json_response({"pid": os.getpid(), "body": await request.json()})
    app = web.Application()
    app.router.add_post("/echo", answer)
    async with UnixSocketServer(app, sys.argv[1]):
        print("listening", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def start_server_process(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _COUNTING_SERVER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "listening\n"
    return proc


def kill_server_process(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(10)
    assert proc.stdout is not None
    proc.stdout.close()


async def test_a_pooled_connection_to_a_killed_server_is_not_written_to(short_dir: Path) -> None:
    path = sock_dir_in(short_dir) / "api.sock"
    first = start_server_process(path)
    try:
        async with AsyncUnixClient(path) as client:
            assert (await client.request("POST", "/echo", json_body=1)).json()["pid"] == first.pid
            # Kill and restart without yielding to the event loop: the loop has not yet read the hang-up of the
            # pooled connection, as on a busy machine. A POST written into it would fail with a broken pipe.
            kill_server_process(first)
            first = start_server_process(path)
            answer = await client.request("POST", "/echo", json_body=2)
            assert answer.json() == {"pid": first.pid, "body": 2}
    finally:
        kill_server_process(first)


async def test_a_request_the_server_read_before_the_connection_ended_is_sent_again_only_if_idempotent(
    short_dir: Path,
) -> None:
    received: list[str] = []

    async def drop(request: web.Request) -> web.Response:
        received.append(request.method)
        assert request.transport is not None
        request.transport.abort()  # read, maybe acted on, never answered: as a server killed mid-request
        return web.Response()

    async def ok(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_route("*", "/drop", drop)
    app.router.add_get("/ok", ok)
    path = sock_dir_in(short_dir) / "api.sock"
    async with UnixSocketServer(app, path), AsyncUnixClient(path) as client:
        for method in ("POST", "GET"):
            await client.request("GET", "/ok")  # the next request goes on this pooled connection
            with pytest.raises(SocketUnavailableError) as info:
                await client.request(method, "/drop", json_body={"n": 1})
            assert info.value.code == "socket_unavailable"
            assert info.value.retryable is True
    assert received == ["POST", "GET", "GET"]


def test_httpx_is_the_sync_transport() -> None:
    assert issubclass(type(sync_client("/nonexistent/x.sock")), httpx.Client)

"""HTTP over Unix sockets, authenticated in both directions by peer credentials.

Server side, :class:`UnixSocketServer` serves an :class:`aiohttp.web.Application` on a socket inside a trusted
directory and reads every connecting peer's UID with ``SO_PEERCRED``. A peer whose UID is not allowed is answered
``403`` with ``{"error":{"code":"peer_forbidden",…}}`` and disconnected before any of its bytes reach the
application.

Client side, :class:`UnixSocketTransport` (for :mod:`httpx`) and :class:`AsyncUnixClient` (on :mod:`aiohttp`)
check, before every request, that the socket's directory passes the trust rule for the expected server UID and,
before trusting any answer, that the process at the other end of the connection runs as that UID.

A peer-UID check authenticates a Unix account, not a program: root or the server's UID can impersonate either
side. That is the trusted-host design the spec states.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import select
import socket
import stat
import struct
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import httpx
from aiohttp import web
from aiohttp.connector import Connection

from clawstack.common.errors import ClawError
from clawstack.common.files import check_trusted_dir

log = logging.getLogger(__name__)

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH_BYTES: Final = 107
_UCRED: Final = struct.Struct("3i")
_FORBIDDEN_BODY: Final = json.dumps(
    {"error": {"code": "peer_forbidden", "message": "this user may not use this socket"}}
).encode()
_FORBIDDEN_RESPONSE: Final = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_FORBIDDEN_BODY)}\r\n".encode()
    + b"Connection: close\r\n\r\n"
    + _FORBIDDEN_BODY
)


class PeerCredentialError(ClawError):
    """The other end of a Unix socket is not who it must be, or its credentials cannot be read."""

    code = "peer_forbidden"


class SocketUnavailableError(ClawError):
    """The socket cannot be reached or served (missing, refused, in use, path too long)."""

    code = "socket_unavailable"
    retryable = True


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """The credentials of the process at the other end of a connected Unix socket."""

    pid: int
    uid: int
    gid: int


def peer_credentials(sock: Any) -> PeerCredentials:
    """Read ``SO_PEERCRED`` from a connected Unix socket (a :class:`socket.socket` or asyncio's wrapper)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError as exc:
        raise PeerCredentialError("cannot read the peer's credentials", code="peer_unknown") from exc
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)


def request_peer(request: web.BaseRequest) -> PeerCredentials:
    """The peer credentials of the connection that carried ``request``."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        raise PeerCredentialError("request has no socket", code="peer_unknown")
    return peer_credentials(sock)


def _check_path_length(path: Path) -> None:
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise SocketUnavailableError(
            f"socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes", code="socket_path_too_long"
        )


# --------------------------------------------------------------------------------------------------- server


class _PeerGate(asyncio.Protocol):
    """Admits a connection to aiohttp's protocol only if the peer's UID is allowed.

    A refused peer gets a 403, then the write side is shut and whatever it sends is discarded until it hangs
    up (or a short grace period ends), so that it reads the answer instead of a connection reset.
    """

    refusal_grace_s: Final = 2.0

    def __init__(self, make_inner: Callable[[], asyncio.Protocol], allowed_uids: frozenset[int]) -> None:
        self._make_inner = make_inner
        self._allowed = allowed_uids
        self._inner: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        try:
            uid: int | None = peer_credentials(transport.get_extra_info("socket")).uid
        except PeerCredentialError:
            uid = None
        if uid is not None and uid in self._allowed:
            self._inner = self._make_inner()
            self._inner.connection_made(transport)
            return
        log.warning("refused a connection from uid %s", uid)
        if isinstance(transport, asyncio.WriteTransport):
            transport.write(_FORBIDDEN_RESPONSE)
            if transport.can_write_eof():
                transport.write_eof()
        asyncio.get_running_loop().call_later(self.refusal_grace_s, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        # A refused peer hung up: returning None closes our side too.
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class _PeerCheckedUnixSite(web.BaseSite):
    __slots__ = ("_allowed", "_path")

    def __init__(self, runner: web.BaseRunner, path: Path, allowed_uids: frozenset[int]) -> None:
        super().__init__(runner)
        self._path = path
        self._allowed = allowed_uids

    @property
    def name(self) -> str:
        return f"http://unix:{self._path}:"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        if server is None:
            raise RuntimeError("runner is not set up")
        allowed = self._allowed
        self._server = await asyncio.get_running_loop().create_unix_server(
            lambda: _PeerGate(server, allowed), str(self._path), backlog=self._backlog
        )


def remove_stale_socket(path: Path) -> None:
    """Remove a socket file nobody listens on; refuse (``socket_in_use``) a live one or a non-socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketUnavailableError(f"{path} exists and is not a socket", code="socket_in_use")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise SocketUnavailableError(f"cannot probe {path}: {exc.strerror}", code="socket_in_use") from exc
        path.unlink(missing_ok=True)  # nobody listens: a leftover from a killed server
    else:
        raise SocketUnavailableError(f"another server is listening on {path}", code="socket_in_use")
    finally:
        probe.close()


class UnixSocketServer:
    """Serve ``app`` on the Unix socket ``path``, admitting only peers whose UID is allowed.

    The socket's directory must pass :func:`~clawstack.common.files.check_trusted_dir` (owned by us, mode 0700
    or 0750, safe ancestors) unless ``check_dir`` is false. Our own effective UID is always allowed. A leftover
    socket from a dead server is replaced; a live one is refused with ``socket_in_use``. The socket file is
    mode 0660 so that a 0750 directory can admit a group; the directory decides who can reach it.
    """

    def __init__(
        self,
        app: web.Application,
        path: str | os.PathLike[str],
        *,
        allowed_uids: Iterable[int] = (),
        check_dir: bool = True,
        shutdown_timeout_s: float = 60.0,
        access_log: logging.Logger | None = None,
    ) -> None:
        self.path = Path(path)
        self.allowed_uids = frozenset({os.geteuid(), *allowed_uids})
        self._app = app
        self._check_dir = check_dir
        self._runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout_s, access_log=access_log)
        self._started = False

    async def start(self) -> None:
        """Bind and listen. Raises :class:`SocketUnavailableError` or ``UnsafePathError``."""
        _check_path_length(self.path)
        if self._check_dir:
            check_trusted_dir(self.path.parent)
        remove_stale_socket(self.path)
        await self._runner.setup()
        site = _PeerCheckedUnixSite(self._runner, self.path, self.allowed_uids)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise SocketUnavailableError(f"cannot listen on {self.path}: {exc.strerror}") from exc
        os.chmod(self.path, 0o660)
        self._started = True

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to the shutdown timeout), remove the socket.

        Idempotent.
        """
        if not self._started:
            return
        self._started = False
        await self._runner.cleanup()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def __aenter__(self) -> UnixSocketServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


# --------------------------------------------------------------------------------------------------- clients


def verify_socket(path: str | os.PathLike[str], *, server_uid: int | None = None) -> Path:
    """Check, before connecting, that ``path`` is a socket in a directory trusted for ``server_uid``.

    ``server_uid`` defaults to our own effective UID.
    """
    sock_path = Path(path)
    _check_path_length(sock_path)
    check_trusted_dir(sock_path.parent, owner_uid=server_uid)
    try:
        st = os.lstat(sock_path)
    except FileNotFoundError as exc:
        raise SocketUnavailableError(f"no socket at {sock_path}; is the server running?") from exc
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketUnavailableError(f"{sock_path} is not a socket", code="socket_invalid")
    return sock_path


def _check_server_peer(sock: Any, server_uid: int) -> None:
    if sock is None:
        raise PeerCredentialError("connection has no socket", code="peer_unknown")
    creds = peer_credentials(sock)
    if creds.uid != server_uid:
        raise PeerCredentialError(f"server runs as uid {creds.uid}, expected uid {server_uid}")


def _server_hung_up(sock: Any) -> bool:
    """Whether an idle kept-alive connection is unusable: its server closed it or sent bytes nobody asked for.

    The kernel knows at once when the server's end is closed; the event loop learns it only on a later iteration,
    so a request made meanwhile would be written into a dead connection.
    """
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)  # POLLHUP and POLLERR are always reported
    return bool(poller.poll(0))


class _PeerCheckedUnixConnector(aiohttp.UnixConnector):
    """Checks the server's peer UID each time a connection is taken, new or pooled, before a request is sent.

    A pooled connection the server has hung up on is closed and the next one taken (a new one, once the pool is
    empty), before any byte of the request is written on it.
    """

    def __init__(self, path: str, server_uid: int) -> None:
        super().__init__(path=path)
        self._server_uid = server_uid
        self._handed_out: weakref.WeakSet[object] = weakref.WeakSet()  # protocols that carried a request

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Any],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
    ) -> Connection:
        while True:
            connection = await super().connect(req, traces, timeout)
            transport, protocol = connection.transport, connection.protocol
            sock = transport.get_extra_info("socket") if transport is not None else None
            # Each pass either returns or closes one pooled connection, so the pool runs out and a new one is made.
            if protocol in self._handed_out and (sock is None or _server_hung_up(sock)):
                connection.close()
                continue
            if protocol is not None:
                self._handed_out.add(protocol)
            try:
                _check_server_peer(sock, self._server_uid)
            except PeerCredentialError:
                connection.close()
                raise
            return connection


class UnixSocketTransport(httpx.BaseTransport):
    """An :mod:`httpx` transport to a Unix-socket server whose directory and peer UID are verified.

    Use with ``httpx.Client(transport=UnixSocketTransport(path), base_url="http://claw")``.
    """

    def __init__(self, path: str | os.PathLike[str], *, server_uid: int | None = None) -> None:
        self.path = Path(path)
        self.server_uid = os.geteuid() if server_uid is None else server_uid
        self._inner = httpx.HTTPTransport(uds=str(self.path))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        verify_socket(self.path, server_uid=self.server_uid)
        try:
            response = self._inner.handle_request(request)
        except httpx.ConnectError as exc:
            raise SocketUnavailableError(f"cannot connect to {self.path}") from exc
        stream = response.extensions.get("network_stream")
        try:
            _check_server_peer(stream.get_extra_info("socket") if stream is not None else None, self.server_uid)
        except PeerCredentialError:
            response.close()
            raise
        return response

    def close(self) -> None:
        self._inner.close()


def sync_client(
    path: str | os.PathLike[str], *, server_uid: int | None = None, timeout_s: float = 75.0
) -> httpx.Client:
    """An :class:`httpx.Client` bound to the Unix-socket server at ``path`` (base URL ``http://claw``)."""
    return httpx.Client(
        transport=UnixSocketTransport(path, server_uid=server_uid), base_url="http://claw", timeout=timeout_s
    )


@dataclass(frozen=True, slots=True)
class UnixResponse:
    """A complete answer from :class:`AsyncUnixClient`."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class AsyncUnixClient:
    """An :mod:`aiohttp` client for a Unix-socket server whose directory and peer UID are verified.

    Every request re-checks the directory before it is sent, and the server's UID on the connection it is sent on.

    Connections are kept alive and reused. When the server goes away (killed, restarted, or it closed an idle
    connection):

    * A pooled connection the server has hung up on is found out before any byte of a request is written on it,
      and the request goes on a live pooled connection or a new one. Nothing was sent, so this holds for every
      method.
    * A request that fails after it was written, before an answer arrived, is sent once more on another
      connection only if its method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE; aiohttp's rule, after
      RFC 9110 section 9.2.2). A POST or PATCH is not sent again: the server may have read it and acted before
      the connection ended, and the client cannot tell that from a server that never read it (a write into a
      Unix socket succeeds once the bytes are in the server's queue). It fails with ``socket_unavailable``
      (retryable); a caller whose request is idempotent, such as a run launch repeated with the same body,
      retries it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        server_uid: int | None = None,
        max_body_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.path = Path(path)
        self.server_uid = os.geteuid() if server_uid is None else server_uid
        self._max_body = max_body_bytes
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = _PeerCheckedUnixConnector(str(self.path), self.server_uid)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 75.0,
    ) -> UnixResponse:
        """Send one request and return the whole answer (at most ``max_body_bytes``)."""
        verify_socket(self.path, server_uid=self.server_uid)
        data = body if json_body is None else json.dumps(json_body).encode()
        send_headers = dict(headers or {})
        if json_body is not None:
            send_headers.setdefault("Content-Type", "application/json")
        session = self._get_session()
        try:
            async with (
                asyncio.timeout(timeout_s),
                session.request(method, "http://claw" + path, data=data, headers=send_headers) as resp,
            ):
                # read(n) returns what has arrived so far, not n bytes: gather chunks until the end of the body.
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_any():
                    size += len(chunk)
                    if size > self._max_body:
                        raise SocketUnavailableError(
                            f"answer larger than {self._max_body} bytes", code="response_too_large", retryable=False
                        )
                    chunks.append(chunk)
                return UnixResponse(status=resp.status, headers=dict(resp.headers), body=b"".join(chunks))
        except aiohttp.ClientConnectionError as exc:
            raise SocketUnavailableError(f"cannot talk to {self.path}: {type(exc).__name__}") from exc
        except TimeoutError as exc:
            raise SocketUnavailableError(f"no answer from {self.path} within {timeout_s} s", code="timeout") from exc

    async def close(self) -> None:
        """Close pooled connections. Idempotent."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncUnixClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "AsyncUnixClient",
    "PeerCredentialError",
    "PeerCredentials",
    "SocketUnavailableError",
    "UnixResponse",
    "UnixSocketServer",
    "UnixSocketTransport",
    "peer_credentials",
    "remove_stale_socket",
    "request_peer",
    "sync_client",
    "verify_socket",
]

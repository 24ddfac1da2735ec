"""A client for the gateway WebSocket protocol (version 4), as ClawConnect needs it.

One :class:`GatewayClient` keeps one WebSocket to one gateway: it answers the ``connect.challenge`` with
``connect`` (``client {id: "gateway-client", mode: "backend"}``, the scopes :data:`SCOPES`, ``auth.token`` or
``auth.password``) under a handshake deadline, reconnects with exponential backoff (1 s, 2 s, 4 s … 30 s, reset
after a successful handshake), and routes ``chat`` and ``agent`` events to the runs being watched.

* :meth:`GatewayClient.request` sends one request and waits for its ``res``. A socket that closes first fails it
  with :class:`~clawstack.connect.errors.GatewayTransportError` (retryable); no answer in time is
  :class:`~clawstack.connect.errors.GatewayTimeoutError`; ``ok: false`` is
  :class:`~clawstack.connect.errors.GatewayRequestError` with the gateway's code.
* :meth:`GatewayClient.chat_send` retries ``chat.send`` with the same ``idempotencyKey`` after a transport loss or a
  timeout, so a run is never started twice: the gateway answers a repeated key with ``in_flight`` or the run's end.
* Events for a run id nobody watches yet are kept (at most ``max_buffered_events``, oldest dropped) and handed to
  :meth:`GatewayClient.watch` when it names that run, since events may overtake the ``chat.send`` answer.
* After a socket closes, :attr:`GatewayClient.liveness` reads ``reconnecting`` for ``close_grace_s`` and then
  ``unreachable``; watchers get ``disconnected`` and, once the session subscriptions are renewed, ``reconnected``.

A malformed frame (not JSON, not an object, no ``type``) is logged and ignored; it never ends the connection.
Secrets are never logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import json
import logging
import platform
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import aiohttp

from clawstack import __version__
from clawstack.common.clock import Clock, SystemClock
from clawstack.common.ids import new_uuid
from clawstack.connect.errors import (
    GatewayError,
    GatewayRequestError,
    GatewayTimeoutError,
    GatewayTransportError,
    HandshakeError,
)

PROTOCOL_VERSION: Final = 4
CLIENT_ID: Final = "gateway-client"
CLIENT_MODE: Final = "backend"
#: The narrowest operator scopes for what ClawConnect calls (``chat.send``, ``chat.abort``, ``chat.history``,
#: ``sessions.messages.subscribe``); never ``operator.admin``: ``claw gateway serve`` then refuses a caller's
#: ``/reset``, ``/new`` and ``require_auth`` plugin commands, which need the gateway operator's full authority.
SCOPES: Final = ("operator.read", "operator.write")
DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0
DEFAULT_REQUEST_TIMEOUT_S: Final = 30.0
DEFAULT_BACKOFF_INITIAL_S: Final = 1.0
DEFAULT_BACKOFF_MAX_S: Final = 30.0
DEFAULT_CLOSE_GRACE_S: Final = 15.0
DEFAULT_MAX_BUFFERED_EVENTS: Final = 256
MAX_FRAME_BYTES: Final = 25 * 1024 * 1024

Liveness = Literal["connected", "connecting", "reconnecting", "unreachable", "closed"]
EventKind = Literal["chat", "agent", "disconnected", "reconnected"]

_log = logging.getLogger(__name__)


class ConnectionState(enum.Enum):
    """Where the client's socket is."""

    NEW = "new"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class RunEvent:
    """A ``chat`` or ``agent`` event of a watched run, or a notice that the connection went or came back."""

    kind: EventKind
    payload: dict[str, Any] = field(default_factory=dict)


class RunWatch:
    """The events of one run, in arrival order."""

    def __init__(self, run_id: str, session_key: str) -> None:
        self.run_id = run_id
        self.session_key = session_key
        self._queue: asyncio.Queue[RunEvent] = asyncio.Queue()

    def put(self, event: RunEvent) -> None:
        self._queue.put_nowait(event)

    async def next(self, timeout_s: float) -> RunEvent | None:
        """The next event, or ``None`` after ``timeout_s`` without one."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._queue.get()
        except TimeoutError:
            return None


class GatewayClient:
    """One reconnecting WebSocket to one gateway; see the module docstring.

    ``secret`` is sent as ``auth.token`` when ``auth_kind`` is ``"token"``, else as ``auth.password``.
    """

    def __init__(
        self,
        url: str,
        *,
        secret: str,
        auth_kind: str = "password",
        clock: Clock | None = None,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        close_grace_s: float = DEFAULT_CLOSE_GRACE_S,
        max_buffered_events: int = DEFAULT_MAX_BUFFERED_EVENTS,
    ) -> None:
        if min(handshake_timeout_s, request_timeout_s, backoff_initial_s, backoff_max_s) <= 0:
            raise ValueError("timeouts and backoff delays must be positive")
        if max_buffered_events < 1 or close_grace_s < 0:
            raise ValueError("max_buffered_events must be positive and close_grace_s not negative")
        self.url = url
        self._secret = secret
        self._auth_kind = "token" if auth_kind == "token" else "password"
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.handshake_timeout_s = handshake_timeout_s
        self.request_timeout_s = request_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.close_grace_s = close_grace_s
        self.state = ConnectionState.NEW
        self.hello: dict[str, Any] = {}
        """The last ``hello-ok`` payload."""
        self.last_error: GatewayError | None = None
        """Why the last connection attempt failed or the last socket closed."""
        self.connects = 0
        """Successful handshakes so far."""
        self.malformed_frames = 0
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._task: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._watches: dict[str, list[RunWatch]] = {}
        self._orphans: collections.deque[tuple[str, RunEvent]] = collections.deque(maxlen=max_buffered_events)
        self._disconnected_at: float | None = None
        self._next_id = 0

    # -- lifecycle -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start connecting in the background (idempotent)."""
        if self._task is None and self.state is ConnectionState.NEW:
            self.state = ConnectionState.CONNECTING
            self._http = aiohttp.ClientSession()
            self._task = asyncio.create_task(self._run(), name=f"gateway-client {self.url}")

    async def aclose(self) -> None:
        """Close the socket and stop reconnecting. Idempotent."""
        if self.state is ConnectionState.CLOSED:
            return
        self.state = ConnectionState.CLOSED
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        self._fail_pending(GatewayTransportError("the gateway client is closed"))
        # Wake everyone waiting for a connection; they see the client closed and give up.
        self._connected.set()

    def _closed(self) -> bool:
        return self.state is ConnectionState.CLOSED

    @property
    def connected(self) -> bool:
        return self.state is ConnectionState.CONNECTED

    @property
    def liveness(self) -> Liveness:
        """``connected``; ``connecting`` before the first handshake; ``reconnecting`` within the grace period
        after a close; ``unreachable`` after it; ``closed``."""
        if self.state is ConnectionState.CONNECTED:
            return "connected"
        if self.state is ConnectionState.CLOSED:
            return "closed"
        if self._disconnected_at is None:
            return "connecting" if self.last_error is None else "unreachable"
        if self._clock.monotonic() - self._disconnected_at <= self.close_grace_s:
            return "reconnecting"
        return "unreachable"

    async def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a connected socket; ``True`` when there is one."""
        if self.state is ConnectionState.CLOSED:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await self._connected.wait()
        except TimeoutError:
            return False
        return True

    # -- requests ------------------------------------------------------------------------------------------------

    async def request(self, method: str, params: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """Send one request and return its ``payload``; see the module docstring for the errors."""
        limit = self.request_timeout_s if timeout_s is None else timeout_s
        if not await self.wait_connected(limit):
            raise GatewayTransportError(f"not connected to the gateway ({self.liveness})")
        ws = self._ws
        assert ws is not None  # set while connected
        self._next_id += 1
        frame_id = f"cc-{self._next_id}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[frame_id] = future
        try:
            try:
                await ws.send_str(json.dumps({"type": "req", "id": frame_id, "method": method, "params": params}))
            except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
                raise GatewayTransportError("the gateway connection closed before the request was sent") from exc
            try:
                async with asyncio.timeout(limit):
                    return await future
            except TimeoutError:
                raise GatewayTimeoutError(f"{method}: no answer from the gateway in {limit:g} s") from None
        finally:
            self._pending.pop(frame_id, None)

    async def chat_send(self, session_key: str, message: str, idempotency_key: str) -> dict[str, Any]:
        """``chat.send``, retried with the same ``idempotencyKey`` until the gateway answers or refuses.

        Only a transport loss or a timeout is retried (after the next reconnect); a refusal raises
        :class:`~clawstack.connect.errors.GatewayRequestError`. Closing the client raises
        :class:`~clawstack.connect.errors.GatewayTransportError`.
        """
        params = {"sessionKey": session_key, "message": message, "idempotencyKey": idempotency_key}
        while True:
            try:
                return await self.request("chat.send", params)
            except (GatewayTransportError, GatewayTimeoutError):
                if self.state is ConnectionState.CLOSED:
                    raise
                _log.info("chat.send for run %s lost in transit; retrying with the same key", idempotency_key)
                await self._wait_for_next_connection()

    async def chat_history(self, session_key: str, *, limit: int = 200) -> dict[str, Any]:
        """``chat.history`` of a session, the newest ``limit`` messages."""
        return await self.request("chat.history", {"sessionKey": session_key, "limit": limit})

    async def _wait_for_next_connection(self) -> None:
        if self.connected:
            # The socket is up (a timeout, not a loss): pause briefly rather than spin.
            await self._clock.sleep(self.backoff_initial_s)
        await self._connected.wait()

    # -- watching runs -------------------------------------------------------------------------------------------

    def watch(self, run_id: str, session_key: str) -> RunWatch:
        """Start collecting the events of ``run_id``, including any buffered before this call."""
        watch = RunWatch(run_id, session_key)
        self._watches.setdefault(run_id, []).append(watch)
        kept: list[tuple[str, RunEvent]] = []
        for orphan_run, event in self._orphans:
            if orphan_run == run_id:
                watch.put(event)
            else:
                kept.append((orphan_run, event))
        self._orphans.clear()
        self._orphans.extend(kept)
        return watch

    def unwatch(self, watch: RunWatch) -> None:
        watches = self._watches.get(watch.run_id, [])
        if watch in watches:
            watches.remove(watch)
        if not watches:
            self._watches.pop(watch.run_id, None)

    @property
    def buffered_events(self) -> int:
        """Events kept for runs nobody watches yet."""
        return len(self._orphans)

    # -- the connection loop -------------------------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        while self.state is not ConnectionState.CLOSED:
            try:
                ws = await self._open()
            except GatewayError as exc:
                self.last_error = exc
                _log.warning("gateway %s: %s (%s)", self.url, exc.message, exc.code)
            else:
                attempt = 0
                await self._serve(ws)
            if self._closed():
                return
            delay = min(self.backoff_max_s, self.backoff_initial_s * (2**attempt))
            attempt = min(attempt + 1, 30)
            await self._clock.sleep(delay)

    async def _open(self) -> aiohttp.ClientWebSocketResponse:
        assert self._http is not None
        try:
            ws = await self._http.ws_connect(
                self.url, max_msg_size=MAX_FRAME_BYTES, timeout=aiohttp.ClientWSTimeout(ws_close=2.0)
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise GatewayTransportError(f"cannot connect: {type(exc).__name__}") from exc
        try:
            async with asyncio.timeout(self.handshake_timeout_s):
                self.hello = await self._handshake(ws)
        except TimeoutError:
            await ws.close()
            raise HandshakeError(
                f"no handshake answer in {self.handshake_timeout_s:g} s", code="gateway_handshake_timeout"
            ) from None
        except BaseException:
            # Best-effort close of the half-open socket, then re-raise unchanged.
            await ws.close()
            raise
        return ws

    async def _handshake(self, ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        challenge = await self._receive_object(ws)
        if challenge.get("type") != "event" or challenge.get("event") != "connect.challenge":
            raise HandshakeError("the gateway did not start with connect.challenge", code="gateway_handshake_invalid")
        params = {
            "minProtocol": PROTOCOL_VERSION,
            "maxProtocol": PROTOCOL_VERSION,
            "client": {"id": CLIENT_ID, "mode": CLIENT_MODE, "version": __version__, "platform": _platform()},
            "role": "operator",
            "scopes": list(SCOPES),
            "caps": [],
            "auth": {self._auth_kind: self._secret},
            "userAgent": f"clawstack-connect/{__version__}",
        }
        frame_id = f"connect-{new_uuid()}"
        await ws.send_str(json.dumps({"type": "req", "id": frame_id, "method": "connect", "params": params}))
        while True:
            frame = await self._receive_object(ws)
            if frame.get("type") == "res" and frame.get("id") == frame_id:
                break
        if frame.get("ok") is not True:
            error = _object(frame.get("error"))
            details = _object(error.get("details"))
            reason = details.get("code") or error.get("code") or "refused"
            raise HandshakeError(f"the gateway refused the handshake: {reason}", details={"reason": reason})
        payload = frame.get("payload")
        if not isinstance(payload, dict) or payload.get("type") != "hello-ok":
            raise HandshakeError("the handshake answer is not hello-ok", code="gateway_handshake_invalid")
        if payload.get("protocol") != PROTOCOL_VERSION:
            raise HandshakeError("the gateway speaks another protocol version", code="gateway_handshake_invalid")
        return payload

    async def _receive_object(self, ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        """The next text frame holding a JSON object (malformed frames are skipped); a close ends the handshake."""
        while True:
            msg = await ws.receive()
            if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                raise HandshakeError(f"the gateway closed the socket during the handshake ({ws.close_code})")
            if msg.type is aiohttp.WSMsgType.ERROR:
                raise GatewayTransportError("the socket failed during the handshake")
            frame = self._parse(msg)
            if frame is not None:
                return frame

    def _parse(self, msg: aiohttp.WSMessage) -> dict[str, Any] | None:
        if msg.type is not aiohttp.WSMsgType.TEXT:
            self.malformed_frames += 1
            return None
        try:
            frame = json.loads(msg.data)
        except ValueError:
            frame = None
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            self.malformed_frames += 1
            _log.warning("gateway %s sent a malformed frame; ignored", self.url)
            return None
        return frame

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self.state = ConnectionState.CONNECTED
        self.connects += 1
        self.last_error = None
        reconnect = self._disconnected_at is not None
        self._disconnected_at = None
        self._connected.set()
        renew = asyncio.create_task(self._renew_subscriptions(reconnect))
        try:
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.ERROR:
                    break
                frame = self._parse(msg)
                if frame is not None:
                    self._dispatch(frame)
        finally:
            renew.cancel()
            self._connected.clear()
            self._ws = None
            if self.state is not ConnectionState.CLOSED:
                self.state = ConnectionState.DISCONNECTED
                self._disconnected_at = self._clock.monotonic()
                self.last_error = GatewayTransportError(f"the gateway closed the socket ({ws.close_code})")
                _log.warning("gateway %s: connection lost (%s); reconnecting", self.url, ws.close_code)
            self._fail_pending(GatewayTransportError("the gateway connection closed before the answer"))
            for watches in self._watches.values():
                for watch in watches:
                    watch.put(RunEvent("disconnected"))
            await ws.close()

    async def _renew_subscriptions(self, notify: bool) -> None:
        keys = {watch.session_key for watches in self._watches.values() for watch in watches}
        for key in sorted(keys):
            try:
                await self.request("sessions.messages.subscribe", {"sessionKey": key})
            except GatewayError as exc:
                # Not every gateway has the method; a re-sent chat.send subscribes too.
                _log.debug("resubscribe failed: %s", exc.code)
        if notify:
            for watches in list(self._watches.values()):
                for watch in watches:
                    watch.put(RunEvent("reconnected"))

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame["type"]
        if kind == "res":
            future = self._pending.get(str(frame.get("id")))
            if future is None or future.done():
                return
            if frame.get("ok") is True and isinstance(frame.get("payload"), dict):
                future.set_result(frame["payload"])
            else:
                error = _object(frame.get("error"))
                details = error.get("details") if isinstance(error.get("details"), dict) else None
                future.set_exception(
                    GatewayRequestError(
                        str(error.get("code") or "INVALID_RESPONSE"), str(error.get("message") or ""), details
                    )
                )
            return
        if kind != "event" or frame.get("event") not in ("chat", "agent"):
            return
        payload = frame.get("payload")
        if not isinstance(payload, dict) or not isinstance(payload.get("runId"), str):
            self.malformed_frames += 1
            return
        event = RunEvent(frame["event"], payload)
        watches = self._watches.get(payload["runId"])
        if watches:
            for watch in watches:
                watch.put(event)
        else:
            self._orphans.append((payload["runId"], event))

    def _fail_pending(self, error: GatewayError) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _platform() -> str:
    return platform.system().lower() or "unknown"


__all__ = [
    "CLIENT_ID",
    "CLIENT_MODE",
    "PROTOCOL_VERSION",
    "ConnectionState",
    "GatewayClient",
    "Liveness",
    "RunEvent",
    "RunWatch",
]

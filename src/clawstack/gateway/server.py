"""The gateway's WebSocket server: the OpenClaw protocol subset over aiohttp, chat runs on the ``main`` lane.

:class:`GatewayServer` opens the :class:`~clawstack.gateway.sessions.SessionStore` under ``data_dir`` (recording
runs a previous process left in flight as ``interrupted``), builds the :class:`~clawstack.gateway.lanes.Lanes` and
the :class:`~clawstack.gateway.agent.AgentLoop`, and serves WebSocket connections at ``/`` and ``/ws``, and the HTTP
endpoints of :mod:`clawstack.gateway.http_routes` (the hook trigger, the webhook channel).

A connection goes through the handshake (``connect.challenge`` event, ``connect`` request, ``hello-ok``), then
sends requests; the server checks each request's method and scopes, has :mod:`clawstack.gateway.methods` answer
it (which checks the scope the command a ``chat.send`` message runs needs), answers each in order and pushes
events. Every outgoing frame goes through the connection's queue, written by one task, so events keep their
``seq`` order and a slow reader never stalls a run; a connection whose unsent output passes ``max_buffered_bytes``
is closed (1008).

Runs: every run (``chat.send``, channel messages, plugin and hook turns) belongs to the server's
:class:`~clawstack.gateway.runner.GatewayRuns`; its events go to every connection subscribed to the session.
:meth:`GatewayServer.stop` aborts runs in flight, then closes connections with 1012.

Plugins: :meth:`GatewayServer.start` loads the plugins on ``plugins.load.paths`` and ``plugin_paths`` with one
:class:`~clawstack.gateway.plugins.SubagentCompleter` on the server's lanes (a plugin that fails to load is
reported in :attr:`GatewayServer.plugins`; the gateway still starts), and :meth:`GatewayServer.stop` retires them.

Config: :meth:`GatewayServer.reload` applies a reloaded config's operators and channel ``allowFrom`` at once.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from aiohttp import WSMsgType, web

from clawstack import __version__
from clawstack.common.clock import Clock, SystemClock
from clawstack.common.ids import new_uuid, secrets_equal
from clawstack.gateway.agent import AgentLoop, LLMFactory, default_llm_factory
from clawstack.gateway.authority import OperatorAuthority
from clawstack.gateway.bootstrap import prepare_workspace
from clawstack.gateway.channels import WebhookChannel
from clawstack.gateway.commands import BuiltinCommands
from clawstack.gateway.config import GatewayConfig
from clawstack.gateway.custody import ChildStore
from clawstack.gateway.dispatch import ChannelOutbox
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.frames import MAX_FRAME_OVERHEAD, PreHandshakeBudget
from clawstack.gateway.http_routes import HttpRoutes
from clawstack.gateway.keys import main_key
from clawstack.gateway.lanes import Lanes
from clawstack.gateway.methods import GatewayMethods
from clawstack.gateway.native import NativeChildren
from clawstack.gateway.plugins import (
    PLUGIN_STORE_FILE,
    HookDispatcher,
    HookRegistry,
    LoadedPlugin,
    PluginLoader,
    PluginStore,
    SubagentCompleter,
    SubagentRunner,
)
from clawstack.gateway.plugins.loader import process_build_info
from clawstack.gateway.plugins.native_facade import NativeHost
from clawstack.gateway.protocol import (
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_TICK_INTERVAL_MS,
    EVENTS,
    METHOD_SCOPES,
    PREAUTH_MAX_PAYLOAD,
    PROTOCOL_VERSION,
    ConnectParams,
    FrameError,
    MissingScopeError,
    ProtocolError,
    RequestFrame,
    event_frame,
    granted_scopes,
    missing_scope,
    parse_params,
    parse_request_frame,
    response_error,
    response_ok,
)
from clawstack.gateway.runner import GatewayRuns
from clawstack.gateway.session_tools import session_tools
from clawstack.gateway.sessions import SessionStore
from clawstack.gateway.tools import ToolRegistry
from clawstack.gateway.workspace_tools import exec_limits, workspace_tools
from clawstack.sandbox import Sandbox

__all__ = ["DEFAULT_HANDSHAKE_TIMEOUT_S", "GatewayServer", "ServerState"]

#: The oldest protocol a client may probe with (``details.minimumProbeProtocol`` of a mismatch), as on OpenClaw.
MINIMUM_PROBE_PROTOCOL: Final = 3

#: How long a new connection has to send ``connect`` before it is closed (1008).
DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0

#: The session store's file under ``data_dir``.
STORE_FILE: Final = "sessions.sqlite3"
#: The native-child custody file beside it.
CHILDREN_FILE: Final = "children.sqlite3"

_CLOSE_NORMAL: Final = 1000
_CLOSE_PROTOCOL: Final = 1002
_CLOSE_POLICY: Final = 1008
_CLOSE_RESTART: Final = 1012

#: How long closing a socket waits for the peer's close frame, and :meth:`GatewayServer.stop` for all of them.
_CLOSE_TIMEOUT_S: Final = 2.0

_log = logging.getLogger(__name__)


class ServerState(enum.Enum):
    """Where a :class:`GatewayServer` is in its lifecycle."""

    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class _Close:
    """A queued instruction to close the socket once everything before it is written."""

    code: int
    reason: str


@dataclass(eq=False)
class _Connection:
    """One WebSocket client: its outgoing queue, event counter, granted scopes and subscriptions."""

    ws: web.WebSocketResponse
    conn_id: str
    max_buffered_bytes: int
    scopes: tuple[str, ...] = ()
    connected: bool = False
    subscriptions: set[str] = field(default_factory=set)
    writer: asyncio.Task[None] | None = None
    _queue: asyncio.Queue[str | _Close] = field(default_factory=asyncio.Queue)
    _buffered: int = 0
    _seq: int = 0
    _closing: bool = False

    def send(self, frame: Mapping[str, Any]) -> None:
        """Queue a frame; a connection over its buffer limit is closed instead."""
        if self._closing:
            return
        text = json.dumps(frame, ensure_ascii=False, separators=(",", ":"))
        self._buffered += len(text)
        if self._buffered > self.max_buffered_bytes:
            self.close(_CLOSE_POLICY, "slow consumer")
            return
        self._queue.put_nowait(text)

    def send_event(self, event: str, payload: Mapping[str, Any]) -> None:
        """Queue an event with this connection's next ``seq``."""
        if self._closing:
            return
        self._seq += 1
        self.send(event_frame(event, payload, self._seq))

    def close(self, code: int, reason: str) -> None:
        """Close the socket after the frames already queued; later frames are dropped."""
        if not self._closing:
            self._closing = True
            self._queue.put_nowait(_Close(code, reason))

    async def write_all(self) -> None:
        """Write queued frames until a close instruction, which it carries out."""
        while True:
            item = await self._queue.get()
            if isinstance(item, _Close):
                await self.ws.close(code=item.code, message=item.reason.encode())
                return
            self._buffered -= len(item)
            try:
                await self.ws.send_str(item)
            except (ConnectionError, RuntimeError):
                # The peer went away: stop writing; the reader sees the socket close.
                self._closing = True
                return


class GatewayServer:
    """The gateway's WebSocket server; see the module docstring.

    ``clock`` drives ``tick`` events and timestamps; ``llm_factory`` makes the model clients (tests pass one for a
    fake provider); ``registry`` holds the tools agents may call. ``tick_interval_ms``, ``handshake_timeout_s``,
    ``max_payload`` and ``max_buffered_bytes`` are the connection policy. ``plugin_paths`` are searched for plugins
    besides ``plugins.load.paths``. Use it as an async context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        data_dir: str | Path,
        clock: Clock | None = None,
        llm_factory: LLMFactory = default_llm_factory,
        registry: ToolRegistry | None = None,
        tick_interval_ms: int = DEFAULT_TICK_INTERVAL_MS,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
        plugin_paths: Sequence[Path] = (),
    ) -> None:
        if tick_interval_ms < 1 or handshake_timeout_s <= 0 or max_payload < 1 or max_buffered_bytes < 1:
            raise ValueError("tick interval, handshake timeout and size limits must be positive")
        self._config = config.with_state_dir(data_dir)  # default workspaces live in the data directory too
        self._data_dir = Path(data_dir)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._llm_factory = llm_factory
        self._registry = registry if registry is not None else ToolRegistry()
        self._tick_interval_ms = tick_interval_ms
        self._handshake_timeout_s = handshake_timeout_s
        self._max_payload = max_payload
        self._max_buffered_bytes = max_buffered_bytes
        self._plugin_paths = tuple(Path(p) for p in plugin_paths)
        self._plugins: PluginLoader | None = None
        self._state = ServerState.NEW
        self._store: SessionStore | None = None
        self._agent: AgentLoop | None = None
        self._lanes: Lanes | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._connections: set[_Connection] = set()
        self._runs: GatewayRuns | None = None
        self._children: ChildStore | None = None
        self._methods: GatewayMethods | None = None
        self._plugin_store: PluginStore | None = None
        self._authority: OperatorAuthority | None = None
        self._own_tools: list[str] = []
        self._natives: NativeChildren | None = None
        self._channels: dict[str, ChannelOutbox] = {}
        self._webhook: WebhookChannel | None = None
        self.interrupted_run_ids: tuple[str, ...] = ()
        """The runs a previous process left in flight, recorded ``interrupted`` by :meth:`start`."""

    @property
    def state(self) -> ServerState:
        """Where the server is in its lifecycle."""
        return self._state

    @property
    def plugins(self) -> tuple[LoadedPlugin, ...]:
        """Every plugin found at start (``loaded``, ``failed`` with its error, or ``disabled``), by id."""
        return () if self._plugins is None else self._plugins.plugins

    @property
    def channels(self) -> Mapping[str, ChannelOutbox]:
        """The channel adapters by name (``"webhook"`` when ``channels.webhook.enabled``), a copy."""
        return dict(self._channels)

    @property
    def runs(self) -> GatewayRuns:
        """Every run of this gateway (the run host); only while the server runs."""
        return self._require_runs()

    @property
    def store(self) -> SessionStore:
        """The session store; only while the server runs."""
        return self._require_store()

    @property
    def lanes(self) -> Lanes:
        """The lanes runs are scheduled on; only while the server runs."""
        if self._lanes is None:
            raise RuntimeError("the gateway server is not started")
        return self._lanes

    @property
    def port(self) -> int:
        """The TCP port listened on (the chosen one when ``gateway.port`` is 0)."""
        if self._port is None:
            raise RuntimeError("the gateway server is not started")
        return self._port

    @property
    def url(self) -> str:
        """``ws://HOST:PORT``, where clients connect."""
        return f"ws://{self._config.gateway.bind_host}:{self.port}"

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Open the store, record interrupted runs, and listen; return once connections are accepted."""
        if self._state is not ServerState.NEW:
            raise RuntimeError(f"a gateway server is started once; it is {self._state.value}")
        self._state = ServerState.RUNNING
        try:
            store = SessionStore(self._data_dir / STORE_FILE, clock=self._clock)
            await asyncio.to_thread(store.open)
            self._store = store
            self.interrupted_run_ids = tuple(await asyncio.to_thread(store.mark_interrupted))
            released = await asyncio.to_thread(store.release_claimed_sessions)
            if released:
                _log.warning("freed %d session key(s) a plugin held outside its subagent sessions", len(released))
            defaults = self._config.agents.defaults
            self._lanes = Lanes(
                {
                    "main": defaults.max_concurrent,
                    "subagent": defaults.subagents.max_concurrent,
                    "cron": self._config.cron.max_concurrent,
                    "hook-dispatch": 1,
                },
                # HTTP hook work keeps one slot of the cron budget that plugin hook turns share.
                reserve_one={"cron"} if self._config.hooks.enabled else frozenset(),
            )
            hooks = HookRegistry()
            plugin_store = self._plugin_store = PluginStore(self._data_dir / PLUGIN_STORE_FILE)
            await asyncio.to_thread(plugin_store.open)
            self._agent = AgentLoop(self._config, store, self._registry, llm_factory=self._llm_factory, hooks=hooks)
            authority = self._authority = OperatorAuthority.from_config(self._config)
            runs = self._runs = GatewayRuns(
                self._config,
                store,
                self._agent,
                self._lanes,
                clock=self._clock,
                publish=self._publish,
                channels=self._channels,
                authority=authority,
            )
            builtins = BuiltinCommands(self._config, store, active_runs=runs.active_run_ids)
            children = ChildStore(self._data_dir / CHILDREN_FILE)
            await asyncio.to_thread(children.open)
            self._children = children
            self._natives = NativeChildren(self._config, store, children, runs, clock=self._clock)
            await self._natives.start()
            hooks.native_host = NativeHost(self._natives, children, store, self._agent, self._config, authority, hooks)
            for agent in self._config.roster:
                await asyncio.to_thread(
                    prepare_workspace,
                    agent.workspace,
                    seed=not agent.skip_bootstrap,
                    skip_optional=agent.skip_optional_bootstrap_files,
                )
            for tool in [
                *workspace_tools(sandbox=Sandbox(), limits=exec_limits(self._config.tools.exec)),
                *session_tools(store, runs, self._natives, visibility=self._config.tools.sessions.visibility),
            ]:
                self._registry.register(tool)
                self._own_tools.append(tool.name)
            completer = SubagentCompleter(self._config, self._agent, lanes=self._lanes)
            self._plugins = runs.plugins = PluginLoader(
                self._config,
                search_paths=self._plugin_paths,
                completer=completer,
                runner=SubagentRunner(self._config, store, runs, self._registry, completer, authority=authority),
                hook_dispatcher=HookDispatcher(self._config, runs),
                tools=self._registry,
                build=process_build_info(),
                hooks=hooks,
                store=plugin_store,
            )
            methods = self._methods = GatewayMethods(
                self._config,
                store,
                require_runs=self._require_runs,
                authority=authority,
                builtins=builtins,
                plugins=self._plugins,
                clock=self._clock,
            )
            if self._config.channels.webhook.enabled:
                self._webhook = self._channels["webhook"] = WebhookChannel(
                    self._config, clock=self._clock, authority=authority
                )
            app = web.Application()
            app.router.add_get("/", self._handle)
            app.router.add_get("/ws", self._handle)
            HttpRoutes(self._config, methods, require_runs=self._require_runs, webhook=self._webhook).add_to(app.router)
            self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self._config.gateway.bind_host, self._config.gateway.port)
            await site.start()
            self._port = int(self._runner.addresses[0][1])
            # Plugins load once the socket is up (start-up time is time to listen); loading never yields to the
            # event loop, so no connection or request is served before every plugin is loaded or failed.
            self._plugins.load()
        except BaseException:
            # Best-effort shutdown step: release what was opened (the store's lock, the socket), then re-raise.
            await self.stop()
            raise
        if self.interrupted_run_ids:
            _log.warning("recorded %d run(s) interrupted by the previous stop", len(self.interrupted_run_ids))

    async def stop(self) -> None:
        """Abort runs in flight, close connections (1012), stop listening and close the store. Idempotent."""
        if self._state in (ServerState.STOPPING, ServerState.STOPPED):
            return
        self._state = ServerState.STOPPING
        if self._natives is not None:
            # Before the runs are aborted: children in flight are left for the next start to record interrupted.
            await self._natives.close()
        if self._runs is not None:
            await self._runs.close()
        writers = []
        for conn in list(self._connections):
            conn.close(_CLOSE_RESTART, "service restart")
            if conn.writer is not None:
                writers.append(conn.writer)
        if writers:
            # Let each socket send its close frame before the listener goes; a peer that never answers is cut.
            await asyncio.wait(writers, timeout=_CLOSE_TIMEOUT_S)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._webhook is not None:
            await self._webhook.aclose()
        if self._plugins is not None:
            self._plugins.retire_all()
        if self._plugin_store is not None:
            await asyncio.to_thread(self._plugin_store.close)
        for name in self._own_tools:
            self._registry.unregister(name)
        self._own_tools.clear()
        if self._agent is not None:
            await self._agent.aclose()
        if self._store is not None:
            await asyncio.to_thread(self._store.close)
        if self._children is not None:
            await asyncio.to_thread(self._children.close)
        self._state = ServerState.STOPPED

    # -- connections ---------------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # No compression: OpenClaw offers none, and it would let a few wire bytes expand past the handshake budget.
        ws = web.WebSocketResponse(max_msg_size=self._max_payload, timeout=_CLOSE_TIMEOUT_S, compress=False)
        transport = request.transport
        budget = None
        if transport is not None:  # None only when the peer is already gone; prepare() then fails
            budget = PreHandshakeBudget.install(transport, PREAUTH_MAX_PAYLOAD + MAX_FRAME_OVERHEAD)
        await ws.prepare(request)
        if self._state is not ServerState.RUNNING:
            await ws.close(code=_CLOSE_RESTART, message=b"service restart")
            return ws
        conn = _Connection(ws, new_uuid(), self._max_buffered_bytes)
        self._connections.add(conn)
        writer = conn.writer = asyncio.create_task(conn.write_all())
        ticker: asyncio.Task[None] | None = None
        try:
            conn.send(
                event_frame(
                    "connect.challenge",
                    {"nonce": new_uuid(), "ts": self._now_ms(), "capabilities": []},
                    None,
                )
            )
            if await self._handshake(conn, budget):
                ticker = asyncio.create_task(self._tick(conn))
                async for msg in ws:
                    if msg.type is WSMsgType.TEXT:
                        await self._dispatch(conn, msg.data)
                    elif msg.type is WSMsgType.BINARY:
                        conn.send(response_error(None, FrameError("binary")))
                    else:
                        break
        finally:
            self._connections.discard(conn)
            if ticker is not None:
                ticker.cancel()
            conn.close(_CLOSE_NORMAL, "")
            await asyncio.wait((writer,))
        return ws

    async def _first_frame(self, conn: _Connection, budget: PreHandshakeBudget | None) -> str | None:
        """The text of the first frame, or ``None`` after answering a bad one (the connection is then closing).

        Raises ``TimeoutError`` when none arrives within the handshake timeout.
        """
        receive = asyncio.ensure_future(conn.ws.receive())
        waits: set[asyncio.Future[Any]] = {receive}
        if budget is not None:
            waits.add(asyncio.ensure_future(budget.exceeded.wait()))
        try:
            async with asyncio.timeout(self._handshake_timeout_s):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.wait(waits)
        if budget is not None and budget.exceeded.is_set():
            self._refuse_frame(conn, None, FrameError(f"larger than {PREAUTH_MAX_PAYLOAD} bytes"))
            return None
        msg = receive.result()
        if msg.type is WSMsgType.TEXT:
            return str(msg.data)
        if msg.type is WSMsgType.BINARY:
            self._refuse_frame(conn, None, FrameError("binary"))
        else:
            conn.close(_CLOSE_POLICY, "invalid handshake")
        return None

    @staticmethod
    def _refuse_frame(conn: _Connection, frame_id: str | None, error: ProtocolError) -> None:
        """Answer a frame that cannot start a handshake and close the socket (1008)."""
        conn.send(response_error(frame_id, error))
        conn.close(_CLOSE_POLICY, "invalid handshake")

    async def _handshake(self, conn: _Connection, budget: PreHandshakeBudget | None) -> bool:
        """Read and answer ``connect``; ``True`` once the connection is authenticated, else it is closing."""
        try:
            text = await self._first_frame(conn, budget)
        except TimeoutError:
            conn.close(_CLOSE_POLICY, "handshake timeout")
            return False
        if text is None:
            return False
        try:
            frame = parse_request_frame(text, max_bytes=PREAUTH_MAX_PAYLOAD)
        except FrameError as exc:
            self._refuse_frame(conn, exc.frame_id, exc)
            return False
        if frame.method != "connect":
            error = ProtocolError("INVALID_REQUEST", "invalid handshake: first request must be connect")
            self._refuse_frame(conn, frame.id, error)
            return False
        try:
            params = parse_params(ConnectParams, "connect", frame.params)
        except ProtocolError as exc:
            conn.send(response_error(frame.id, exc))
            conn.close(_CLOSE_NORMAL, "invalid connect")
            return False
        try:
            self._check_protocol(params)
        except ProtocolError as exc:
            # As OpenClaw 2026.9.6 does: the answer, then close 1002 "protocol mismatch".
            conn.send(response_error(frame.id, exc))
            conn.close(_CLOSE_PROTOCOL, "protocol mismatch")
            return False
        auth_error = self._check_auth(params)
        if auth_error is not None:
            conn.send(response_error(frame.id, auth_error))
            conn.close(_CLOSE_POLICY, "unauthorized")
            return False
        if budget is not None and not budget.release():
            # More arrived behind connect than the budget allows; those bytes were not read, so the stream is lost.
            self._refuse_frame(conn, frame.id, FrameError(f"larger than {PREAUTH_MAX_PAYLOAD} bytes"))
            return False
        conn.scopes = granted_scopes(params)
        conn.connected = True
        conn.send(response_ok(frame.id, self._hello(conn)))
        return True

    @staticmethod
    def _check_protocol(params: ConnectParams) -> None:
        if not params.minProtocol <= PROTOCOL_VERSION <= params.maxProtocol:
            raise ProtocolError(
                "INVALID_REQUEST",
                "protocol mismatch",
                details={
                    "code": "PROTOCOL_MISMATCH",
                    "clientMinProtocol": params.minProtocol,
                    "clientMaxProtocol": params.maxProtocol,
                    "expectedProtocol": PROTOCOL_VERSION,
                    "minimumProbeProtocol": MINIMUM_PROBE_PROTOCOL,
                },
            )

    def _check_auth(self, params: ConnectParams) -> ProtocolError | None:
        auth = self._config.gateway.auth
        offered = None
        if params.auth is not None:
            offered = params.auth.token if auth.mode == "token" else params.auth.password
        kind = auth.mode
        if not offered:
            reason, text = f"{kind}_missing", f"unauthorized: gateway {kind} missing (set gateway.auth.{kind})"
        elif secrets_equal(offered, auth.secret.get_secret_value()):
            return None
        else:
            reason, text = f"{kind}_mismatch", f"unauthorized: gateway {kind} mismatch (use gateway.auth.{kind})"
        return ProtocolError(
            "INVALID_REQUEST",
            text,
            details={
                "code": f"AUTH_{reason.upper()}",
                "authReason": reason,
                "canRetryWithDeviceToken": False,
                "recommendedNextStep": "update_auth_credentials",
            },
        )

    def _hello(self, conn: _Connection) -> dict[str, Any]:
        return {
            "type": "hello-ok",
            "protocol": PROTOCOL_VERSION,
            "server": {"version": __version__, "connId": conn.conn_id},
            "features": {"methods": sorted(METHOD_SCOPES), "events": list(EVENTS)},
            "snapshot": {
                "sessionDefaults": {
                    "defaultAgentId": self._config.default_agent_id,
                    "mainKey": "main",
                    "mainSessionKey": main_key(self._config.default_agent_id),
                    "scope": "per-sender",
                }
            },
            "auth": {"method": self._config.gateway.auth.mode, "role": "operator", "scopes": list(conn.scopes)},
            "policy": {
                "maxPayload": self._max_payload,
                "maxBufferedBytes": self._max_buffered_bytes,
                "tickIntervalMs": self._tick_interval_ms,
            },
        }

    async def _tick(self, conn: _Connection) -> None:
        while True:
            await self._clock.sleep(self._tick_interval_ms / 1000)
            conn.send_event("tick", {"ts": self._now_ms()})

    async def _dispatch(self, conn: _Connection, text: str) -> None:
        try:
            if len(text) > PREAUTH_MAX_PAYLOAD:
                # Strict parsing of a large frame takes a while; other connections keep being served meanwhile.
                frame = await asyncio.to_thread(parse_request_frame, text, max_bytes=self._max_payload)
            else:
                frame = parse_request_frame(text, max_bytes=self._max_payload)
        except FrameError as exc:
            conn.send(response_error(exc.frame_id, exc))
            return
        try:
            payload = await self._call(conn, frame)
        except ProtocolError as exc:
            conn.send(response_error(frame.id, exc))
        except GatewayError as exc:
            conn.send(response_error(frame.id, _translate(exc)))
        else:
            conn.send(response_ok(frame.id, payload))

    async def _call(self, conn: _Connection, frame: RequestFrame) -> Mapping[str, Any]:
        method = frame.method
        if method == "connect":
            raise ProtocolError("INVALID_REQUEST", "connect is only valid as the first request")
        if method not in METHOD_SCOPES:
            raise ProtocolError("INVALID_REQUEST", f"unknown method: {method}")
        needed = missing_scope(method, conn.scopes)
        if needed is not None:
            raise MissingScopeError(needed)
        assert self._methods is not None  # connections are served only once start() has built it
        return await self._methods.call(conn, frame)

    # -- publishing and reload -----------------------------------------------------------------------------------

    def reload(self, config: GatewayConfig) -> tuple[str, ...]:
        """Apply a newly loaded config's live parts to the running gateway: the operators (roles, identity links)
        and the channels' ``allowFrom``; work retained under authority they take away is revoked. Returns the
        top-level keys that differ otherwise, which take effect only after a restart."""
        change = self._require_authority().update_from_config(config)
        if change.revocations:
            _log.warning("config reload revoked %d retained run(s)", len(change.revocations))
        old, new = self._config.model_dump(), config.model_dump()
        for document in (old, new):
            document.pop("operators", None)
            # A channel's allowFrom applies live; the rest of its settings wait for a restart like any other key.
            for channel in document.get("channels", {}).values():
                if isinstance(channel, dict):
                    channel.pop("allow_from", None)
        return tuple(sorted(k for k in new if old.get(k) != new.get(k)))

    def _require_authority(self) -> OperatorAuthority:
        if self._authority is None:
            raise ProtocolError("UNAVAILABLE", "the gateway is not running")
        return self._authority

    def _publish(self, session_key: str, event: str, payload: Mapping[str, Any]) -> None:
        """Send an event to every connection subscribed to the session."""
        for conn in self._connections:
            if conn.connected and session_key in conn.subscriptions:
                conn.send_event(event, payload)

    # -- helpers -------------------------------------------------------------------------------------------------

    def _require_runs(self) -> GatewayRuns:
        if self._runs is None or self._state is not ServerState.RUNNING:
            raise ProtocolError("UNAVAILABLE", "the gateway is not running")
        return self._runs

    def _require_store(self) -> SessionStore:
        if self._store is None:
            raise ProtocolError("UNAVAILABLE", "the gateway is not running")
        return self._store

    def _now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)


def _translate(exc: GatewayError) -> ProtocolError:
    """A gateway error as a wire error: the caller's mistakes are ``INVALID_REQUEST``, the rest ``UNAVAILABLE``."""
    if exc.code in ("session_store_unavailable", "session_store_locked", "gateway_error", "gateway_unavailable"):
        return ProtocolError("UNAVAILABLE", exc.message, details={"code": exc.code})
    return ProtocolError("INVALID_REQUEST", exc.message, details={"code": exc.code})

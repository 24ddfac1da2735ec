"""The scripted fake model's HTTP server (aiohttp), over TCP or a Unix socket.

Routes: ``POST /v1/chat/completions`` (plain and SSE), ``GET /v1/models``, and for tests ``GET /_fake/requests``
(every ``/v1`` request received, authorization headers removed) and ``DELETE /_fake/requests`` (forget them).
Errors use OpenAI's envelope ``{"error": {"message", "type", "param", "code"}}``. Log lines name the method,
path, status and duration, never message content or keys.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
import itertools
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiohttp import web

from clawstack.llm.errors import FakeDirectiveError
from clawstack.llm.fake.behaviour import Behaviour
from clawstack.llm.fake.directives import for_turn, parse_directives
from clawstack.llm.fake.requests import BadChatRequest, RecordedRequest, read_chat_request
from clawstack.llm.fake.responses import (
    Conversation,
    answer_for,
    completion_body,
    error_body,
    failure_body,
    read_conversation,
    stream_chunks,
    usage_for,
)
from clawstack.llm.fake.script import FakeScript, ScriptPlayer, load_script

logger = logging.getLogger("clawstack.llm.fake")

DEFAULT_MODEL_IDS = ("clawstack-fake",)
MAX_REQUEST_BYTES = 64 * 1024 * 1024
# On stop, answers in flight get this long to finish before they are cancelled: a test double has nothing
# worth waiting for, and tests stop it often.
_SHUTDOWN_GRACE_S = 0.25
# Without handler cancellation aiohttp tells a handler nothing when its client leaves, so delays poll the
# transport at this interval to notice a departed client promptly.
_POLL_S = 0.02
_ROUTE_ERROR_CODES = {404: "unknown_url", 405: "method_not_allowed", 413: "request_too_large"}
_MALFORMED_JSON = b'{"id": "chatcmpl-fake", "choices": ['


class ServerState(enum.Enum):
    """Lifecycle of a :class:`FakeModelServer`."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


def _error(status: int, message: str, error_type: str, code: str | None) -> web.Response:
    return web.json_response(error_body(message, error_type, code), status=status)


class FakeModelServer:
    """The scripted fake model, in process. Not a language model: it answers what directives or a script say.

    ``script`` is a :class:`FakeScript` or a path to a script file. Listen on ``host``/``port`` (``0`` picks a
    free port) or, with ``unix_socket``, on that path (created with mode 0600 and removed on stop). With
    ``api_key`` set, ``/v1`` requests must carry ``Authorization: Bearer <api_key>``. Use it as an async context
    manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        script: FakeScript | str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        unix_socket: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        model_ids: tuple[str, ...] = DEFAULT_MODEL_IDS,
    ) -> None:
        if script is not None and not isinstance(script, FakeScript):
            script = load_script(script)
        self._player = None if script is None else ScriptPlayer(script)
        self._host, self._port = host, port
        self._unix_socket = None if unix_socket is None else os.fspath(unix_socket)
        self._api_key = None if api_key is None else api_key.encode("utf-8")
        self._model_ids = model_ids
        self._state = ServerState.NEW
        self._runner: web.AppRunner | None = None
        self._base_url: str | None = None
        self._address: str | None = None
        self._requests: list[RecordedRequest] = []
        self._numbers = itertools.count(1)
        self._client_disconnects = 0
        self._changed = asyncio.Event()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def state(self) -> ServerState:
        """Where the server is in its lifecycle."""
        return self._state

    @property
    def base_url(self) -> str:
        """The API root for clients, e.g. ``http://127.0.0.1:43117/v1`` (``http://localhost/v1`` on a socket)."""
        if self._base_url is None:
            raise RuntimeError("the fake model server is not started")
        return self._base_url

    @property
    def address(self) -> str:
        """Where it listens, for people: the base URL, or ``unix:PATH`` on a Unix socket."""
        if self._address is None:
            raise RuntimeError("the fake model server is not started")
        return self._address

    @property
    def unix_socket(self) -> str | None:
        """The Unix socket path, or ``None`` when listening on TCP."""
        return self._unix_socket

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every ``/v1`` request received so far, oldest first (a copy)."""
        return list(self._requests)

    def clear_requests(self) -> None:
        """Forget the recorded requests."""
        self._requests.clear()

    def add_script_steps(self, script: FakeScript) -> None:
        """Append ``script``'s steps after the steps not used yet (a script of its own when there was none)."""
        if self._player is None:
            self._player = ScriptPlayer(script)
        else:
            self._player.extend(script)

    @property
    def script_steps_remaining(self) -> int | None:
        """How many script steps are unused; ``None`` without a script."""
        return None if self._player is None else self._player.remaining

    @property
    def client_disconnects(self) -> int:
        """How many clients went away before their answer was complete."""
        return self._client_disconnects

    async def wait_for_requests(self, count: int = 1) -> None:
        """Wait until at least ``count`` requests are recorded. Bound it with ``asyncio.timeout``."""
        while len(self._requests) < count:
            await self._wait_for_change()

    async def wait_for_client_disconnects(self, count: int = 1) -> None:
        """Wait until at least ``count`` clients went away mid-answer. Bound it with ``asyncio.timeout``."""
        while self._client_disconnects < count:
            await self._wait_for_change()

    async def _wait_for_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def start(self) -> None:
        """Start listening; return once connections are accepted."""
        if self._state is not ServerState.NEW:
            raise RuntimeError(f"cannot start a fake model server that is {self._state.value}")
        app = web.Application(middlewares=[self._middleware], client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/_fake/requests", self._list_requests)
        app.router.add_delete("/_fake/requests", self._clear_requests)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_GRACE_S)
        await runner.setup()
        self._runner = runner
        self._state = ServerState.RUNNING
        try:
            if self._unix_socket is not None:
                await web.UnixSite(runner, self._unix_socket).start()
                os.chmod(self._unix_socket, 0o600)
                self._base_url = "http://localhost/v1"
                self._address = f"unix:{self._unix_socket}"
            else:
                await web.TCPSite(runner, self._host, self._port).start()
                host, port = runner.addresses[0][:2]
                shown = f"[{host}]" if ":" in host else host
                self._base_url = self._address = f"http://{shown}:{port}/v1"
        except BaseException:
            # Best-effort shutdown: a failed bind must not leave the runner half set up.
            await self.stop()
            raise
        logger.info("fake-llm listening on %s", self._address)

    async def stop(self) -> None:
        """Stop listening and end open connections. Idempotent."""
        if self._state is ServerState.STOPPED:
            return
        self._state = ServerState.STOPPED
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self._unix_socket is not None and self._base_url is not None:
            _remove_socket(self._unix_socket)

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.monotonic()
        if request.path.startswith("/v1/"):
            recorded = RecordedRequest.build(
                request.method, request.path, request.headers.items(), await request.read()
            )
            self._requests.append(recorded)
            self._changed.set()
            if self._api_key is not None and not self._authorized(request):
                response: web.StreamResponse = _error(
                    401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
                )
                self._log(request, response, started)
                return response
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            error_type = "invalid_request_error" if exc.status < 500 else "server_error"
            code = _ROUTE_ERROR_CODES.get(exc.status)
            response = _error(exc.status, f"{exc.reason} ({request.method} {request.path})", error_type, code)
        self._log(request, response, started)
        return response

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        assert self._api_key is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode("utf-8"), self._api_key)

    def _log(self, request: web.Request, response: web.StreamResponse, started: float) -> None:
        elapsed_ms = (time.monotonic() - started) * 1000
        logger.info("%s %s -> %d (%.0f ms)", request.method, request.path, response.status, elapsed_ms)

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": ident, "object": "model", "created": 0, "owned_by": "clawstack"} for ident in self._model_ids]
        return web.json_response({"object": "list", "data": data})

    async def _list_requests(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": [recorded.to_dict() for recorded in self._requests]})

    async def _clear_requests(self, request: web.Request) -> web.Response:
        self.clear_requests()
        return web.Response(status=204)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        number = next(self._numbers)
        try:
            chat = read_chat_request(await request.read())
            conversation = read_conversation(chat.messages)
            behaviour = self._behaviour_for(conversation)
        except BadChatRequest as exc:
            return _error(400, exc.message, "invalid_request_error", exc.code)
        except FakeDirectiveError as exc:
            return _error(400, exc.message, "invalid_request_error", exc.code)
        if behaviour.delay_ms and not await self._wait_while_connected(request, behaviour.delay_ms / 1000):
            # Nobody is left to read it; 499 ("client closed request") is only for the log line. No byte of the
            # answer was sent, so a script step is not used up: a client that retries (as a gateway does after a
            # dropped connection) gets the answer it was scripted to get, not fake_script_exhausted.
            if self._player is not None:
                self._player.give_back(behaviour)
            return web.Response(status=499)
        if behaviour.fail_status is not None:
            response = web.json_response(failure_body(behaviour.fail_status), status=behaviour.fail_status)
            retry_after = behaviour.retry_after_s
            if retry_after is None and behaviour.fail_status in (429, 503):
                retry_after = 1
            if retry_after is not None:
                response.headers["Retry-After"] = str(retry_after)
            return response
        if behaviour.malformed and not chat.stream:
            return web.Response(body=_MALFORMED_JSON, content_type="application/json")
        answer = answer_for(behaviour, conversation)
        usage = usage_for(conversation, answer)
        created = int(time.time())
        if not chat.stream:
            if behaviour.drop_after_chunks is not None:
                _abort(request)
                return web.Response()
            return web.json_response(
                completion_body(number=number, created=created, model=chat.model, answer=answer, usage=usage)
            )
        chunks = stream_chunks(
            number=number,
            created=created,
            model=chat.model,
            answer=answer,
            usage=usage if chat.include_usage else None,
        )
        return await self._stream(request, behaviour, chunks)

    def _behaviour_for(self, conversation: Conversation) -> Behaviour:
        directed = parse_directives(conversation.last_user_text)
        if directed is not None:
            return for_turn(directed, conversation.tool_results)
        if self._player is None:
            return Behaviour()
        step = self._player.take(conversation.last_user_text, conversation.user_texts)
        if step is None:
            raise BadChatRequest("The fake model's script has no step left for this request.", "fake_script_exhausted")
        return step

    async def _stream(
        self, request: web.Request, behaviour: Behaviour, chunks: list[dict[str, Any]]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await response.prepare(request)
            events = [json.dumps(chunk).encode("utf-8") for chunk in chunks]
            if behaviour.malformed:
                events[1:] = [b'{"choices": [']
            for sent, event in enumerate(events):
                if sent == behaviour.drop_after_chunks:
                    _abort(request)
                    return response
                if behaviour.chunk_delay_ms and not await self._wait_while_connected(
                    request, behaviour.chunk_delay_ms / 1000
                ):
                    return response
                await response.write(b"data: " + event + b"\n\n")
            if behaviour.drop_after_chunks is not None and behaviour.drop_after_chunks >= len(events):
                _abort(request)
                return response
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:
            self._note_disconnect()
        return response

    async def _wait_while_connected(self, request: web.Request, seconds: float) -> bool:
        """Sleep ``seconds``; return early with ``False`` (and count it) if the client goes away meanwhile."""
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while True:
            transport = request.transport
            if transport is None or transport.is_closing():
                self._note_disconnect()
                return False
            left = until - loop.time()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, _POLL_S))

    def _note_disconnect(self) -> None:
        self._client_disconnects += 1
        self._changed.set()


def _remove_socket(path: str) -> None:
    """Remove the socket file this server created, if a socket is still there."""
    socket_path = Path(path)
    if socket_path.is_socket():
        socket_path.unlink(missing_ok=True)


def _abort(request: web.Request) -> None:
    """Drop the connection without a proper end, as a crashed upstream would."""
    if request.transport is not None:
        request.transport.abort()

"""HTTP transports of the proxy: the worker API and the operator API, on their own listeners.

Worker API (loopback TCP and/or a Unix socket; callers authenticate with ``<identity>:<secret>``):
``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /v1/health``.

Operator API (a peer-checked Unix socket in a trusted directory and/or loopback TCP; every call carries the
operator token): ``POST /v1/identities``, ``GET /v1/identities/{id}``, ``POST /v1/identities/{id}/revoke``,
``POST /v1/identities/{id}/expiry`` (the run's authority moved), ``GET /v1/revocations/{id}`` (a fresh read from disk), ``GET /v1/health``. The two listeners never share routes,
so a worker that reaches its own API cannot reach the operator's.

Every error is the OpenAI envelope ``{"error":{"message","type","code"}}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from clawstack.common.clock import Clock
from clawstack.common.ids import secrets_equal
from clawstack.common.strictjson import StrictJSONError
from clawstack.common.strictjson import loads as strict_loads
from clawstack.common.uds import UnixSocketServer, remove_stale_socket
from clawstack.proxy.chat import sse_error
from clawstack.proxy.config import ProxyConfig
from clawstack.proxy.errors import AuthError, ForbiddenError, NotFoundError, ProxyError, RequestError, UpstreamError
from clawstack.proxy.service import CreateIdentityRequest, ExpiryRequest, ProxyService, validation_message

log = logging.getLogger(__name__)

OPERATOR_MAX_BODY = 64 * 1024
BODY_READ_TIMEOUT_S = 10.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Body = TypeVar("Body", bound=BaseModel)


def _envelope(error: ProxyError) -> web.Response:
    return web.json_response(error.envelope(), status=error.status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProxyError as exc:
        return _envelope(exc)
    except web.HTTPRequestEntityTooLarge:
        return _envelope(RequestError("the request body is too large", code="body_too_large", status=413))
    except web.HTTPNotFound:
        return _envelope(NotFoundError("no such endpoint", code="not_found"))
    except web.HTTPMethodNotAllowed:
        return _envelope(RequestError("method not allowed", code="method_not_allowed", status=405))


async def _read_json(request: web.Request, *, max_bytes: int) -> Any:
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            raw = await request.read()
    except TimeoutError as exc:
        raise RequestError("the body was not received in time", code="body_timeout", status=408) from exc
    try:
        return strict_loads(raw, max_bytes=max_bytes, max_depth=64)
    except StrictJSONError as exc:
        status = 413 if exc.code == "json_too_large" else 400
        raise RequestError(f"invalid JSON body: {exc.message}", code=exc.code, status=status) from exc


async def _read_model(request: web.Request, model: type[Body]) -> Body:
    """An operator request body, strictly: unknown fields and wrong types are ``invalid_request``."""
    body = await _read_json(request, max_bytes=OPERATOR_MAX_BODY)
    try:
        return model.model_validate_json(json.dumps(body))
    except ValidationError as exc:
        raise RequestError(validation_message(exc), code="invalid_request") from exc


class ProxyServer:
    """The running proxy: the service plus its listeners. Use as an async context manager or start()/stop()."""

    def __init__(
        self, config: ProxyConfig, *, clock: Clock | None = None, environ: Mapping[str, str] | None = None
    ) -> None:
        self.config = config
        self.service = ProxyService(config, clock=clock, environ=environ)
        self._runners: list[web.AppRunner] = []
        self._uds: list[UnixSocketServer] = []
        self.worker_port: int | None = None
        self.operator_port: int | None = None

    # ------------------------------------------------------------------------------------------------ worker

    def worker_app(self) -> web.Application:
        app = web.Application(middlewares=[_errors], client_max_size=self.config.routing.max_request_bytes)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/health", self._worker_health)
        return app

    def _identity(self, request: web.Request) -> Any:
        return self.service.authenticate(request.headers.get("Authorization"), request.headers.get("x-api-key"))

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.models(self._identity(request)))

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.health())

    async def _worker_health(self, request: web.Request) -> web.Response:
        """Liveness only: unauthenticated, so it tells a worker nothing of the pod (its runs, its keys)."""
        return web.json_response({"status": "ok"})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        identity = self._identity(request)
        body = await _read_json(request, max_bytes=self.config.routing.max_request_bytes)
        prepared = self.service.prepare(identity, body)
        flow = self.service.flow
        streamed: list[web.StreamResponse] = []

        async def start() -> Callable[[bytes], Awaitable[None]]:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            streamed.append(response)
            return response.write

        async def work() -> web.StreamResponse:
            try:
                async with asyncio.timeout(self.config.routing.request_timeout_s):
                    if not prepared.stream:
                        data = await flow.complete(identity, prepared.entries, prepared.body, prepared.managed_tools)
                        return web.Response(body=data, content_type="application/json")
                    await flow.stream(identity, prepared.entries, prepared.body, prepared.managed_tools, start)
            except TimeoutError as exc:
                error = UpstreamError("the request ran past its deadline", code="upstream_timeout", status=504)
                if not streamed:
                    raise error from exc
                await streamed[0].write(sse_error(error.code, error.message))
            await streamed[0].write_eof()
            return streamed[0]

        task = asyncio.create_task(work())
        identity.inflight.add(task)
        try:
            await asyncio.wait({task})
        finally:
            identity.inflight.discard(task)
            if not task.done():  # the worker went away: stop the upstream work too
                task.cancel()
        if task.cancelled():  # revoked while in flight
            if streamed:
                await streamed[0].write(sse_error("identity_revoked", "identity revoked"))
                await streamed[0].write_eof()
                return streamed[0]
            raise ForbiddenError("identity revoked", code="identity_revoked")
        return task.result()

    # ---------------------------------------------------------------------------------------------- operator

    def operator_app(self) -> web.Application:
        app = web.Application(middlewares=[_errors, self._operator_auth], client_max_size=OPERATOR_MAX_BODY)
        app.router.add_post("/v1/identities", self._create)
        app.router.add_get("/v1/identities/{id}", self._get)
        app.router.add_post("/v1/identities/{id}/revoke", self._revoke)
        app.router.add_post("/v1/identities/{id}/expiry", self._expiry)
        app.router.add_get("/v1/revocations/{id}", self._durable)
        app.router.add_get("/v1/subscriptions", self._subscriptions)
        app.router.add_get("/v1/health", self._health)
        return app

    async def _subscriptions(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.subscriptions())

    @web.middleware
    async def _operator_auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        if header is None:
            raise AuthError("missing operator token", code="missing_credentials")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthError("use Authorization: Bearer <operator token>", code="malformed_credentials")
        expected = self.service.operator_token or ""
        if not secrets_equal(token.strip(), expected):
            raise ForbiddenError("operator token refused", code="operator_refused")
        return await handler(request)

    async def _create(self, request: web.Request) -> web.Response:
        create = await _read_model(request, CreateIdentityRequest)
        identity, created = await self.service.create_identity(create)
        return web.json_response(self.service.describe(identity), status=201 if created else 200)

    async def _expiry(self, request: web.Request) -> web.Response:
        change = await _read_model(request, ExpiryRequest)
        identity = await self.service.set_expiry(request.match_info["id"], change)
        return web.json_response(self.service.describe(identity))

    async def _get(self, request: web.Request) -> web.Response:
        return web.json_response(self.service.describe(self.service.get_identity(request.match_info["id"])))

    async def _revoke(self, request: web.Request) -> web.Response:
        if request.can_read_body:
            await _read_json(request, max_bytes=OPERATOR_MAX_BODY)
        return web.json_response(await self.service.revoke(request.match_info["id"]))

    async def _durable(self, request: web.Request) -> web.Response:
        result = await asyncio.to_thread(self.service.durable_revocation, request.match_info["id"])
        return web.json_response(result)

    # --------------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.service.start()
        try:
            self.worker_port = await self._listen(self.worker_app(), self.config.worker.host, self.config.worker.port)
            if self.config.worker.unix_socket:
                await self._listen_unix_worker(self.worker_app(), Path(self.config.worker.unix_socket))
            self.operator_port = await self._listen(
                self.operator_app(), self.config.operator.host, self.config.operator.port
            )
            if self.config.operator.unix_socket:
                server = UnixSocketServer(self.operator_app(), self.config.operator.unix_socket)
                await server.start()
                self._uds.append(server)
        except BaseException:
            # Best-effort unwinding of whatever started before the failure, then the original error.
            await self.stop()
            raise

    async def _listen(self, app: web.Application, host: str, port: int | None) -> int | None:
        if port is None:
            return None
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port).start()
        return int(runner.addresses[-1][1])

    async def _listen_unix_worker(self, app: web.Application, path: Path) -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        self._runners.append(runner)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_socket(path)
        await web.UnixSite(runner, str(path)).start()
        # Workers authenticate with their identity; the directories above decide who can reach the socket. Its
        # own directory is searchable, because a local sandbox binds that directory, not the socket file.
        os.chmod(path, 0o666)  # noqa: S103
        os.chmod(path.parent, 0o711)  # noqa: S103

    async def stop(self) -> None:
        """Stop listening, finish requests in flight, persist and close. Idempotent."""
        for server in self._uds:
            await server.stop()
        self._uds.clear()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        await self.service.close()

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def worker_base_url(self) -> str:
        return f"http://{self.config.worker.host}:{self.worker_port}/v1"

    @property
    def operator_base_url(self) -> str:
        return f"http://{self.config.operator.host}:{self.operator_port}"


__all__ = ["ProxyServer"]

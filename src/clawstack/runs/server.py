"""The supervisor's v1 API on its Unix socket: HTTP/1.1, JSON, peer-UID admission, the spec's limits.

Bodies are at most 64 KiB and must arrive within 10 s; long-polls wait at most 60 s and their answer has a 70 s
write budget. Errors are ``{"error":{"code","message"},"run":null}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Final

from aiohttp import web

from clawstack.common.clock import format_timestamp
from clawstack.common.uds import UnixSocketServer
from clawstack.runs.admission import MAX_BODY_BYTES
from clawstack.runs.errors import RunsError
from clawstack.runs.homes_api import HomesAPI
from clawstack.runs.supervisor import Answer, Supervisor

log = logging.getLogger(__name__)

BODY_READ_TIMEOUT_S: Final = 10.0
WRITE_BUDGET_S: Final = 70.0
DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m)?")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def parse_timeout(value: str | None) -> float | None:
    if value is None:
        return None
    match = DURATION.fullmatch(value.strip())
    if match is None:
        raise RunsError("request_invalid", "timeout must be a duration such as 30s")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number / 1000 if unit == "ms" else number * 60 if unit == "m" else number


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RunsError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPRequestEntityTooLarge:
        error = RunsError("body_too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
        return web.json_response(error.body(), status=error.status)
    except web.HTTPNotFound:
        error = RunsError("not_found", "no such endpoint")
        return web.json_response(error.body(), status=404)
    except web.HTTPMethodNotAllowed:
        error = RunsError("method_not_allowed", "method not allowed")
        return web.json_response(error.body(), status=405)


async def _read_body(request: web.Request, timeout_s: float) -> bytes:
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError as exc:
        raise RunsError("body_timeout", f"the body was not received within {timeout_s:g} s") from exc


async def _send(request: web.Request, answer: Answer) -> web.StreamResponse:
    if isinstance(answer.body, bytes):
        response = web.Response(body=answer.body, status=answer.status, content_type="text/plain", charset="utf-8")
    else:
        response = web.Response(text=json.dumps(answer.body), status=answer.status, content_type="application/json")
    for name, value in (answer.headers or {}).items():
        response.headers[name] = value
    async with asyncio.timeout(WRITE_BUDGET_S):
        await response.prepare(request)
        await response.write_eof()
    return response


def make_app(supervisor: Supervisor, *, body_timeout_s: float = BODY_READ_TIMEOUT_S) -> web.Application:
    """The v1 routes, mapped onto the supervisor's core."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)

    async def _body(request: web.Request) -> bytes:
        return await _read_body(request, body_timeout_s)

    async def launch(request: web.Request) -> web.StreamResponse:
        return await _send(request, await supervisor.launch(await _body(request)))

    async def status(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        answer = await supervisor.get(
            m["installation"], m["run_id"], request.query.get("wait"), parse_timeout(request.query.get("timeout"))
        )
        return await _send(request, answer)

    async def cancel(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        answer = await supervisor.cancel(
            m["installation"],
            m["run_id"],
            await _body(request),
            request.query.get("wait"),
            parse_timeout(request.query.get("timeout")),
        )
        return await _send(request, answer)

    async def credential(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return await _send(request, await supervisor.credential(m["installation"], m["run_id"], await _body(request)))

    async def result(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return await _send(request, supervisor.result(m["installation"], m["run_id"]))

    async def templates(request: web.Request) -> web.StreamResponse:
        return await _send(request, supervisor.templates())

    async def identity(request: web.Request) -> web.StreamResponse:
        return await _send(request, supervisor.identity())

    async def health(request: web.Request) -> web.StreamResponse:
        return await _send(request, await supervisor.health())

    async def subscriptions(request: web.Request) -> web.StreamResponse:
        return await _send(request, await supervisor.subscriptions())

    async def list_runs(request: web.Request) -> web.StreamResponse:
        return await _send(request, supervisor.list_runs(request.query.items()))

    homes = HomesAPI(supervisor)

    async def home_status(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return await _send(request, homes.status(m["installation"], m["home"]))

    async def home_delete(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return await _send(request, await homes.delete(m["installation"], m["home"]))

    async def deliverables(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        return await _send(request, await homes.deliverables(m["installation"], m["home"]))

    async def deliverable(request: web.Request) -> web.StreamResponse:
        m = request.match_info
        answer = await homes.deliverable(m["installation"], m["home"], m["name"], request.query.get("sha256"))
        return await _send(request, answer)

    run = "/v1/runs/{installation}/{run_id}"
    app.router.add_post("/v1/runs", launch)
    app.router.add_get("/v1/runs", list_runs)
    app.router.add_get(run, status)
    app.router.add_post(run + "/cancel", cancel)
    app.router.add_post(run + "/credential", credential)
    app.router.add_get(run + "/result", result)
    app.router.add_get("/v1/templates", templates)
    app.router.add_get("/v1/identity", identity)
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/subscriptions", subscriptions)
    home = "/v1/homes/{installation}/{home}"
    app.router.add_get(home, home_status)
    app.router.add_delete(home, home_delete)
    app.router.add_get(home + "/deliverables", deliverables)
    app.router.add_get(home + "/deliverables/{name}", deliverable)
    return app


class RunsServer:
    """The supervisor on its socket: start-up in the spec's order, then serve; stop in reverse."""

    def __init__(
        self,
        supervisor: Supervisor,
        socket_dir: Path,
        *,
        allowed_uids: Iterable[int] = (),
        body_timeout_s: float = BODY_READ_TIMEOUT_S,
    ) -> None:
        self.supervisor = supervisor
        self.socket_path = socket_dir / "runs.sock"
        app = make_app(supervisor, body_timeout_s=body_timeout_s)
        self._server = UnixSocketServer(
            app, self.socket_path, allowed_uids=allowed_uids, shutdown_timeout_s=WRITE_BUDGET_S
        )

    async def start(self, *, remove_orphans: bool = False) -> None:
        await self.supervisor.start(remove_orphans=remove_orphans)
        try:
            await self._server.start()
        except BaseException:
            # Best-effort release of the supervisor's lock and ledger, then the original error.
            await self.supervisor.stop()
            raise
        log.info("serving at %s since %s", self.socket_path, format_timestamp(self.supervisor.clock.now()))

    async def stop(self) -> None:
        """Stop accepting, finish requests in flight, then stop the drivers and release the lock. Idempotent."""
        await self._server.stop()
        await self.supervisor.stop()


__all__ = ["RunsServer", "make_app", "parse_timeout"]

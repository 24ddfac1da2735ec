"""Dispatching managed tool calls to a real aiohttp tool service on 127.0.0.1, in every way it can go wrong.

The fixture service checks the bearer like a real one, records exactly what it received, and has one endpoint per
fault: slow, slow body, 500, 403, garbage, invalid JSON, oversized (declared and chunked), redirect, dropped
connection. A service on a port where nothing listens and one that does not speak HTTP complete the faults. Every
test checks, through ``caplog``, that neither a bearer nor the arguments reach a log record.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from clawstack.proxy.tool_dispatch import MAX_DETAIL_CHARS, ToolDispatcher, ToolOutcome
from clawstack.proxy.tools import ToolCatalog, ToolService, ToolSpec, parse_descriptor

TOKEN = "tkn-6f1c0d2e9a8b4c7d-ingress"
WRONG_TOKEN = "tkn-stale-0000000000-ingress"
SECRET_ARGUMENT = "summarise the confidential merger memo"
LIMIT = 4096
SHORT_TIMEOUT_S = 0.2

TICKET_TOOLS = [
    "get_ticket",
    "plain",
    "echo_token",
    "slow",
    "slow_body",
    "fail",
    "forbidden",
    "garbage",
    "bad_json",
    "exact",
    "big",
    "big_chunked",
    "redirect",
    "drop",
    "empty",
]
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "note": {"type": "string"}}}


def _descriptor(tools: list[str], *, env: str | None, prefix: str = "/tools/") -> bytes:
    document: dict[str, object] = {
        "version": 2,
        "tools": [
            {
                "name": name,
                "description": f"The {name} tool.",
                "parameters": SCHEMA,
                "http": {"method": "POST", "path": prefix + name},
            }
            for name in tools
        ],
    }
    if env is not None:
        document["auth"] = {"type": "bearer", "env": env}
    return json.dumps(document).encode()


@dataclass
class Received:
    path: str
    body: bytes
    authorization: str | None
    cookie: str | None = None


@dataclass
class FakeToolService:
    """What the fixture service saw, and the events its slow handlers wait on."""

    received: list[Received] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    base_url: str = ""

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record_and_check])
        routes = {name: getattr(self, f"_{name}") for name in TICKET_TOOLS}
        for name, handler in routes.items():
            app.router.add_post(f"/tools/{name}", handler)
        app.router.add_post("/open/lookup", self._lookup)
        return app

    @web.middleware
    async def _record_and_check(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        authorization = request.headers.get("Authorization")
        self.received.append(Received(request.path, await request.read(), authorization, request.headers.get("Cookie")))
        if not request.path.startswith("/open/") and authorization != f"Bearer {TOKEN}":
            return web.json_response({"error": "bad bearer"}, status=401)
        return await handler(request)

    async def _get_ticket(self, request: web.Request) -> web.Response:
        arguments = await request.json()
        return web.json_response({"id": arguments.get("id"), "title": "Printer on fire"})

    async def _plain(self, request: web.Request) -> web.Response:
        response = web.Response(text="ticket 42 closed", content_type="text/plain")
        response.set_cookie("planted", "by-ticket-api", path="/")
        return response

    async def _echo_token(self, request: web.Request) -> web.Response:
        return web.json_response({"you_sent": request.headers["Authorization"]})

    async def _slow(self, request: web.Request) -> web.Response:
        self.entered.set()
        await self.release.wait()
        return web.json_response({"late": True})

    async def _slow_body(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "100"})
        await response.prepare(request)
        await response.write(b'{"start": ')
        self.entered.set()
        await self.release.wait()
        return response

    async def _fail(self, request: web.Request) -> web.Response:
        body = f"Traceback\x00\x1b[31m\r\n  token={TOKEN}\n" + "x" * 5000
        return web.Response(status=500, text=body, content_type="text/plain")

    async def _forbidden(self, request: web.Request) -> web.Response:
        return web.Response(status=403, text=f"no entry for {TOKEN}")

    async def _garbage(self, request: web.Request) -> web.Response:
        return web.Response(body=b"\xff\xfe\xfa\x00\x81 not text", content_type="application/octet-stream")

    async def _bad_json(self, request: web.Request) -> web.Response:
        return web.Response(body=b'{"id": 42, "title": ', content_type="application/json")

    async def _exact(self, request: web.Request) -> web.Response:
        return web.Response(text="e" * LIMIT, content_type="text/plain")

    async def _big(self, request: web.Request) -> web.Response:
        return web.Response(text="b" * (LIMIT + 1), content_type="text/plain")

    async def _big_chunked(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(3):
            await response.write(b"c" * (LIMIT // 2))
        await response.write_eof()
        return response

    async def _redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(location=f"{self.base_url}/tools/get_ticket")

    async def _drop(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "1000"})
        await response.prepare(request)
        await response.write(b'{"partial": ')
        assert request.transport is not None
        request.transport.close()
        return response

    async def _empty(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def _lookup(self, request: web.Request) -> web.Response:
        return web.json_response({"found": True})


@pytest.fixture(autouse=True)
def no_secrets_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture every clawstack log record and, after the test, prove none carries a bearer or the arguments."""
    caplog.set_level(logging.DEBUG, logger="clawstack")
    yield
    for record in caplog.records:
        text = record.getMessage() + repr(record.args) + (record.exc_text or "")
        for secret in (TOKEN, WRONG_TOKEN, SECRET_ARGUMENT):
            assert secret not in text, f"{secret!r} leaked into a log record: {record.getMessage()!r}"


@pytest.fixture
async def service() -> AsyncIterator[FakeToolService]:
    fake = FakeToolService()
    runner = web.AppRunner(fake.app(), shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.base_url = f"http://{host}:{port}"
    try:
        yield fake
    finally:
        fake.release.set()
        await runner.cleanup()


@pytest.fixture
def dead_port() -> int:
    """A port on 127.0.0.1 where nothing listens: bound once to learn it, then closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
async def not_http() -> AsyncIterator[str]:
    """A TCP server that reads a request and answers something that is not HTTP."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"this is not HTTP at all\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def catalog(service: FakeToolService, dead_port: int, not_http: str) -> ToolCatalog:
    return ToolCatalog(
        [
            ToolService(
                parse_descriptor("ticket-api", _descriptor(TICKET_TOOLS, env="TICKET_API_TOKEN")),
                base_url=service.base_url,
                bearer=TOKEN,
            ),
            ToolService(
                parse_descriptor("stale-api", _descriptor(["get_ticket"], env="STALE_API_TOKEN")),
                base_url=service.base_url,
                bearer=WRONG_TOKEN,
            ),
            ToolService(
                parse_descriptor("open-api", _descriptor(["lookup"], env=None, prefix="/")),
                base_url=service.base_url + "/open/",
                bearer=None,
            ),
            ToolService(
                parse_descriptor("down-api", _descriptor(["get_ticket"], env="DOWN_API_TOKEN")),
                base_url=f"http://127.0.0.1:{dead_port}",
                bearer=TOKEN,
            ),
            ToolService(
                parse_descriptor("odd-api", _descriptor(["get_ticket"], env=None)),
                base_url=not_http,
            ),
        ]
    )


@pytest.fixture
async def dispatcher(catalog: ToolCatalog) -> AsyncIterator[ToolDispatcher]:
    async with ToolDispatcher(catalog, timeout_s=10.0, max_result_bytes=LIMIT) as tool_dispatcher:
        yield tool_dispatcher


@pytest.fixture
async def hasty(catalog: ToolCatalog) -> AsyncIterator[ToolDispatcher]:
    async with ToolDispatcher(catalog, timeout_s=SHORT_TIMEOUT_S, max_result_bytes=LIMIT) as tool_dispatcher:
        yield tool_dispatcher


def _spec(catalog: ToolCatalog, qualified: str) -> ToolSpec:
    spec = catalog.get(qualified)
    assert spec is not None
    return spec


ARGUMENTS = json.dumps({"id": 42, "note": SECRET_ARGUMENT})


def _error(outcome: ToolOutcome) -> dict[str, object]:
    content = json.loads(outcome.content)
    assert isinstance(content, dict)
    assert content["error"] == outcome.error_code
    assert isinstance(content["message"], str)
    assert outcome.qualified in content["message"]
    assert len(outcome.content) < 600, "error content must stay short"
    return content


# ------------------------------------------------------------------------------------------------ success


async def test_json_answer_is_the_content_and_the_service_got_exactly_the_arguments_and_bearer(
    service: FakeToolService, catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.get_ticket"), ARGUMENTS)
    assert outcome.ok
    assert outcome.error_code is None
    assert outcome.http_status == 200
    assert json.loads(outcome.content) == {"id": 42, "title": "Printer on fire"}
    assert outcome.qualified == "ticket-api.get_ticket"
    assert outcome.duration_ms >= 0
    assert service.received == [Received("/tools/get_ticket", ARGUMENTS.encode(), f"Bearer {TOKEN}")]


async def test_text_answer_is_the_content(catalog: ToolCatalog, dispatcher: ToolDispatcher) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.plain"), "{}")
    assert (outcome.ok, outcome.content) == (True, "ticket 42 closed")


async def test_a_body_of_exactly_the_limit_is_accepted(catalog: ToolCatalog, dispatcher: ToolDispatcher) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.exact"), "{}")
    assert outcome.ok
    assert len(outcome.content) == LIMIT


async def test_an_empty_answer_is_empty_content(catalog: ToolCatalog, dispatcher: ToolDispatcher) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.empty"), "{}")
    assert (outcome.ok, outcome.http_status, outcome.content) == (True, 204, "")


async def test_a_service_without_auth_gets_no_authorization_header(
    service: FakeToolService, catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "open-api.lookup"), '{"q": "x"}')
    assert outcome.ok
    assert service.received == [Received("/open/lookup", b'{"q": "x"}', None)]


async def test_a_service_echoing_the_bearer_does_not_hand_it_to_the_model(
    catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.echo_token"), "{}")
    assert outcome.ok
    assert TOKEN not in outcome.content
    assert json.loads(outcome.content) == {"you_sent": "Bearer [redacted]"}


async def test_cookies_set_by_one_service_reach_no_later_call(service: FakeToolService) -> None:
    # By host name: a cookie jar ignores cookies from IP-address hosts, which would hide a shared jar.
    by_name = service.base_url.replace("127.0.0.1", "localhost")
    catalog = ToolCatalog(
        [
            ToolService(
                parse_descriptor("ticket-api", _descriptor(TICKET_TOOLS, env="TICKET_API_TOKEN")), by_name, TOKEN
            ),
            ToolService(parse_descriptor("open-api", _descriptor(["lookup"], env=None, prefix="/")), by_name + "/open"),
        ]
    )
    async with ToolDispatcher(catalog, timeout_s=10.0) as dispatcher:
        assert (await dispatcher.dispatch(_spec(catalog, "ticket-api.plain"), "{}")).ok
        assert (await dispatcher.dispatch(_spec(catalog, "open-api.lookup"), "{}")).ok
        assert (await dispatcher.dispatch(_spec(catalog, "ticket-api.get_ticket"), "{}")).ok
    assert [r.cookie for r in service.received] == [None, None, None]


async def test_concurrent_dispatches_share_the_session(
    service: FakeToolService, catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    spec = _spec(catalog, "ticket-api.get_ticket")
    outcomes = await asyncio.gather(*(dispatcher.dispatch(spec, json.dumps({"id": n})) for n in range(20)))
    assert [json.loads(o.content)["id"] for o in outcomes] == list(range(20))
    assert sorted(json.loads(r.body)["id"] for r in service.received) == list(range(20))


# ------------------------------------------------------------------------------------------------ failures

FAILURES = [
    # (qualified tool, error_code, http_status)
    ("stale-api.get_ticket", "tool_unauthorized", 401),
    ("ticket-api.forbidden", "tool_unauthorized", 403),
    ("ticket-api.fail", "tool_failed", 500),
    ("ticket-api.redirect", "tool_failed", 307),
    ("ticket-api.garbage", "tool_bad_response", 200),
    ("ticket-api.bad_json", "tool_bad_response", 200),
    ("ticket-api.big", "tool_bad_response", 200),
    ("ticket-api.big_chunked", "tool_bad_response", 200),
    ("ticket-api.drop", "tool_unavailable", None),
    ("down-api.get_ticket", "tool_unavailable", None),
    ("odd-api.get_ticket", "tool_bad_response", None),
]


@pytest.mark.parametrize(("qualified", "code", "status"), FAILURES)
async def test_each_fault_is_an_outcome_with_its_code(
    catalog: ToolCatalog, dispatcher: ToolDispatcher, qualified: str, code: str, status: int | None
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, qualified), ARGUMENTS)
    assert (outcome.ok, outcome.error_code, outcome.http_status) == (False, code, status)
    content = _error(outcome)
    assert content.get("status") == status
    for secret in (TOKEN, WRONG_TOKEN, SECRET_ARGUMENT):
        assert secret not in outcome.content


async def test_unauthorized_warns_the_operator_without_the_token(
    catalog: ToolCatalog, dispatcher: ToolDispatcher, caplog: pytest.LogCaptureFixture
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "stale-api.get_ticket"), "{}")
    assert outcome.error_code == "tool_unauthorized"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("stale-api" in w and "STALE_API_TOKEN" in w and "401" in w for w in warnings)


async def test_a_failure_carries_at_most_200_sanitized_characters_of_the_body(
    catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.fail"), "{}")
    detail = _error(outcome)["detail"]
    assert isinstance(detail, str)
    assert len(detail) <= MAX_DETAIL_CHARS
    assert detail.startswith("Traceback [31m token=[redacted] xxx")
    assert all(ch.isprintable() for ch in detail)


async def test_a_redirect_is_not_followed(
    service: FakeToolService, catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.redirect"), ARGUMENTS)
    assert outcome.error_code == "tool_failed"
    assert "redirect" in str(_error(outcome)["message"])
    assert [r.path for r in service.received] == ["/tools/redirect"]


async def test_a_down_service_says_the_call_was_not_delivered(catalog: ToolCatalog, dispatcher: ToolDispatcher) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "down-api.get_ticket"), "{}")
    assert "did not get the call" in str(_error(outcome)["message"])


async def test_a_dropped_connection_says_the_call_may_have_taken_effect(
    catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.drop"), "{}")
    assert "may have taken effect" in str(_error(outcome)["message"])


@pytest.mark.parametrize("tool", ["slow", "slow_body"])
async def test_a_slow_service_times_out(
    service: FakeToolService, catalog: ToolCatalog, hasty: ToolDispatcher, tool: str
) -> None:
    outcome = await hasty.dispatch(_spec(catalog, f"ticket-api.{tool}"), "{}")
    assert service.entered.is_set()
    assert (outcome.ok, outcome.error_code) == (False, "tool_timeout")
    assert _error(outcome)["message"] == f"the ticket-api.{tool} tool did not answer within 0.2 s"
    assert outcome.duration_ms >= SHORT_TIMEOUT_S * 1000 * 0.9


async def test_the_dispatcher_works_on_after_a_timeout(catalog: ToolCatalog, hasty: ToolDispatcher) -> None:
    assert (await hasty.dispatch(_spec(catalog, "ticket-api.slow"), "{}")).error_code == "tool_timeout"
    assert (await hasty.dispatch(_spec(catalog, "ticket-api.get_ticket"), "{}")).ok


INVALID_ARGUMENTS = [
    "",
    "   ",
    "[]",
    '"{}"',
    "null",
    "42",
    "true",
    '{"id": 1,}',
    '{"id": 1, "id": 2}',
    '{"a": NaN}',
    '{"a": "\\ud800"}',
    '{"a": 9007199254740993}',
    "{} {}",
    "\ud800",
    "{" * 40 + "}" * 40,
]


@pytest.mark.parametrize("arguments", INVALID_ARGUMENTS)
async def test_invalid_arguments_are_refused_before_any_request(
    service: FakeToolService, catalog: ToolCatalog, dispatcher: ToolDispatcher, arguments: str
) -> None:
    outcome = await dispatcher.dispatch(_spec(catalog, "ticket-api.get_ticket"), arguments)
    assert (outcome.ok, outcome.error_code, outcome.http_status) == (False, "tool_arguments_invalid", None)
    _error(outcome)
    assert service.received == []


# ------------------------------------------------------------------------------------------------ lifecycle


async def test_cancelling_a_dispatch_in_flight_raises_promptly(
    service: FakeToolService, catalog: ToolCatalog, dispatcher: ToolDispatcher
) -> None:
    task = asyncio.create_task(dispatcher.dispatch(_spec(catalog, "ticket-api.slow"), "{}"))
    async with asyncio.timeout(5):
        await service.entered.wait()
    task.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert (await dispatcher.dispatch(_spec(catalog, "ticket-api.plain"), "{}")).ok


async def test_dispatch_needs_a_started_dispatcher_and_a_spec_of_its_catalog(catalog: ToolCatalog) -> None:
    spec = _spec(catalog, "ticket-api.get_ticket")
    dispatcher = ToolDispatcher(catalog)
    with pytest.raises(RuntimeError):
        await dispatcher.dispatch(spec, "{}")
    stranger = ToolSpec(
        service="ticket-api",
        name="get_ticket",
        description="x",
        parameters={"type": "object"},
        method="POST",
        path="/x",
    )
    async with dispatcher:
        with pytest.raises(RuntimeError):
            await dispatcher.start()
        with pytest.raises(ValueError, match="not in this dispatcher's catalog"):
            await dispatcher.dispatch(stranger, "{}")
    await dispatcher.close()  # idempotent


@pytest.mark.parametrize(("timeout_s", "max_result_bytes"), [(0, 10), (-1, 10), (1, 0)])
def test_limits_must_be_positive(catalog: ToolCatalog, timeout_s: float, max_result_bytes: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ToolDispatcher(catalog, timeout_s=timeout_s, max_result_bytes=max_result_bytes)

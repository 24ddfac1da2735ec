"""The callback sender against a real aiohttp orchestrator on 127.0.0.1: what arrives, and how each answer or fault
(401, 403, 5xx, 429, redirects, hangs, dropped connections, nothing listening) is retried or settled."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from clawstack.common.clock import ManualClock
from clawstack.runs.callbacks import (
    CallbackKind,
    CallbackResult,
    CallbackSender,
    CallbackTarget,
    end_body,
    run_body,
)

CREDENTIAL = "orch-cred-3b9f0c1e5d7a42a8b6c4e2f0a1d3c5b7"
SECRET_SUMMARY = "task output that must stay out of logs 8d41"
TEMPLATE = "/cb/{installation}/{run_id}"


@dataclass(frozen=True)
class Received:
    raw_path: str
    behaviour: str
    kind: str
    authorization: str | None
    content_type: str | None
    cookie: str | None
    body: bytes


class Orchestrator:
    """A callback endpoint whose answer is chosen by the installation segment of the path."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.landing_hits = 0
        self.release = asyncio.Event()
        self.origin = ""
        self._changed = asyncio.Condition()
        self._seen: Counter[tuple[str, str]] = Counter()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        payload = await request.read()
        segments = request.raw_path.split("/")
        if segments[1] == "landing":
            self.landing_hits += 1
            return web.json_response({"ok": True})
        behaviour, run_id, kind = segments[2], segments[3], segments[-1]
        self._seen[behaviour, run_id] += 1
        nth = self._seen[behaviour, run_id]
        self.received.append(
            Received(
                raw_path=request.raw_path,
                behaviour=behaviour,
                kind=kind,
                authorization=request.headers.get("Authorization"),
                content_type=request.headers.get("Content-Type"),
                cookie=request.headers.get("Cookie"),
                body=payload,
            )
        )
        async with self._changed:
            self._changed.notify_all()
        return await self._answer(request, behaviour, nth)

    async def _answer(self, request: web.Request, behaviour: str, nth: int) -> web.StreamResponse:
        if behaviour.startswith("status"):  # status401, status500, …
            return web.Response(status=int(behaviour.removeprefix("status")))
        if behaviour == "flaky":
            if nth == 1:
                failing = web.Response(status=500)
                failing.set_cookie("orchestrator_session", "abc")
                return failing
            return web.Response(status=200)
        if behaviour.startswith("retryafter"):  # retryafter7: 503 with Retry-After: 7, then 200
            if nth == 1:
                return web.Response(status=503, headers={"Retry-After": behaviour.removeprefix("retryafter")})
            return web.Response(status=204)
        if behaviour.startswith("redirect"):  # redirect307, redirect301abs, …
            code = int(behaviour[len("redirect") : len("redirect") + 3])
            location = "/landing" if not behaviour.endswith("abs") else f"{self.origin}/landing"
            return web.Response(status=code, headers={"Location": location})
        if behaviour == "hang":
            await self.release.wait()
            return web.Response(status=200)
        if behaviour in ("dropbody", "dropheaders") and nth == 1:
            transport = request.transport
            assert transport is not None
            if behaviour == "dropbody":
                # Promise 1000 bytes, send 10, then drop the connection.
                transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
            transport.close()
            return web.Response(status=200)
        return web.json_response({"received": True})

    async def wait_for_requests(self, count: int, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: len(self.received) >= count)

    def of(self, behaviour: str) -> list[Received]:
        return [r for r in self.received if r.behaviour == behaviour]


class RecordingClock(ManualClock):
    """A clock whose sleeps return at once, moving time forward and recording each delay."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    async def sleep(self, delay_s: float) -> None:
        self.sleeps.append(delay_s)
        self.advance(delay_s)
        await asyncio.sleep(0)


class WatchedClock(ManualClock):
    """A manual clock that tells a test when a sleep has begun."""

    def __init__(self) -> None:
        super().__init__()
        self._slept = asyncio.Event()

    async def sleep(self, delay_s: float) -> None:
        self._slept.set()
        await super().sleep(delay_s)

    async def wait_for_sleep(self, timeout_s: float = 5.0) -> None:
        await asyncio.wait_for(self._slept.wait(), timeout_s)


@pytest.fixture
async def orchestrator() -> AsyncIterator[Orchestrator]:
    endpoint = Orchestrator()
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", endpoint.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    endpoint.origin = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield endpoint
    finally:
        endpoint.release.set()
        await runner.cleanup()


Sender = Callable[..., Awaitable[CallbackSender]]


@pytest.fixture
async def make_sender(orchestrator: Orchestrator) -> AsyncIterator[Sender]:
    senders: list[CallbackSender] = []

    async def make(origin: str | None = None, **settings: Any) -> CallbackSender:
        options: dict[str, Any] = {"clock": RecordingClock(), "timeout_s": 5.0, "jitter": False, **settings}
        sender = CallbackSender(CallbackTarget(origin or orchestrator.origin, TEMPLATE), **options)
        senders.append(sender)
        return sender

    yield make
    for sender in senders:
        await sender.close()


def start(behaviour: str, run_id: str = "run-1") -> dict[str, Any]:
    return run_body(installation=behaviour, run_id=run_id, generation=2)


def end(behaviour: str, run_id: str = "run-1") -> dict[str, Any]:
    return end_body(
        installation=behaviour,
        run_id=run_id,
        generation=2,
        outcome="succeeded",
        reason="",
        summary=SECRET_SUMMARY,
        stored_result_truncated=False,
    )


def sleeps(sender: CallbackSender) -> list[float]:
    clock = sender._clock
    assert isinstance(clock, RecordingClock)
    return clock.sleeps


# --- what arrives ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["start", "heartbeat", "end"])
async def test_2xx_is_acked_with_bearer_and_json(
    orchestrator: Orchestrator, make_sender: Sender, kind: CallbackKind
) -> None:
    sender = await make_sender()
    payload = end("ok") if kind == "end" else start("ok")
    result = await sender.send(kind, CREDENTIAL, payload)
    assert result == CallbackResult(state="acked", status=200, attempts=1, detail="HTTP 200")
    assert not result.authority_ended
    [request] = orchestrator.received
    assert request.raw_path == f"/cb/ok/run-1/{kind}"
    assert request.authorization == f"Bearer {CREDENTIAL}"
    assert request.content_type == "application/json"
    assert json.loads(request.body) == payload


async def test_path_values_arrive_escaped(orchestrator: Orchestrator, make_sender: Sender) -> None:
    sender = await make_sender()
    result = await sender.send("start", CREDENTIAL, start("ok", run_id="r 1/é?"))
    assert result.state == "acked"
    assert orchestrator.received[0].raw_path == "/cb/ok/r%201%2F%C3%A9%3F/start"


async def test_cookies_are_not_echoed(orchestrator: Orchestrator, make_sender: Sender) -> None:
    # A host name, not an IP address: aiohttp's default cookie jar would ignore cookies from an IP address anyway.
    sender = await make_sender(origin=orchestrator.origin.replace("127.0.0.1", "localhost"))
    assert (await sender.send("start", CREDENTIAL, start("flaky"))).state == "acked"
    assert [r.cookie for r in orchestrator.of("flaky")] == [None, None]


# --- settled at once ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
async def test_401_and_403_end_authority_without_retry(
    orchestrator: Orchestrator, make_sender: Sender, status: int
) -> None:
    sender = await make_sender()
    result = await sender.send("end", CREDENTIAL, end(f"status{status}"))
    assert (result.state, result.status, result.attempts) == ("rejected", status, 1)
    assert result.authority_ended
    assert "authority" in result.detail
    assert len(orchestrator.received) == 1
    assert sleeps(sender) == []


@pytest.mark.parametrize("status", [400, 404, 409, 410, 422])
async def test_other_4xx_is_rejected_without_retry(
    orchestrator: Orchestrator, make_sender: Sender, status: int
) -> None:
    sender = await make_sender()
    result = await sender.send("start", CREDENTIAL, start(f"status{status}"))
    assert (result.state, result.status, result.attempts) == ("rejected", status, 1)
    assert not result.authority_ended
    assert len(orchestrator.received) == 1


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("absolute", [False, True])
async def test_redirect_is_rejected_and_never_followed(
    orchestrator: Orchestrator, make_sender: Sender, status: int, absolute: bool
) -> None:
    sender = await make_sender()
    result = await sender.send("end", CREDENTIAL, end(f"redirect{status}{'abs' if absolute else ''}"))
    assert (result.state, result.status, result.attempts) == ("rejected", status, 1)
    assert "redirect" in result.detail
    assert "not followed" in result.detail
    assert not result.authority_ended
    assert orchestrator.landing_hits == 0
    assert len(orchestrator.received) == 1


async def test_an_unusable_credential_is_never_sent(orchestrator: Orchestrator, make_sender: Sender) -> None:
    sender = await make_sender()
    for credential in ["", "tok en", "tok\r\nX-Injected: 1", "tökén"]:
        result = await sender.send("start", credential, start("ok"))
        assert (result.state, result.status, result.attempts) == ("rejected", None, 0)
        if credential:
            assert credential not in result.detail
    assert orchestrator.received == []


# --- retried --------------------------------------------------------------------------------------------------


async def test_500_then_200_is_acked_on_the_second_attempt(orchestrator: Orchestrator, make_sender: Sender) -> None:
    sender = await make_sender()
    result = await sender.send("start", CREDENTIAL, start("flaky"))
    assert (result.state, result.status, result.attempts) == ("acked", 200, 2)
    assert sleeps(sender) == [1.0]
    assert [r.authorization for r in orchestrator.received] == [f"Bearer {CREDENTIAL}"] * 2


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 408])
async def test_retryable_status_until_abandoned(orchestrator: Orchestrator, make_sender: Sender, status: int) -> None:
    sender = await make_sender(max_attempts=4)
    result = await sender.send("end", CREDENTIAL, end(f"status{status}"))
    assert (result.state, result.status, result.attempts) == ("abandoned", status, 4)
    assert result.detail == f"abandoned after 4 attempts; last: HTTP {status}"
    assert len(orchestrator.received) == 4
    assert sleeps(sender) == [1.0, 2.0, 4.0]


async def test_backoff_doubles_up_to_its_cap(orchestrator: Orchestrator, make_sender: Sender) -> None:
    sender = await make_sender(max_attempts=8, backoff_initial_s=0.5, backoff_max_s=5.0)
    result = await sender.send("start", CREDENTIAL, start("status500"))
    assert (result.state, result.attempts) == ("abandoned", 8)
    assert sleeps(sender) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


async def test_jitter_draws_from_the_upper_half(orchestrator: Orchestrator, make_sender: Sender) -> None:
    sender = await make_sender(max_attempts=6, backoff_initial_s=1.0, backoff_max_s=8.0, jitter=True)
    await sender.send("start", CREDENTIAL, start("status503"))
    for delay, nominal in zip(sleeps(sender), [1.0, 2.0, 4.0, 8.0, 8.0], strict=True):
        assert nominal / 2 <= delay <= nominal


@pytest.mark.parametrize(("retry_after", "expected"), [("7", 7.0), ("600", 60.0), ("0", 1.0)])
async def test_retry_after_lengthens_the_wait_up_to_the_cap(
    orchestrator: Orchestrator, make_sender: Sender, retry_after: str, expected: float
) -> None:
    sender = await make_sender(backoff_initial_s=1.0, backoff_max_s=60.0)
    result = await sender.send("start", CREDENTIAL, start(f"retryafter{retry_after}"))
    assert (result.state, result.status, result.attempts) == ("acked", 204, 2)
    assert sleeps(sender) == [expected]


async def test_a_hanging_endpoint_times_out_is_retried_and_abandoned(
    orchestrator: Orchestrator, make_sender: Sender
) -> None:
    sender = await make_sender(timeout_s=0.2, max_attempts=3)
    result = await sender.send("end", CREDENTIAL, end("hang"))
    assert (result.state, result.status, result.attempts) == ("abandoned", None, 3)
    assert "no complete answer within 0.2 s" in result.detail
    assert len(orchestrator.of("hang")) == 3
    assert sleeps(sender) == [1.0, 2.0]


@pytest.mark.parametrize("behaviour", ["dropbody", "dropheaders"])
async def test_a_connection_dropped_mid_answer_is_retried(
    orchestrator: Orchestrator, make_sender: Sender, behaviour: str
) -> None:
    sender = await make_sender()
    result = await sender.send("end", CREDENTIAL, end(behaviour))
    assert (result.state, result.status, result.attempts) == ("acked", 200, 2)
    assert len(orchestrator.of(behaviour)) == 2


async def test_nothing_listening_is_retried_and_abandoned(make_sender: Sender) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sender = await make_sender(origin=f"http://127.0.0.1:{port}", max_attempts=3)
    result = await sender.send("start", CREDENTIAL, start("ok"))
    assert (result.state, result.status, result.attempts) == ("abandoned", None, 3)
    assert "transport error" in result.detail


@pytest.mark.parametrize("behaviour", ["status500", "hang"])
async def test_a_heartbeat_is_retried_at_most_once(
    orchestrator: Orchestrator, make_sender: Sender, behaviour: str
) -> None:
    sender = await make_sender(max_attempts=8, timeout_s=0.2)
    result = await sender.send("heartbeat", CREDENTIAL, start(behaviour))
    assert (result.state, result.attempts) == ("abandoned", 2)
    assert len(orchestrator.of(behaviour)) == 2
    assert sleeps(sender) == [1.0]


async def test_a_heartbeat_with_one_attempt_allowed_is_not_retried(
    orchestrator: Orchestrator, make_sender: Sender
) -> None:
    sender = await make_sender(max_attempts=1)
    result = await sender.send("heartbeat", CREDENTIAL, start("status500"))
    assert (result.state, result.attempts) == ("abandoned", 1)
    assert result.detail == "abandoned after 1 attempt; last: HTTP 500"


async def test_backoff_waits_on_the_injected_clock(orchestrator: Orchestrator, make_sender: Sender) -> None:
    clock = WatchedClock()
    sender = await make_sender(clock=clock, backoff_initial_s=2.0)
    sending = asyncio.create_task(sender.send("start", CREDENTIAL, start("flaky")))
    await clock.wait_for_sleep()
    assert len(orchestrator.received) == 1
    clock.advance(1.999)
    assert clock.sleepers == 1
    assert not sending.done()
    clock.advance(0.001)
    result = await asyncio.wait_for(sending, 5)
    assert (result.state, result.attempts) == ("acked", 2)


# --- cancellation ---------------------------------------------------------------------------------------------


async def test_cancelling_during_a_request_propagates_promptly(orchestrator: Orchestrator, make_sender: Sender) -> None:
    sender = await make_sender(timeout_s=60.0)
    sending = asyncio.create_task(sender.send("end", CREDENTIAL, end("hang")))
    await orchestrator.wait_for_requests(1)
    sending.cancel()
    async with asyncio.timeout(2):
        with pytest.raises(asyncio.CancelledError):
            await sending


async def test_cancelling_during_backoff_propagates_and_sends_nothing_more(
    orchestrator: Orchestrator, make_sender: Sender
) -> None:
    clock = WatchedClock()
    sender = await make_sender(clock=clock)
    sending = asyncio.create_task(sender.send("start", CREDENTIAL, start("status500")))
    await clock.wait_for_sleep()
    sending.cancel()
    async with asyncio.timeout(2):
        with pytest.raises(asyncio.CancelledError):
            await sending
    assert clock.sleepers == 0
    clock.advance(3600)
    assert len(orchestrator.received) == 1


# --- secrecy --------------------------------------------------------------------------------------------------


async def test_credential_and_body_never_reach_logs_or_details(
    orchestrator: Orchestrator, make_sender: Sender, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sender = await make_sender(timeout_s=0.2, max_attempts=2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    unreachable = await make_sender(origin=f"http://127.0.0.1:{closed_port}", max_attempts=2)
    results = [
        await sender.send("end", CREDENTIAL, end(behaviour))
        for behaviour in ["ok", "status401", "status403", "status400", "status500", "flaky", "redirect302abs", "hang"]
    ]
    results.append(await sender.send("end", CREDENTIAL, end("dropbody")))
    results.append(await sender.send("heartbeat", CREDENTIAL, start("status503")))
    results.append(await unreachable.send("end", CREDENTIAL, end("ok")))
    results.append(await sender.send("end", CREDENTIAL + "\n", end("ok")))

    assert {r.state for r in results} == {"acked", "rejected", "abandoned"}
    assert all(r.authorization == f"Bearer {CREDENTIAL}" for r in orchestrator.received)
    assert any(SECRET_SUMMARY in r.body.decode() for r in orchestrator.received)
    assert caplog.records, "the sender logs what happened to each callback"
    for secret in (CREDENTIAL, SECRET_SUMMARY):
        assert secret not in caplog.text
        assert all(secret not in r.detail for r in results)
        assert all(secret not in repr(r) for r in results)

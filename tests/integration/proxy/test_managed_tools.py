"""Managed tools through the proxy: the model's calls are dispatched with the proxy's bearer, the worker never
sees the bearer or the intermediate round, calls outside the allowlist are refused and audited, and nothing is
dispatched after revocation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from clawstack.llm import LLMStreamError
from clawstack.proxy.identities import ChainEntry

from .conftest import KEYS, StackFactory
from .test_worker_api import _ticket_tools


class TicketService:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, Any]] = []
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.block = False

    def app(self) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            self.calls.append((request.path, request.headers.get("Authorization"), await request.json()))
            if self.block:
                self.started.set()
                await self.release.wait()
            return web.json_response({"ticket": 42, "status": "open", "title": "Printer on fire"})

        app = web.Application()
        app.router.add_post("/tools/get_ticket", handle)
        app.router.add_post("/tools/close_ticket", handle)
        return app


@pytest.fixture
async def tickets() -> AsyncIterator[tuple[TicketService, str]]:
    service = TicketService()
    runner = web.AppRunner(service.app())
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield service, f"http://127.0.0.1:{runner.addresses[0][1]}"
    service.release.set()
    await runner.cleanup()


CHAIN = [ChainEntry("primary", "openai/gpt-test")]
ASK = (
    'Summarize ticket 42\n@fake tool-call: ticket-api__get_ticket {"id": 42}\n'
    "@fake reply: Ticket 42 is open: the printer is on fire."
)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_proxy_runs_the_tool_round(make_stack: StackFactory, tickets: Any, stream: bool) -> None:
    service, url = tickets
    stack = await make_stack(config_extra={"tools": _ticket_tools(url)})
    ident, secret = await stack.identity(chain=CHAIN, tools=["ticket-api.get_ticket"])
    async with stack.worker(ident, secret) as client:
        if stream:
            async with client.stream_chat_completion(
                model="primary", messages=[{"role": "user", "content": ASK}]
            ) as chat:
                done = await chat.final_completion()
        else:
            done = await client.chat_completion(model="primary", messages=[{"role": "user", "content": ASK}])
    assert done.content == "Ticket 42 is open: the printer is on fire."
    assert done.tool_calls == ()  # the worker never sees the managed round
    assert service.calls == [("/tools/get_ticket", f"Bearer {KEYS['TICKET_TOKEN']}", {"id": 42})]
    first, second = stack.primary.requests
    offered = [t["function"]["name"] for t in first.body["tools"]]
    assert offered == ["ticket-api__get_ticket"]  # only the allowlist, not close_ticket
    assert first.body["parallel_tool_calls"] is False
    tool_message = second.body["messages"][-1]
    assert tool_message["role"] == "tool"
    assert json.loads(tool_message["content"])["title"] == "Printer on fire"
    assert KEYS["TICKET_TOKEN"] not in json.dumps(second.body)


async def test_a_tool_outside_the_allowlist_is_refused_and_audited(make_stack: StackFactory, tickets: Any) -> None:
    service, url = tickets
    stack = await make_stack(config_extra={"tools": _ticket_tools(url)})
    ident, secret = await stack.identity(chain=CHAIN, tools=["ticket-api.get_ticket"])
    ask = 'Close it\n@fake tool-call: ticket-api__close_ticket {"id": 42}\n@fake reply: I could not.'
    async with stack.worker(ident, secret) as client:
        done = await client.chat_completion(model="primary", messages=[{"role": "user", "content": ask}])
    assert done.content == "I could not."
    assert service.calls == []
    result = json.loads(stack.primary.requests[1].body["messages"][-1]["content"])
    assert result["error"] == "tool_not_allowed"
    audit = [json.loads(line) for line in (stack.base / "state" / "audit.jsonl").read_text().splitlines()]
    assert audit[-1] | {"at": None} == {
        "at": None,
        "event": "tool_refused",
        "identity": ident,
        "tool": "ticket-api.close_ticket",
        "reason": "tool_not_allowed",
    }


async def test_nothing_is_dispatched_after_revocation(make_stack: StackFactory, tickets: Any) -> None:
    service, url = tickets
    stack = await make_stack(config_extra={"tools": _ticket_tools(url)})
    ident, secret = await stack.identity(chain=CHAIN, tools=["ticket-api.get_ticket"])
    two_calls = (
        'go\n@fake tool-call: ticket-api__get_ticket {"id": 1}\n'
        '@fake tool-call: ticket-api__get_ticket {"id": 2}\n@fake reply: done'
    )
    service.block = True
    async with (
        stack.worker(ident, secret) as client,
        client.stream_chat_completion(model="primary", messages=[{"role": "user", "content": two_calls}]) as chat,
    ):
        pending = asyncio.ensure_future(chat.final_completion())
        await service.started.wait()  # the first dispatch is at the service
        await stack.operator.revoke(ident)
        service.release.set()
        with pytest.raises(LLMStreamError) as info:
            await pending
    assert info.value.error_code == "identity_revoked"
    assert [call[2] for call in service.calls] == [{"id": 1}]  # the second call was never dispatched
    audit = [json.loads(line) for line in (stack.base / "state" / "audit.jsonl").read_text().splitlines()]
    assert [entry["event"] for entry in audit] == ["tool_admitted"]


async def test_the_tool_loop_is_bounded(make_stack: StackFactory, tickets: Any) -> None:
    from clawstack.llm import LLMHTTPError
    from clawstack.llm.fake import parse_script

    _, url = tickets
    loop_step = {"tool_calls": [{"name": "ticket-api__get_ticket", "arguments": {"id": 1}}]}
    stack = await make_stack(
        primary_script=parse_script([loop_step] * 3),
        config_extra={"tools": _ticket_tools(url), "routing": {"max_tool_rounds": 3}},
    )
    ident, secret = await stack.identity(chain=CHAIN, tools=["ticket-api.get_ticket"])
    async with stack.worker(ident, secret) as client:
        with pytest.raises(LLMHTTPError) as info:
            await client.chat_completion(model="primary", messages=[{"role": "user", "content": "x"}])
    assert info.value.error_code == "tool_rounds_exceeded"

"""The client against a hand-written endpoint that misbehaves in ways the fake does not: streams that end
without [DONE], the wrong content type, error events inside a stream, non-JSON bodies."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from clawstack.llm import LLMClient, LLMProtocolError, LLMServerError, LLMStreamError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CHUNK = b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'


async def _sse(request: web.Request, *parts: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for part in parts:
        await response.write(part)
    await response.write_eof()
    return response


async def no_done(request: web.Request) -> web.StreamResponse:
    return await _sse(request, CHUNK)


async def error_event(request: web.Request) -> web.StreamResponse:
    return await _sse(request, CHUNK, b'data: {"error": {"message": "upstream broke", "type": "server_error"}}\n\n')


async def split_everywhere(request: web.Request) -> web.StreamResponse:
    wire = b": comment\r\n" + CHUNK.replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n"
    return await _sse(request, *(wire[index : index + 1] for index in range(len(wire))))


async def json_instead_of_sse(request: web.Request) -> web.StreamResponse:
    return web.json_response({"choices": []})


async def html_error(request: web.Request) -> web.StreamResponse:
    return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")


async def redirect(request: web.Request) -> web.StreamResponse:
    raise web.HTTPTemporaryRedirect("http://elsewhere.invalid/v1/chat/completions")


async def not_json(request: web.Request) -> web.StreamResponse:
    return web.Response(text="hello", content_type="application/json")


@pytest.fixture
async def endpoint() -> AsyncIterator[Callable[[Handler], Awaitable[LLMClient]]]:
    runners: list[web.AppRunner] = []
    clients: list[LLMClient] = []

    async def serve(handler: Handler) -> LLMClient:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        client = LLMClient(f"http://127.0.0.1:{port}/v1", timeout_s=5)
        clients.append(await client.__aenter__())
        return client

    yield serve
    for client in clients:
        await client.aclose()
    for runner in runners:
        await runner.cleanup()


MESSAGES = [{"role": "user", "content": "hi"}]


async def test_stream_without_done_is_incomplete(endpoint: Callable[[Handler], Awaitable[LLMClient]]) -> None:
    client = await endpoint(no_done)
    contents: list[str | None] = []

    async def read_all() -> None:
        async with client.stream_chat_completion(model="m", messages=MESSAGES) as stream:
            async for chunk in stream:
                contents.append(chunk.content)

    with pytest.raises(LLMProtocolError) as caught:
        await read_all()
    assert contents == ["Hi"]
    assert caught.value.code == "llm_stream_incomplete"


async def test_error_event_in_stream(endpoint: Callable[[Handler], Awaitable[LLMClient]]) -> None:
    client = await endpoint(error_event)
    with pytest.raises(LLMStreamError) as caught:
        async with client.stream_chat_completion(model="m", messages=MESSAGES) as stream:
            await stream.final_completion()
    assert caught.value.error_type == "server_error"
    assert caught.value.retryable


async def test_stream_delivered_one_byte_at_a_time(endpoint: Callable[[Handler], Awaitable[LLMClient]]) -> None:
    client = await endpoint(split_everywhere)
    async with client.stream_chat_completion(model="m", messages=MESSAGES) as stream:
        completion = await stream.final_completion()
    assert completion.content == "Hi"


async def test_stream_answered_with_json(endpoint: Callable[[Handler], Awaitable[LLMClient]]) -> None:
    client = await endpoint(json_instead_of_sse)
    with pytest.raises(LLMProtocolError, match="not 'text/event-stream'"):
        async with client.stream_chat_completion(model="m", messages=MESSAGES):
            pass


async def test_html_error_page(endpoint: Callable[[Handler], Awaitable[LLMClient]]) -> None:
    client = await endpoint(html_error)
    with pytest.raises(LLMServerError) as caught:
        await client.chat_completion(model="m", messages=MESSAGES)
    assert (caught.value.status, caught.value.error_type, caught.value.server_message) == (502, None, None)


async def test_body_that_is_not_json(endpoint: Callable[[Handler], Awaitable[LLMClient]]) -> None:
    client = await endpoint(not_json)
    with pytest.raises(LLMProtocolError, match="response body is not valid JSON"):
        await client.chat_completion(model="m", messages=MESSAGES)


async def test_redirects_are_not_followed(endpoint: Callable[[Handler], Awaitable[LLMClient]]) -> None:
    client = await endpoint(redirect)
    with pytest.raises(LLMProtocolError, match=r"redirect \(HTTP 307\)"):
        await client.chat_completion(model="m", messages=MESSAGES)

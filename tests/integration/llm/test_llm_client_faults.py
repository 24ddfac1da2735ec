"""Faults between the client and the scripted fake: HTTP failures, keys, deadlines, cancellation, dropped and
malformed answers, unreachable endpoints."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from clawstack.llm import (
    ChatCompletionChunk,
    LLMAuthenticationError,
    LLMBadRequestError,
    LLMClient,
    LLMHTTPError,
    LLMPermissionDeniedError,
    LLMProtocolError,
    LLMRateLimitError,
    LLMServerError,
    LLMTimeoutError,
    LLMTransportError,
)
from clawstack.llm.fake import FakeModelServer

WORDS_30 = " ".join(f"w{index}" for index in range(30))


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def collect(
    client: LLMClient, messages: list[dict[str, Any]], into: list[ChatCompletionChunk] | None = None, **kwargs: Any
) -> None:
    """Read a whole stream, keeping its chunks in ``into``."""
    async with client.stream_chat_completion(model="m", messages=messages, **kwargs) as stream:
        async for chunk in stream:
            if into is not None:
                into.append(chunk)


@pytest.mark.parametrize(
    ("status", "cls", "retryable", "retry_after_s", "error_type", "error_code"),
    [
        (400, LLMBadRequestError, False, None, "invalid_request_error", "fake_bad_request"),
        (401, LLMAuthenticationError, False, None, "invalid_request_error", "invalid_api_key"),
        (403, LLMPermissionDeniedError, False, None, "permission_denied", "permission_denied"),
        (429, LLMRateLimitError, True, 1.0, "rate_limit_error", "rate_limit_exceeded"),
        (500, LLMServerError, True, None, "server_error", "internal_server_error"),
        (503, LLMServerError, True, 1.0, "server_error", "service_unavailable"),
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
async def test_failure_status_maps_to_its_error(
    client: LLMClient,
    status: int,
    cls: type[LLMHTTPError],
    retryable: bool,
    retry_after_s: float | None,
    error_type: str,
    error_code: str,
    streaming: bool,
) -> None:
    messages = user(f"Private words.\n@fake fail: {status}")
    with pytest.raises(cls) as caught:
        await (collect(client, messages) if streaming else client.chat_completion(model="m", messages=messages))
    error = caught.value
    assert type(error) is cls
    assert (error.status, error.retryable, error.retry_after_s) == (status, retryable, retry_after_s)
    assert (error.error_type, error.error_code) == (error_type, error_code)
    assert error.server_message == f"The scripted fake model was told to fail with HTTP {status}."
    assert "Private words" not in str(error)


async def test_explicit_retry_after(client: LLMClient) -> None:
    with pytest.raises(LLMRateLimitError) as caught:
        await client.chat_completion(model="m", messages=user("@fake fail: 429\n@fake retry-after-s: 7"))
    assert caught.value.retry_after_s == 7.0


async def test_api_key_required() -> None:
    async with FakeModelServer(api_key="sk-right") as fake:
        async with LLMClient(fake.base_url) as anonymous:
            with pytest.raises(LLMAuthenticationError) as missing:
                await anonymous.chat_completion(model="m", messages=user("hi"))
        async with LLMClient(fake.base_url, api_key="sk-wrong") as wrong:
            with pytest.raises(LLMAuthenticationError) as refused:
                await wrong.list_models()
        async with LLMClient(fake.base_url, api_key="sk-right") as right:
            assert (await right.chat_completion(model="m", messages=user("@fake reply: in"))).content == "in"
    for caught in (missing, refused):
        assert caught.value.status == 401
        assert caught.value.error_code == "invalid_api_key"
        assert caught.value.error_type == "invalid_request_error"
        assert "sk-" not in str(caught.value)
    assert len(fake.requests) == 3


async def test_deadline_on_a_plain_call(client: LLMClient, fake: FakeModelServer) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LLMTimeoutError) as caught:
        await client.chat_completion(model="m", messages=user("@fake delay-ms: 5000"), timeout_s=0.2)
    assert loop.time() - started < 2.0
    assert (caught.value.code, caught.value.kind, caught.value.timeout_s) == ("llm_deadline_exceeded", "deadline", 0.2)
    assert caught.value.retryable
    async with asyncio.timeout(2):
        await fake.wait_for_client_disconnects(1)


async def test_deadline_covers_the_whole_stream(client: LLMClient, fake: FakeModelServer) -> None:
    received: list[ChatCompletionChunk] = []
    messages = user(f"@fake reply: {WORDS_30}\n@fake chunk-delay-ms: 50")
    with pytest.raises(LLMTimeoutError) as caught:
        await collect(client, messages, received, timeout_s=0.4)
    assert caught.value.code == "llm_deadline_exceeded"
    assert 1 <= len(received) < 30
    async with asyncio.timeout(2):
        await fake.wait_for_client_disconnects(1)


async def test_first_byte_timeout_on_a_plain_call(client: LLMClient) -> None:
    with pytest.raises(LLMTimeoutError) as caught:
        await client.chat_completion(
            model="m", messages=user("@fake delay-ms: 5000"), first_byte_timeout_s=0.15, timeout_s=5
        )
    assert (caught.value.code, caught.value.kind) == ("llm_first_byte_timeout", "first_byte")


async def test_first_byte_timeout_on_a_stream_waits_for_the_first_event(client: LLMClient) -> None:
    # The headers come at once; the first event is what is late.
    with pytest.raises(LLMTimeoutError) as caught:
        async with client.stream_chat_completion(
            model="m", messages=user("@fake chunk-delay-ms: 5000"), first_byte_timeout_s=0.15
        ) as stream:
            await stream.final_completion()
    assert caught.value.code == "llm_first_byte_timeout"


async def test_first_byte_timeout_stops_applying_after_the_first_event(client: LLMClient) -> None:
    async with client.stream_chat_completion(
        model="m", messages=user("@fake reply: a b c d e\n@fake chunk-delay-ms: 60"), first_byte_timeout_s=0.25
    ) as stream:
        completion = await stream.final_completion()
    assert completion.content == "a b c d e"


async def test_client_default_deadline_and_per_call_override(fake: FakeModelServer) -> None:
    async with LLMClient(fake.base_url, timeout_s=0.15) as client:
        with pytest.raises(LLMTimeoutError):
            await client.chat_completion(model="m", messages=user("@fake delay-ms: 400"))
        completion = await client.chat_completion(
            model="m", messages=user("@fake reply: late\n@fake delay-ms: 400"), timeout_s=None
        )
    assert completion.content == "late"


async def test_cancelling_a_stream_closes_the_connection_promptly(client: LLMClient, fake: FakeModelServer) -> None:
    first_chunk = asyncio.Event()

    async def consume() -> None:
        async with client.stream_chat_completion(
            model="m", messages=user(f"@fake reply: {WORDS_30}\n@fake chunk-delay-ms: 100")
        ) as stream:
            async for _ in stream:
                first_chunk.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(5):
        await first_chunk.wait()
    loop = asyncio.get_running_loop()
    started = loop.time()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(1):
        await fake.wait_for_client_disconnects(1)
    assert loop.time() - started < 1.0


async def test_cancelling_a_plain_call_closes_the_connection(client: LLMClient, fake: FakeModelServer) -> None:
    task = asyncio.create_task(client.chat_completion(model="m", messages=user("@fake delay-ms: 10000")))
    async with asyncio.timeout(5):
        await fake.wait_for_requests(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(1):
        await fake.wait_for_client_disconnects(1)


async def test_stream_dropped_mid_way(client: LLMClient) -> None:
    received: list[ChatCompletionChunk] = []
    messages = user("@fake reply: one two three four\n@fake drop-after-chunks: 3")
    with pytest.raises(LLMTransportError) as caught:
        await collect(client, messages, received)
    assert [chunk.content for chunk in received] == ["", "one ", "two "]
    assert caught.value.code == "llm_transport_error"
    assert caught.value.retryable


async def test_stream_dropped_before_done(client: LLMClient) -> None:
    with pytest.raises((LLMTransportError, LLMProtocolError)):
        async with client.stream_chat_completion(
            model="m", messages=user("@fake reply: all of it\n@fake drop-after-chunks: 1000")
        ) as stream:
            await stream.final_completion()


async def test_plain_call_dropped(client: LLMClient) -> None:
    with pytest.raises(LLMTransportError):
        await client.chat_completion(model="m", messages=user("@fake drop-after-chunks: 0"))
    completion = await client.chat_completion(model="m", messages=user("@fake reply: still fine"))
    assert completion.content == "still fine"


async def test_malformed_plain_answer(client: LLMClient) -> None:
    with pytest.raises(LLMProtocolError) as caught:
        await client.chat_completion(model="m", messages=user("@fake malformed"))
    assert caught.value.code == "llm_protocol_error"


async def test_malformed_stream(client: LLMClient) -> None:
    received: list[ChatCompletionChunk] = []
    with pytest.raises(LLMProtocolError):
        await collect(client, user("@fake malformed"), received)
    assert [chunk.role for chunk in received] == ["assistant"]


async def test_malformed_directive_is_a_bad_request(client: LLMClient) -> None:
    with pytest.raises(LLMBadRequestError) as caught:
        await client.chat_completion(model="m", messages=user("Private words\n@fake reply"))
    assert caught.value.error_code == "fake_directive_invalid"
    assert caught.value.server_message == "@fake directive on line 2: 'reply' needs a value after ':'"
    assert "Private" not in str(caught.value)


async def test_connection_refused() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with LLMClient(f"http://127.0.0.1:{port}/v1") as client:
        with pytest.raises(LLMTransportError) as caught:
            await client.chat_completion(model="m", messages=user("hi"))
    assert caught.value.code == "llm_connect_failed"
    assert isinstance(caught.value.__cause__, Exception)


async def test_missing_unix_socket(socket_path: Path) -> None:
    async with LLMClient("http://localhost/v1", unix_socket=socket_path) as client:
        with pytest.raises(LLMTransportError) as caught:
            async with client.stream_chat_completion(model="m", messages=user("hi")):
                pass
    assert caught.value.code == "llm_connect_failed"
    assert str(socket_path) in caught.value.message

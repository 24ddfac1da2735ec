"""The async OpenAI-compatible client: ``POST {base_url}/chat/completions`` and ``GET {base_url}/models``.

One :class:`LLMClient` owns one aiohttp session, over TCP or a Unix socket::

    async with LLMClient("http://127.0.0.1:8080/v1", api_key=key) as client:
        completion = await client.chat_completion(model="m", messages=[{"role": "user", "content": "Hi"}])
        async with client.stream_chat_completion(model="m", messages=messages) as stream:
            async for chunk in stream:
                print(chunk.content or "", end="")
            completion = await stream.final_completion()

Deadlines: ``timeout_s`` bounds the whole call, for a stream from the request until its last event;
``first_byte_timeout_s`` bounds the wait for the response headers and, for a stream, its first event. Both are
client defaults that each call may override; ``None`` means no limit and :data:`UNSET` means the client default.
Cancelling the calling task closes the connection at once.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Literal, Self

import aiohttp
from yarl import URL

from clawstack import __version__
from clawstack.llm._parse import loads_json_object, parse_chunk, parse_completion, parse_models
from clawstack.llm._translate import deadline_scope, http_error, map_aiohttp_errors
from clawstack.llm.accumulate import CompletionAccumulator
from clawstack.llm.errors import LLMProtocolError
from clawstack.llm.sse import ServerSentEvent, SSEDecoder
from clawstack.llm.types import (
    REASONING_EFFORTS,
    ChatCompletion,
    ChatCompletionChunk,
    Messages,
    ModelInfo,
    ReasoningEffort,
)


class _Unset(enum.Enum):
    UNSET = "UNSET"


UNSET: Final = _Unset.UNSET
"""Sentinel for "use the client's default", where ``None`` already means "no limit"."""

Timeout = float | None | Literal[_Unset.UNSET]

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
_RESERVED_FIELDS = frozenset(
    {"model", "messages", "stream", "stream_options", "tools", "tool_choice", "reasoning_effort"}
)


def _check_timeout(name: str, value: float | None) -> float | None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None")
    return value


class LLMClient:
    """An OpenAI-compatible chat-completions client over TCP or, with ``unix_socket``, a Unix socket.

    ``base_url`` is the API root, e.g. ``http://127.0.0.1:8080/v1``; with ``unix_socket`` its host is ignored
    and only its path is used. ``api_key`` is sent as ``Authorization: Bearer``. Use it as an async context
    manager; the session it opens is closed on exit.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        unix_socket: str | os.PathLike[str] | None = None,
        timeout_s: float | None = 600.0,
        first_byte_timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        url = URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("base_url must be an absolute http:// or https:// URL")
        self._base_url = str(url).rstrip("/")
        display = str(url.with_user(None).with_password(None).with_query(None)).rstrip("/")
        self._unix_socket = None if unix_socket is None else os.fspath(unix_socket)
        self._endpoint = display if self._unix_socket is None else f"{display} (unix:{self._unix_socket})"
        self._api_key = api_key
        self._timeout_s = _check_timeout("timeout_s", timeout_s)
        self._first_byte_timeout_s = _check_timeout("first_byte_timeout_s", first_byte_timeout_s)
        self._headers = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"LLMClient({self._endpoint!r})"

    @property
    def endpoint(self) -> str:
        """The base URL (and socket) this client talks to, safe to show: no credentials in it."""
        return self._endpoint

    async def __aenter__(self) -> Self:
        if self._session is not None:
            raise RuntimeError("this LLMClient is already open")
        connector: aiohttp.BaseConnector = (
            aiohttp.TCPConnector() if self._unix_socket is None else aiohttp.UnixConnector(self._unix_socket)
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), trust_env=False
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session and its connections. Idempotent."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def chat_completion(
        self,
        *,
        model: str,
        messages: Messages,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        reasoning_effort: ReasoningEffort | None = None,
        extra: Mapping[str, Any] | None = None,
        timeout_s: Timeout = UNSET,
        first_byte_timeout_s: Timeout = UNSET,
    ) -> ChatCompletion:
        """Send a chat completion request and return the finished completion.

        ``extra`` fields are added to the request body verbatim (``temperature``, ``max_tokens``, a provider
        object...); they may not repeat a field this method sets. ``reasoning_effort`` is omitted when ``None``.
        """
        body = _request_body(model, messages, tools, tool_choice, reasoning_effort, extra, stream=False)
        limits = self._limits(timeout_s, first_byte_timeout_s)
        loop = asyncio.get_running_loop()
        deadline, first_byte = _deadlines(loop.time(), limits)
        async with deadline_scope(self._endpoint, deadline, "deadline", limits[0]):
            async with deadline_scope(self._endpoint, first_byte, "first_byte", limits[1]):
                response = await self._send("POST", "/chat/completions", body, "application/json")
            data = await _read_body(response, self._endpoint)
        return parse_completion(loads_json_object(data, "response body"))

    def stream_chat_completion(
        self,
        *,
        model: str,
        messages: Messages,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        reasoning_effort: ReasoningEffort | None = None,
        extra: Mapping[str, Any] | None = None,
        include_usage: bool = True,
        timeout_s: Timeout = UNSET,
        first_byte_timeout_s: Timeout = UNSET,
    ) -> ChatStream:
        """Prepare a streaming chat completion; the request is sent on entering the returned context.

        The body carries ``stream: true`` and, with ``include_usage``, ``stream_options.include_usage``.
        """
        body = _request_body(model, messages, tools, tool_choice, reasoning_effort, extra, stream=True)
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        return ChatStream(self, body, self._limits(timeout_s, first_byte_timeout_s))

    async def list_models(self, *, timeout_s: Timeout = UNSET) -> tuple[ModelInfo, ...]:
        """``GET /models``: the models the endpoint offers."""
        limits = self._limits(timeout_s, None)
        deadline, _ = _deadlines(asyncio.get_running_loop().time(), limits)
        async with deadline_scope(self._endpoint, deadline, "deadline", limits[0]):
            response = await self._send("GET", "/models", None, "application/json")
            data = await _read_body(response, self._endpoint)
        return parse_models(loads_json_object(data, "response body"))

    def _limits(self, timeout_s: Timeout, first_byte_timeout_s: Timeout) -> tuple[float | None, float | None]:
        overall = self._timeout_s if timeout_s is UNSET else _check_timeout("timeout_s", timeout_s)
        first = (
            self._first_byte_timeout_s
            if first_byte_timeout_s is UNSET
            else _check_timeout("first_byte_timeout_s", first_byte_timeout_s)
        )
        return overall, first

    async def _send(
        self, method: str, path: str, body: Mapping[str, Any] | None, accept: str
    ) -> aiohttp.ClientResponse:
        """Send one request; return the response once its headers arrived with a 2xx status.

        Redirects are not followed: a POST must not be replayed elsewhere, with its key, behind the caller's back.
        """
        if self._session is None:
            raise RuntimeError("use the LLMClient as an async context manager: `async with LLMClient(...)`")
        headers = {"User-Agent": f"clawstack/{__version__}", **self._headers, "Accept": accept}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        with map_aiohttp_errors(self._endpoint):
            response = await self._session.request(
                method, self._base_url + path, data=data, headers=headers, allow_redirects=False
            )
        if response.status < 300:
            return response
        if response.status < 400:
            response.close()
            raise LLMProtocolError(
                f"the model endpoint {self._endpoint} answered with a redirect (HTTP {response.status}); "
                "configure the final URL as base_url"
            )
        error_body = bytearray()
        try:
            while len(error_body) < MAX_ERROR_BODY_BYTES:
                piece = await response.content.read(MAX_ERROR_BODY_BYTES - len(error_body))
                if not piece:
                    break
                error_body += piece
        except aiohttp.ClientError:
            pass  # The status alone still says what happened; a partial body only loses the details.
        finally:
            response.close()
        raise http_error(response.status, response.headers, bytes(error_body), self._endpoint)


class ChatStream:
    """A streaming chat completion: an async context manager and an async iterator of chunks.

    Iterating yields :class:`ChatCompletionChunk` values until the endpoint's ``data: [DONE]``;
    :meth:`final_completion` reads whatever is left and returns the assembled :class:`ChatCompletion`.
    A stream that ends without ``[DONE]`` raises :class:`LLMProtocolError` (``llm_stream_incomplete``); a
    connection that breaks raises :class:`LLMTransportError`. Leaving the context closes the connection.
    """

    def __init__(self, client: LLMClient, body: dict[str, Any], limits: tuple[float | None, float | None]) -> None:
        self._client = client
        self._body = body
        self._limits = limits
        self._deadline: float | None = None
        self._first_byte_deadline: float | None = None
        self._response: aiohttp.ClientResponse | None = None
        self._decoder = SSEDecoder()
        self._events: deque[ServerSentEvent] = deque()
        self._accumulator = CompletionAccumulator()
        self._started = False
        self._got_event = False
        self._done = False
        self._closed = False

    async def __aenter__(self) -> Self:
        if self._started:
            raise RuntimeError("a ChatStream can be entered only once")
        self._started = True
        endpoint = self._client.endpoint
        self._deadline, self._first_byte_deadline = _deadlines(asyncio.get_running_loop().time(), self._limits)
        async with (
            deadline_scope(endpoint, self._deadline, "deadline", self._limits[0]),
            deadline_scope(endpoint, self._first_byte_deadline, "first_byte", self._limits[1]),
        ):
            response = await self._client._send("POST", "/chat/completions", self._body, "text/event-stream")
        if response.content_type != "text/event-stream":
            response.close()
            raise LLMProtocolError(
                f"the model endpoint {endpoint} answered a stream request with {response.content_type!r}, "
                "not 'text/event-stream'"
            )
        self._response = response
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection. Idempotent; a stream read to ``[DONE]`` releases it for reuse instead."""
        response, self._response = self._response, None
        self._closed = True
        if response is not None:
            if self._done:
                response.release()
            else:
                response.close()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ChatCompletionChunk:
        if self._done:
            raise StopAsyncIteration
        if self._response is None:
            raise RuntimeError("the stream is not open: use `async with client.stream_chat_completion(...)`")
        try:
            while not self._events:
                await self._receive(self._response)
            event = self._events.popleft()
            chunk = None if event.data == "[DONE]" else parse_chunk(loads_json_object(event.data, "SSE event data"))
        except BaseException:
            # Best-effort shutdown: a failed or cancelled read leaves the stream unusable, so drop the
            # connection now rather than when the caller leaves the context.
            self.close()
            raise
        if chunk is None:
            self._done = True
            self.close()
            raise StopAsyncIteration
        self._accumulator.add(chunk)
        return chunk

    async def final_completion(self) -> ChatCompletion:
        """Read the rest of the stream and return the completion assembled from all of its chunks."""
        async for _ in self:
            pass
        return self._accumulator.completion()

    async def _receive(self, response: aiohttp.ClientResponse) -> None:
        """Read more of the body into the event queue, within the deadlines."""
        endpoint = self._client.endpoint
        first_byte = None if self._got_event else self._first_byte_deadline
        async with (
            deadline_scope(endpoint, self._deadline, "deadline", self._limits[0]),
            deadline_scope(endpoint, first_byte, "first_byte", self._limits[1]),
        ):
            with map_aiohttp_errors(endpoint):
                data = await response.content.readany()
        if not data:
            raise LLMProtocolError(
                f"the stream from the model endpoint {endpoint} ended before 'data: [DONE]'",
                code="llm_stream_incomplete",
            )
        events = self._decoder.feed(data)
        self._got_event = self._got_event or bool(events)
        self._events.extend(events)


def _request_body(
    model: str,
    messages: Messages,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    reasoning_effort: ReasoningEffort | None,
    extra: Mapping[str, Any] | None,
    *,
    stream: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [dict(message) for message in messages]}
    if stream:
        body["stream"] = True
    if tools is not None:
        body["tools"] = [dict(tool) for tool in tools]
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    if reasoning_effort is not None:
        if reasoning_effort not in REASONING_EFFORTS:
            raise ValueError(f"reasoning_effort must be one of {sorted(REASONING_EFFORTS)}")
        body["reasoning_effort"] = reasoning_effort
    for key, value in (extra or {}).items():
        if key in _RESERVED_FIELDS:
            raise ValueError(f"extra field {key!r} is set by the client; use its parameter instead")
        body[key] = value
    return body


def _deadlines(now: float, limits: tuple[float | None, float | None]) -> tuple[float | None, float | None]:
    overall, first_byte = limits
    return (
        None if overall is None else now + overall,
        None if first_byte is None else now + first_byte,
    )


async def _read_body(response: aiohttp.ClientResponse, endpoint: str) -> bytes:
    """Read a whole response body (bounded), then release the connection; close it on any failure."""
    buffer = bytearray()
    try:
        with map_aiohttp_errors(endpoint):
            async for piece in response.content.iter_any():
                buffer += piece
                if len(buffer) > MAX_BODY_BYTES:
                    raise LLMProtocolError(
                        f"the response from the model endpoint {endpoint} exceeds {MAX_BODY_BYTES} bytes"
                    )
    except BaseException:
        # Best-effort shutdown: an unread or cancelled body must not go back to the pool.
        response.close()
        raise
    response.release()
    return bytes(buffer)

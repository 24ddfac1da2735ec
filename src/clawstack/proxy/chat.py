"""One worker chat completion, end to end: per-slot options, chain routing, managed tool rounds, streaming.

The worker's body is forwarded with the model replaced by the chain entry's upstream model, ``reasoning_effort``
set for a slot that declares one and removed otherwise, and, for ``openrouter/`` slots, the ``provider`` object
built from the slot's preferences plus the zero-retention and no-data-collection controls the data policy asks for.

Managed tools: the identity's allowlisted tools are appended to the worker's tools (with
``parallel_tool_calls: false`` unless the worker chose). When the model calls managed tools, the proxy dispatches
them, appends the results and asks again, up to ``max_tool_rounds``; the worker sees only the final answer (and,
when streaming, the text of every round). A response that mixes managed and worker tools is treated as a managed
round: the worker's calls are dropped so the conversation stays consistent, and the model asks for them again.
A call of a managed tool outside the allowlist is refused and recorded; the model gets an error result.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from clawstack.llm.sse import SSEDecoder
from clawstack.models.policy import DataPolicy
from clawstack.proxy.config import Routing
from clawstack.proxy.errors import RequestError, UpstreamError
from clawstack.proxy.identities import ChainEntry, Identity
from clawstack.proxy.providers import Route
from clawstack.proxy.routing import Attempt, ChainRouter, Committed
from clawstack.proxy.tool_dispatch import ToolOutcome
from clawstack.proxy.tools import ToolCatalog

log = logging.getLogger(__name__)

_PREFERENCE_KEYS = frozenset({"only", "allow_fallbacks", "require_parameters", "zdr", "data_collection"})


class Recorder(Protocol):
    """Where the flow reports what happened (the service: journal, served_by, audit)."""

    def attempt(self, identity: Identity, attempt: Attempt, response_sha256: str | None) -> None: ...

    def served(self, identity: Identity, committed: Committed, response_sha256: str, ok: bool) -> None: ...

    async def dispatch(self, identity: Identity, function_name: str, arguments: str) -> ToolOutcome: ...


def policy_preferences(policy: DataPolicy) -> dict[str, Any]:
    """The OpenRouter controls the data policy sets on every request: zero data retention when the policy allows
    no retention, ``data_collection: deny`` when it allows no training."""
    out: dict[str, Any] = {}
    if policy.enforces_zero_retention():
        out["zdr"] = True
    if policy.enforces_no_training():
        out["data_collection"] = "deny"
    return out


def provider_object(slot: Mapping[str, Any] | None, requested: Any, policy: DataPolicy) -> dict[str, Any]:
    """The OpenRouter ``provider`` object: the slot's preferences, narrowed further by the worker, plus policy.

    Raises :class:`RequestError` (``data_policy_violation``) for a worker preference that would weaken the slot
    or the proxy's data policy, and for any key other than the five narrowing ones.
    """
    merged: dict[str, Any] = {**(slot or {}), **policy_preferences(policy)}
    if requested is None:
        return merged
    if not isinstance(requested, dict):
        raise RequestError("provider must be an object", code="data_policy_violation")
    for key, value in requested.items():
        if key not in _PREFERENCE_KEYS:
            raise RequestError(f"provider preference {key!r} is not accepted", code="data_policy_violation")
        narrowing = {
            "zdr": value is True,
            "require_parameters": value is True,
            "allow_fallbacks": value is False,
            "data_collection": value == "deny",
            "only": isinstance(value, list)
            and bool(value)
            and all(isinstance(v, str) and v for v in value)
            and ("only" not in merged or set(value) <= set(merged["only"])),
        }[key]
        if not narrowing:
            raise RequestError(f"provider preference {key!r} would weaken routing policy", code="data_policy_violation")
        merged[key] = value
    return merged


@dataclass(slots=True)
class _Round:
    """What one streamed round produced."""

    managed: dict[int, dict[str, str]] = field(default_factory=dict)
    native: list[dict[str, Any]] = field(default_factory=list)  # worker tool-call chunks, held to the round's end
    usage: dict[str, int] = field(default_factory=dict)
    finish: dict[str, Any] | None = None
    done: bool = False


def _add_usage(total: dict[str, int], usage: Any) -> None:
    if isinstance(usage, dict):
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value


class ChatFlow:
    """Runs worker requests through the chain and the managed-tool loop."""

    def __init__(
        self, router: ChainRouter, catalog: ToolCatalog, routing: Routing, recorder: Recorder, policy: DataPolicy
    ) -> None:
        self._router = router
        self._policy = policy
        self._catalog = catalog
        self._routing = routing
        self._recorder = recorder

    def _builder(
        self, body: Mapping[str, Any], messages: list[Any], managed_tools: list[dict[str, Any]]
    ) -> Callable[[ChainEntry, Route], dict[str, Any]]:
        def build(entry: ChainEntry, route: Route) -> dict[str, Any]:
            out = {k: v for k, v in body.items() if k not in ("model", "reasoning_effort", "provider", "messages")}
            out["model"] = route.model
            out["messages"] = messages
            if entry.reasoning_effort is not None:
                out["reasoning_effort"] = entry.reasoning_effort
            if route.prefix == "openrouter":
                provider = provider_object(entry.provider_preferences, body.get("provider"), self._policy)
                if provider:
                    out["provider"] = provider
            if managed_tools:
                out["tools"] = [*(body.get("tools") or []), *managed_tools]
                out.setdefault("parallel_tool_calls", False)
            return out

        return build

    async def _send(
        self,
        identity: Identity,
        entries: list[ChainEntry],
        build: Callable[[ChainEntry, Route], dict[str, Any]],
        *,
        stream: bool,
    ) -> Committed:
        return await self._router.send(
            entries, build, stream=stream, on_attempt=lambda a: self._recorder.attempt(identity, a, None)
        )

    async def _run_tools(self, identity: Identity, calls: list[dict[str, str]], messages: list[Any]) -> None:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls
                ],
            }
        )
        for call in calls:
            outcome = await self._recorder.dispatch(identity, call["name"], call["arguments"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": outcome.content})

    # ------------------------------------------------------------------------------------------- non-streaming

    async def complete(
        self,
        identity: Identity,
        entries: list[ChainEntry],
        body: Mapping[str, Any],
        managed_tools: list[dict[str, Any]],
    ) -> bytes:
        """The final answer's JSON bytes: the upstream's own when one round answered it, untouched."""
        messages = list(body["messages"])
        build = self._builder(body, messages, managed_tools)
        usage: dict[str, int] = {}
        for rounds in range(self._routing.max_tool_rounds):
            committed = await self._send(identity, entries, build, stream=False)
            committed.response.release()
            digest = "sha256:" + hashlib.sha256(committed.first).hexdigest()
            try:
                data = json.loads(committed.first)
                message = data["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                self._recorder.served(identity, committed, digest, ok=False)
                raise UpstreamError(
                    "the upstream answered with a malformed body", code="upstream_bad_response"
                ) from exc
            self._recorder.served(identity, committed, digest, ok=True)
            _add_usage(usage, data.get("usage"))
            calls = [
                {
                    "id": str(c.get("id", "")),
                    "name": str(c["function"]["name"]),
                    "arguments": str(c["function"].get("arguments") or ""),
                }
                for c in (message.get("tool_calls") or [])
                if isinstance(c, dict) and isinstance(c.get("function"), dict)
            ]
            managed = [c for c in calls if self._catalog.is_managed_name(c["name"])]
            if not managed:
                if rounds == 0:
                    return committed.first
                if usage:
                    data["usage"] = usage
                return json.dumps(data, ensure_ascii=False).encode()
            await self._run_tools(identity, managed, messages)
        raise UpstreamError("the model kept calling tools past the round limit", code="tool_rounds_exceeded")

    # ----------------------------------------------------------------------------------------------- streaming

    async def stream(
        self,
        identity: Identity,
        entries: list[ChainEntry],
        body: Mapping[str, Any],
        managed_tools: list[dict[str, Any]],
        start: Callable[[], Awaitable[Callable[[bytes], Awaitable[None]]]],
    ) -> None:
        """Stream the answer. ``start()`` prepares the worker's response and returns its writer; it is called
        only once an upstream answer has begun, so that a chain that cannot serve is still a plain JSON error."""
        messages = list(body["messages"])
        build = self._builder(body, messages, managed_tools)
        usage: dict[str, int] = {}
        write: Callable[[bytes], Awaitable[None]] | None = None
        for _ in range(self._routing.max_tool_rounds):
            try:
                committed = await self._send(identity, entries, build, stream=True)
            except UpstreamError as exc:
                if write is None:
                    raise
                await write(sse_error(exc.code, exc.message))
                return
            if write is None:
                write = await start()
            if not managed_tools:
                await self._passthrough(identity, committed, write)
                return
            state = await self._filtered(identity, committed, write, usage)
            if not state.done:
                await write(sse_error("upstream_stream_broken", "the upstream stream broke off"))
                return
            if not state.managed:
                for chunk in state.native:
                    await write(_sse(chunk))
                if state.finish is not None:
                    await write(_sse(state.finish))
                if usage:
                    await write(_sse({"id": "usage", "object": "chat.completion.chunk", "choices": [], "usage": usage}))
                await write(b"data: [DONE]\n\n")
                return
            calls = [state.managed[i] for i in sorted(state.managed)]
            await self._run_tools(identity, calls, messages)
        if write is None:
            raise UpstreamError("the model kept calling tools past the round limit", code="tool_rounds_exceeded")
        await write(sse_error("tool_rounds_exceeded", "the model kept calling tools past the round limit"))

    async def _passthrough(
        self, identity: Identity, committed: Committed, write: Callable[[bytes], Awaitable[None]]
    ) -> None:
        hasher = hashlib.sha256(committed.first)
        tail = committed.first[-64:]
        ok = False
        try:
            await write(committed.first)
            while chunk := await committed.next_chunk():
                hasher.update(chunk)
                tail = (tail + chunk)[-64:]
                await write(chunk)
            ok = b"data: [DONE]" in tail
        except (aiohttp.ClientError, OSError):
            ok = False
        finally:
            committed.response.close()
            self._recorder.served(identity, committed, "sha256:" + hasher.hexdigest(), ok=ok)
        if not ok:
            # End whatever event was cut off, then say why the stream stops; nothing is retried.
            await write(b"\n\n" + sse_error("upstream_stream_broken", "the upstream stream broke off"))

    async def _filtered(
        self,
        identity: Identity,
        committed: Committed,
        write: Callable[[bytes], Awaitable[None]],
        usage: dict[str, int],
    ) -> _Round:
        state = _Round()
        hasher = hashlib.sha256()
        decoder = SSEDecoder()
        managed_index: set[int] = set()
        try:
            chunk = committed.first
            while chunk:
                hasher.update(chunk)
                for event in decoder.feed(chunk):
                    if event.data.strip() == "[DONE]":
                        state.done = True
                        continue
                    out = self._filter_event(event.data, state, managed_index, usage)
                    if out is not None:
                        await write(_sse(out))
                chunk = await committed.next_chunk()
        except (aiohttp.ClientError, OSError):
            state.done = False
        finally:
            committed.response.close()
            self._recorder.served(identity, committed, "sha256:" + hasher.hexdigest(), ok=state.done)
        return state

    def _filter_event(
        self, data: str, state: _Round, managed_index: set[int], usage: dict[str, int]
    ) -> dict[str, Any] | None:
        try:
            chunk = json.loads(data)
        except ValueError:
            return None
        if not isinstance(chunk, dict):
            return None
        _add_usage(usage, chunk.pop("usage", None))
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        delta = choice.get("delta") or {}
        kept = []
        for call in delta.get("tool_calls") or []:
            index = call.get("index", 0)
            function = call.get("function") or {}
            name = function.get("name")
            if name and self._catalog.is_managed_name(name):
                managed_index.add(index)
            if index in managed_index:
                entry = state.managed.setdefault(index, {"id": "", "name": "", "arguments": ""})
                entry["id"] = call.get("id") or entry["id"]
                entry["name"] = name or entry["name"]
                entry["arguments"] += function.get("arguments") or ""
            else:
                kept.append(call)
        if "tool_calls" in delta:
            del delta["tool_calls"]
            if kept:
                state.native.append({**chunk, "choices": [{**choice, "delta": {"tool_calls": kept}}]})
        if choice.get("finish_reason") is not None:
            state.finish = chunk
            return None
        if not delta.get("content") and not delta.get("role"):
            return None
        return chunk


def _sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def sse_error(code: str, message: str) -> bytes:
    return _sse({"error": {"message": message, "type": "upstream_error", "code": code}}) + b"data: [DONE]\n\n"


__all__ = ["ChatFlow", "Recorder", "policy_preferences", "provider_object", "sse_error"]

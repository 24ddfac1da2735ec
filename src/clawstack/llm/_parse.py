"""Turn OpenAI-shaped JSON bodies into :mod:`clawstack.llm.types` values, or raise :class:`LLMProtocolError`.

Fields this client does not use are ignored (providers add their own); fields it does use are type-checked.
Error messages name the offending field, never its value, so no message content reaches an error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from clawstack.llm.errors import LLMProtocolError, LLMStreamError
from clawstack.llm.types import ChatCompletion, ChatCompletionChunk, ModelInfo, ToolCall, ToolCallDelta, Usage

_MISSING = object()


def _protocol_error(where: str, problem: str) -> LLMProtocolError:
    return LLMProtocolError(f"malformed response from the model endpoint: {where} {problem}")


def _field(obj: Mapping[str, Any], key: str, where: str) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        raise _protocol_error(f"{where}.{key}", "is missing")
    return value


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _protocol_error(where, "is not an object")
    return value


def _opt_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise _protocol_error(f"{where}.{key}", "is not a string")
    return value


def _int(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(obj, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _protocol_error(f"{where}.{key}", "is not a non-negative integer")
    return value


def loads_json_object(data: bytes | str, where: str) -> Mapping[str, Any]:
    """Decode one JSON object (a response body or an SSE ``data`` payload)."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise _protocol_error(where, "is not valid JSON") from exc
    return _obj(value, where)


def parse_usage(value: Any, where: str) -> Usage | None:
    """``usage`` may be absent or null; when present its three counts must be integers."""
    if value is None:
        return None
    usage = _obj(value, where)
    return Usage(
        prompt_tokens=_int(usage, "prompt_tokens", where),
        completion_tokens=_int(usage, "completion_tokens", where),
        total_tokens=_int(usage, "total_tokens", where),
    )


def _choice_zero(body: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
    choices = body.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list):
        raise _protocol_error(f"{where}.choices", "is not an array")
    for position, choice in enumerate(choices):
        choice = _obj(choice, f"{where}.choices[{position}]")
        if choice.get("index", 0) == 0:
            return choice
    return None


def parse_completion(body: Mapping[str, Any]) -> ChatCompletion:
    """A non-streaming ``chat.completion`` body."""
    choice = _choice_zero(body, "body")
    if choice is None:
        raise _protocol_error("body.choices", "has no choice 0")
    message = _obj(_field(choice, "message", "choices[0]"), "choices[0].message")
    calls: list[ToolCall] = []
    raw_calls = message.get("tool_calls")
    if raw_calls is not None:
        if not isinstance(raw_calls, list):
            raise _protocol_error("choices[0].message.tool_calls", "is not an array")
        for position, raw_call in enumerate(raw_calls):
            where = f"choices[0].message.tool_calls[{position}]"
            call = _obj(raw_call, where)
            function = _obj(_field(call, "function", where), f"{where}.function")
            call_id = _opt_str(call, "id", where)
            name = _opt_str(function, "name", f"{where}.function")
            arguments = _opt_str(function, "arguments", f"{where}.function")
            if call_id is None or name is None:
                raise _protocol_error(where, "lacks an id or a function name")
            calls.append(ToolCall(id=call_id, name=name, arguments=arguments or ""))
    return ChatCompletion(
        id=_opt_str(body, "id", "body") or "",
        model=_opt_str(body, "model", "body") or "",
        content=_opt_str(message, "content", "choices[0].message"),
        tool_calls=tuple(calls),
        finish_reason=_opt_str(choice, "finish_reason", "choices[0]"),
        usage=parse_usage(body.get("usage"), "body.usage"),
        raw=body,
    )


def raise_for_stream_error(body: Mapping[str, Any]) -> None:
    """An ``{"error": {...}}`` event inside a stream becomes :class:`LLMStreamError`."""
    if "error" not in body:
        return
    error = body["error"]
    fields = error if isinstance(error, dict) else {}
    error_type = fields.get("type") if isinstance(fields.get("type"), str) else None
    error_code = fields.get("code") if isinstance(fields.get("code"), str) else None
    server_message = fields.get("message") if isinstance(fields.get("message"), str) else None
    raise LLMStreamError(
        f"the model endpoint reported an error inside the stream (type={error_type}, code={error_code})",
        error_type=error_type,
        error_code=error_code,
        server_message=server_message,
    )


def parse_chunk(body: Mapping[str, Any]) -> ChatCompletionChunk:
    """One ``chat.completion.chunk`` SSE payload."""
    raise_for_stream_error(body)
    choice = _choice_zero(body, "chunk")
    delta: Mapping[str, Any] = {}
    finish_reason = None
    if choice is not None:
        raw_delta = choice.get("delta")
        delta = {} if raw_delta is None else _obj(raw_delta, "chunk.choices[0].delta")
        finish_reason = _opt_str(choice, "finish_reason", "chunk.choices[0]")
    deltas: list[ToolCallDelta] = []
    raw_calls = delta.get("tool_calls")
    if raw_calls is not None:
        if not isinstance(raw_calls, list):
            raise _protocol_error("chunk.delta.tool_calls", "is not an array")
        for position, raw_call in enumerate(raw_calls):
            where = f"chunk.delta.tool_calls[{position}]"
            call = _obj(raw_call, where)
            index = _int(call, "index", where)
            raw_function = call.get("function")
            function = {} if raw_function is None else _obj(raw_function, f"{where}.function")
            deltas.append(
                ToolCallDelta(
                    index=index,
                    id=_opt_str(call, "id", where),
                    name=_opt_str(function, "name", f"{where}.function"),
                    arguments=_opt_str(function, "arguments", f"{where}.function"),
                )
            )
    return ChatCompletionChunk(
        id=_opt_str(body, "id", "chunk") or "",
        model=_opt_str(body, "model", "chunk") or "",
        role=_opt_str(delta, "role", "chunk.delta"),
        content=_opt_str(delta, "content", "chunk.delta"),
        tool_calls=tuple(deltas),
        finish_reason=finish_reason,
        usage=parse_usage(body.get("usage"), "chunk.usage"),
        raw=body,
    )


def parse_models(body: Mapping[str, Any]) -> tuple[ModelInfo, ...]:
    """A ``GET /models`` list body."""
    data = _field(body, "data", "body")
    if not isinstance(data, list):
        raise _protocol_error("body.data", "is not an array")
    models: list[ModelInfo] = []
    for position, raw_model in enumerate(data):
        where = f"body.data[{position}]"
        entry = _obj(raw_model, where)
        model_id = _opt_str(entry, "id", where)
        if model_id is None:
            raise _protocol_error(f"{where}.id", "is missing")
        models.append(ModelInfo(id=model_id, owned_by=_opt_str(entry, "owned_by", where), raw=entry))
    return tuple(models)

"""Translation between OpenAI Chat Completions and the OpenAI Responses API: pure, no I/O.

- :func:`chat_to_responses` turns a ``/chat/completions`` body into a ``/responses`` body: leading system and
  developer messages become ``instructions``, the rest ``input`` items (messages, ``function_call`` /
  ``custom_tool_call`` items for assistant tool calls, ``function_call_output`` / ``custom_tool_call_output`` for
  tool results); tools and ``tool_choice`` are flattened; ``max_tokens`` / ``max_completion_tokens`` become
  ``max_output_tokens``, ``reasoning_effort`` ``reasoning.effort``, ``response_format`` and ``verbosity``
  ``text``; ``temperature``, ``top_p``, ``parallel_tool_calls``, ``stream``, ``user``, ``metadata``, ``store``
  (False when absent: the proxy never asks an upstream to keep a conversation), ``prompt_cache_key``,
  ``safety_identifier`` and ``provider`` (OpenRouter's routing and data controls, which the proxy sets only for
  ``openrouter/`` routes) pass unchanged. :data:`RESPONSES_FIELDS` is every top-level field it can produce. Function tools without ``strict`` get
  ``strict: false``, Chat's default (Responses would otherwise make them strict).
- :func:`responses_to_chat` turns a finished Responses object into a ``chat.completion``; reasoning items are
  dropped.
- :class:`ResponsesStreamTranslator` turns a Responses event stream into ``chat.completion.chunk`` SSE, ending
  with a finish chunk, a usage chunk and ``data: [DONE]``.
- :func:`rejects_max_tokens` and :func:`rejected_sampling_parameter` read an upstream 400 that refuses a parameter.

Dropped from requests, having no Responses counterpart: ``stop``, ``stream_options`` (usage is always
reported), ``seed``, ``logprobs``, ``top_logprobs``, ``logit_bias``, ``frequency_penalty``, ``presence_penalty``,
``n`` (only 1 is accepted) and every field not named above (``modalities``, ``prediction``, ...). A ``file``
part forwards only ``file_data`` and ``filename``.
Legacy ``functions`` / ``function_call`` are refused. Malformed input raises :class:`ValueError` whose message
names the field and never repeats its content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from clawstack.llm.errors import LLMProtocolError
from clawstack.llm.sse import SSEDecoder

__all__ = [
    "RESPONSES_FIELDS",
    "ResponsesStreamTranslator",
    "chat_to_responses",
    "rejected_sampling_parameter",
    "rejects_max_tokens",
    "responses_to_chat",
]

_PASSED: Final = ("temperature", "top_p", "parallel_tool_calls", "stream", "user", "metadata", "store")
_PASSED_KEYS: Final = ("prompt_cache_key", "safety_identifier", "provider")
RESPONSES_FIELDS: Final = frozenset(
    {"model", "instructions", "input", "tools", "tool_choice", "max_output_tokens", "reasoning", "text"}
    | {*_PASSED, *_PASSED_KEYS}
)
# A Chat tool-call type -> the Responses item type for its call, and the field that holds the call's text.
_CALL_KINDS: Final = {"function": ("function_call", "arguments"), "custom": ("custom_tool_call", "input")}
_ITEM_KINDS: Final = {item: (kind, text) for kind, (item, text) in _CALL_KINDS.items()}
_EMPTY_PARAMETERS: Final[Mapping[str, Any]] = {"type": "object", "properties": {}}
_FINISHED: Final = ("completed", "incomplete")
_SAMPLING: Final = frozenset({"temperature", "top_p"})
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.:-]")
_MAX_TOKENS_MESSAGE: Final = re.compile(
    r"unsupported parameter\W+max_tokens\b|\bmax_tokens\W+(?:is )?not supported", re.IGNORECASE
)


def chat_to_responses(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses request for a Chat Completions request body (see the module docstring for the mapping)."""
    if not isinstance(body, Mapping):
        raise ValueError("the request body must be an object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("model must be a non-empty string")
    for legacy in ("functions", "function_call"):
        if legacy in body:
            raise ValueError(f"{legacy} is not supported; send tools")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise ValueError("n must be 1 or absent")
    out: dict[str, Any] = {"model": model}
    instructions, items = _input(body.get("messages"))
    if instructions is not None:
        out["instructions"] = instructions
    out["input"] = items
    out.update({key: body[key] for key in (*_PASSED, *_PASSED_KEYS) if key in body})
    out.setdefault("store", False)
    if body.get("tools") is not None:
        tools = body["tools"]
        if not isinstance(tools, list):
            raise ValueError("tools must be a list")
        out["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    limit = next((body[key] for key in ("max_completion_tokens", "max_tokens") if body.get(key) is not None), None)
    if limit is not None:
        if type(limit) is not int or limit < 1:
            raise ValueError("max_tokens / max_completion_tokens must be a positive integer")
        out["max_output_tokens"] = limit
    if body.get("reasoning_effort") is not None:
        if not isinstance(body["reasoning_effort"], str):
            raise ValueError("reasoning_effort must be a string")
        out["reasoning"] = {"effort": body["reasoning_effort"]}
    text: dict[str, Any] = {}
    if body.get("response_format") is not None:
        text["format"] = _text_format(body["response_format"])
    if body.get("verbosity") is not None:
        text["verbosity"] = body["verbosity"]
    if text:
        out["text"] = text
    return out


def _input(messages: Any) -> tuple[str | None, list[dict[str, Any]]]:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    custom_calls: set[str] = set()  # a custom call's result is a custom_tool_call_output, not a function's
    leading = True
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ValueError(f"{where} must be an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise ValueError(f"{where}.role must be a string")
        if role in ("system", "developer"):
            text = _text(message.get("content"), f"{where}.content")
            if leading:
                instructions.append(text)
            else:
                items.append(_message("developer", [{"type": "input_text", "text": text}]))
            continue
        leading = False
        if role == "user":
            items.append(_message("user", _user_parts(message.get("content"), f"{where}.content")))
        elif role == "assistant":
            items.extend(_assistant_items(message, where, custom_calls))
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ValueError(f"{where}.tool_call_id must be a non-empty string")
            kind = "custom_tool_call_output" if call_id in custom_calls else "function_call_output"
            output = _text(message.get("content"), f"{where}.content")
            items.append({"type": kind, "call_id": call_id, "output": output})
        else:
            raise ValueError(f"{where}.role must be system, developer, user, assistant or tool")
    return ("\n\n".join(instructions) if instructions else None), items


def _message(role: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


def _text(content: Any, where: str) -> str:
    """A string, or the concatenated text of a list of ``text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a string or a list of text parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        if _type_of(part) != "text":
            raise ValueError(f"{where}[{j}] must be a text part")
        texts.append(_string(part.get("text"), f"{where}[{j}].text"))
    return "".join(texts)


def _user_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise ValueError(f"{where} must be a string or a list of content parts")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = _type_of(part)
        if kind == "text":
            parts.append({"type": "input_text", "text": _string(part.get("text"), f"{at}.text")})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            detail = image.get("detail", "auto") if isinstance(image, Mapping) else "auto"
            parts.append({"type": "input_image", "image_url": _string(url, f"{at}.image_url.url"), "detail": detail})
        elif kind == "file":
            file = _mapping(part.get("file"), f"{at}.file")
            parts.append({"type": "input_file", **_present(file, "file_data", "filename")})
        else:
            raise ValueError(f"{at} must be a text, image_url or file part")
    return parts


def _assistant_items(message: Mapping[str, Any], where: str, custom_calls: set[str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str):
        if content:
            parts.append({"type": "output_text", "text": content})
    elif isinstance(content, list):
        for j, part in enumerate(content):
            kind = _type_of(part)
            if kind == "text":
                parts.append({"type": "output_text", "text": _string(part.get("text"), f"{where}.content[{j}].text")})
            elif kind == "refusal":
                refusal = _string(part.get("refusal"), f"{where}.content[{j}].refusal")
                parts.append({"type": "refusal", "refusal": refusal})
            else:
                raise ValueError(f"{where}.content[{j}] must be a text or refusal part")
    elif content is not None:
        raise ValueError(f"{where}.content must be a string, a list of parts or null")
    if message.get("refusal") is not None:
        parts.append({"type": "refusal", "refusal": _string(message["refusal"], f"{where}.refusal")})
    items = [_message("assistant", parts)] if parts else []
    calls = message.get("tool_calls")
    if calls is None:
        return items
    if not isinstance(calls, list):
        raise ValueError(f"{where}.tool_calls must be a list")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            raise ValueError(f"{at} must be an object")
        call_id = _string(call.get("id"), f"{at}.id")
        kind = call.get("type", "function")
        if not isinstance(kind, str) or kind not in _CALL_KINDS:
            raise ValueError(f"{at}.type must be function or custom")
        item_type, key = _CALL_KINDS[kind]
        spec = _mapping(call.get(kind), f"{at}.{kind}")
        name, text = _string(spec.get("name"), f"{at}.{kind}.name"), _string(spec.get(key), f"{at}.{kind}.{key}")
        items.append({"type": item_type, "call_id": call_id, "name": name, key: text})
        if kind == "custom":
            custom_calls.add(call_id)
    return items


def _tool(tool: Any, where: str) -> dict[str, Any]:
    kind = _type_of(tool)
    if kind == "function":
        spec = _mapping(tool.get("function"), f"{where}.function")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"{where}.function.strict must be a boolean")
        out: dict[str, Any] = {"type": "function", "name": _string(spec.get("name"), f"{where}.function.name")}
        out.update(_present(spec, "description"))
        parameters = spec.get("parameters")
        out["parameters"] = dict(_EMPTY_PARAMETERS) if parameters is None else parameters
        out["strict"] = bool(strict)  # Responses would make a function without ``strict`` strict
        return out
    if kind == "custom":
        spec = _mapping(tool.get("custom"), f"{where}.custom")
        out = {"type": "custom", "name": _string(spec.get("name"), f"{where}.custom.name")}
        out.update(_present(spec, "description"))
        if spec.get("format") is not None:
            out["format"] = _custom_format(spec["format"], f"{where}.custom.format")
        return out
    raise ValueError(f"{where}.type must be function or custom")


def _custom_format(value: Any, where: str) -> dict[str, Any]:
    kind = _type_of(value)
    if kind == "text":
        return {"type": "text"}
    if kind == "grammar":  # nested under "grammar" in Chat, flat in Responses
        grammar = _mapping(value.get("grammar"), f"{where}.grammar")
        fields = {key: _string(grammar.get(key), f"{where}.grammar.{key}") for key in ("definition", "syntax")}
        return {"type": "grammar", **fields}
    raise ValueError(f"{where}.type must be text or grammar")


def _tool_choice(value: Any) -> Any:
    if value in ("auto", "none", "required"):
        return value
    kind = _type_of(value)
    if kind in ("function", "custom"):
        spec = _mapping(value.get(kind), f"tool_choice.{kind}")
        return {"type": kind, "name": _string(spec.get("name"), f"tool_choice.{kind}.name")}
    raise ValueError("tool_choice must be auto, none, required or a named function or custom tool")


def _text_format(value: Any) -> dict[str, Any]:
    kind = _type_of(value)
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        spec = _mapping(value.get("json_schema"), "response_format.json_schema")
        name = _string(spec.get("name"), "response_format.json_schema.name")
        return {"type": "json_schema", "name": name, **_present(spec, "description", "schema", "strict")}
    raise ValueError("response_format.type must be text, json_object or json_schema")


def _present(source: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: source[key] for key in keys if source.get(key) is not None}


def _type_of(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, Mapping) else None
    return kind if isinstance(kind, str) else None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string")
    return value


def responses_to_chat(data: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """The ``chat.completion`` for a finished (``completed`` or ``incomplete``) Responses object."""
    if not isinstance(data, Mapping) or data.get("object", "response") != "response":
        raise ValueError("the upstream reply is not a Responses object")
    output = data.get("output")
    if not isinstance(output, list):
        raise ValueError("the upstream reply has no output list")
    status = data.get("status")
    if status not in _FINISHED:
        raise ValueError("the upstream response did not finish (status is not completed or incomplete)")
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, item in enumerate(output):
        kind = _type_of(item)
        if kind == "message":
            content = item.get("content")
            if not isinstance(content, list):
                raise ValueError(f"output[{i}].content must be a list")
            for part in content:
                if _type_of(part) == "output_text":
                    texts.append(_string(part.get("text"), f"output[{i}].content.text"))
                elif _type_of(part) == "refusal":
                    refusals.append(_string(part.get("refusal"), f"output[{i}].content.refusal"))
        elif kind is not None and kind in _ITEM_KINDS:
            chat_kind, key = _ITEM_KINDS[kind]
            call = {field: _string(item.get(field), f"output[{i}].{field}") for field in ("call_id", "name", key)}
            spec = {"name": call["name"], key: call[key]}
            calls.append({"id": call["call_id"], "type": chat_kind, chat_kind: spec})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": "".join(refusals) if refusals else None,
    }
    if calls:
        message["tool_calls"] = calls
    out: dict[str, Any] = {
        "id": data.get("id"),
        "object": "chat.completion",
        "created": _created(data),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(data, bool(calls))}],
    }
    usage = _usage(data.get("usage"))
    if usage is not None:
        out["usage"] = usage
    return out


def _created(response: Mapping[str, Any]) -> int:
    created = response.get("created_at")
    return int(created) if isinstance(created, int | float) else 0


def _finish_reason(response: Mapping[str, Any], called: bool) -> str:
    """``length`` / ``content_filter`` for an incomplete response, even with calls (their arguments may be cut)."""
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, Mapping) else None
        if reason == "max_output_tokens":
            return "length"
        if reason == "content_filter":
            return "content_filter"
    return "tool_calls" if called else "stop"


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, Mapping):
        return None
    out: dict[str, Any] = {
        "prompt_tokens": usage.get("input_tokens", 0),
        "completion_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
    }
    for source, target, key in (
        ("input_tokens_details", "prompt_tokens_details", "cached_tokens"),
        ("output_tokens_details", "completion_tokens_details", "reasoning_tokens"),
    ):
        details = usage.get(source)
        if isinstance(details, Mapping) and key in details:
            out[target] = {key: details[key]}
    return out


class ResponsesStreamTranslator:
    """Responses streaming events in (raw SSE bytes, split anywhere), ``chat.completion.chunk`` SSE bytes out.

    ``completed`` turns True at ``response.completed`` / ``response.incomplete``, after which the finish chunk,
    the usage chunk and ``data: [DONE]`` are emitted. At ``response.failed`` or an ``error`` event nothing more is
    emitted and ``failure`` holds the upstream's error code (safe characters, at most 64). Input after either end
    is ignored. A malformed stream raises :class:`ValueError`.
    """

    def __init__(self, *, model: str, chunk_id: str | None = None) -> None:
        self.completed = False
        self.failure: str | None = None
        self._model = model
        self._id = chunk_id
        self._created = 0
        self._decoder = SSEDecoder()
        self._started = False
        self._calls: dict[str, tuple[int, str, str]] = {}  # item id -> (chat index, chat kind, text sent so far)

    def _ended(self) -> bool:
        return self.completed or self.failure is not None

    def feed(self, data: bytes) -> bytes:
        """Add upstream bytes; return the chat-completion SSE they complete."""
        if self._ended():
            return b""
        try:
            events = self._decoder.feed(data)
        except LLMProtocolError as exc:
            raise ValueError("malformed Responses event stream") from exc
        out = bytearray()
        for event in events:
            if self._ended():
                break
            try:
                payload = json.loads(event.data)
            except (ValueError, RecursionError) as exc:
                raise ValueError("a Responses stream event is not JSON") from exc
            if not isinstance(payload, dict):
                raise ValueError("a Responses stream event is not an object")
            out += self._event(str(payload.get("type") or event.event), payload)
        return bytes(out)

    def _event(self, kind: str, event: dict[str, Any]) -> bytes:
        response = event.get("response")
        response = response if isinstance(response, dict) else {}
        if kind == "response.created":
            self._adopt(response)
            return self._start()
        if kind == "response.output_text.delta":
            return self._start() + self._chunk({"content": _string(event.get("delta"), "delta")})
        if kind == "response.refusal.delta":
            return self._start() + self._chunk({"refusal": _string(event.get("delta"), "delta")})
        if kind == "response.output_item.added":
            return self._item_added(_mapping(event.get("item"), "item"))
        if kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            return self._call_delta(event.get("item_id"), _string(event.get("delta"), "delta"))
        if kind == "response.output_item.done":
            return self._item_done(_mapping(event.get("item"), "item"))
        if kind in ("response.completed", "response.incomplete"):
            self._adopt(response)
            self.completed = True
            finish = self._chunk({}, _finish_reason(response, bool(self._calls)))
            usage = _usage(response.get("usage"))
            if usage is not None:
                finish += _sse({**self._envelope(), "choices": [], "usage": usage})
            return self._start() + finish + b"data: [DONE]\n\n"
        if kind == "response.failed":
            error = response.get("error")
            self.failure = _safe_code(error.get("code") if isinstance(error, Mapping) else None)
        elif kind == "error":
            nested = event.get("error")  # some upstreams nest {code, type, message} under "error"
            code = (nested.get("code") or nested.get("type")) if isinstance(nested, Mapping) else event.get("code")
            self.failure = _safe_code(code)
        return b""

    def _item_added(self, item: Mapping[str, Any]) -> bytes:
        """A call's first chunk (id, type, name, empty text), then any text the item already carries."""
        item_type = _type_of(item)
        if item_type is None or item_type not in _ITEM_KINDS:
            return b""
        kind, key = _ITEM_KINDS[item_type]
        item_id = _string(item.get("id") or item.get("call_id"), "item.id")
        if item_id in self._calls:  # announced twice: the call already has its index
            return b""
        index = len(self._calls)
        self._calls[item_id] = (index, kind, "")
        call_id, name = _string(item.get("call_id"), "item.call_id"), _string(item.get("name"), "item.name")
        start = {"index": index, "id": call_id, "type": kind, kind: {"name": name, key: ""}}
        return self._start() + self._chunk({"tool_calls": [start]}) + self._item_done(item)

    def _call_delta(self, item_id: Any, delta: str) -> bytes:
        if not isinstance(item_id, str) or item_id not in self._calls:
            raise ValueError("a Responses stream delta names an output item that was never added")
        index, kind, sent = self._calls[item_id]
        self._calls[item_id] = (index, kind, sent + delta)
        return self._chunk({"tool_calls": [{"index": index, kind: {_CALL_KINDS[kind][1]: delta}}]})

    def _item_done(self, item: Mapping[str, Any]) -> bytes:
        """Send whatever of a call's final text the deltas did not (some upstreams send no deltas)."""
        item_type, item_id = _type_of(item), item.get("id") or item.get("call_id")
        if item_type is None or item_type not in _ITEM_KINDS:
            return b""
        if not isinstance(item_id, str) or item_id not in self._calls:
            return self._item_added(item)
        _, kind, sent = self._calls[item_id]
        final = item.get(_CALL_KINDS[kind][1])
        if isinstance(final, str) and final.startswith(sent) and len(final) > len(sent):
            return self._call_delta(item_id, final[len(sent) :])
        return b""

    def _adopt(self, response: Mapping[str, Any]) -> None:
        if self._id is None and isinstance(response.get("id"), str):
            self._id = response["id"]
        if not self._created:
            self._created = _created(response)

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._chunk({"role": "assistant"})

    def _envelope(self) -> dict[str, Any]:
        chunk_id = self._id or "chatcmpl-responses"
        return {"id": chunk_id, "object": "chat.completion.chunk", "created": self._created, "model": self._model}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        return _sse({**self._envelope(), "choices": [choice]})


def _sse(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _safe_code(code: Any) -> str:
    cleaned = _UNSAFE.sub("", code)[:64] if isinstance(code, str) else ""
    return cleaned or "upstream_error"


def _error_object(status: int, body: bytes) -> Mapping[str, Any] | None:
    if status != 400:
        return None
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, Mapping) else None


def rejects_max_tokens(status: int, body: bytes) -> bool:
    """Whether an upstream 400 says ``max_tokens`` is unsupported (retry with ``max_completion_tokens``)."""
    error = _error_object(status, body)
    if error is None:
        return False
    if error.get("param") == "max_tokens" and error.get("code") == "unsupported_parameter":
        return True
    message = error.get("message")
    return isinstance(message, str) and _MAX_TOKENS_MESSAGE.search(message) is not None


def rejected_sampling_parameter(status: int, body: bytes) -> str | None:
    """``temperature`` or ``top_p`` when an upstream 400 says that parameter (or its value) is unsupported."""
    error = _error_object(status, body)
    if error is None or error.get("code") not in ("unsupported_parameter", "unsupported_value"):
        return None
    param = error.get("param")
    return param if isinstance(param, str) and param in _SAMPLING else None

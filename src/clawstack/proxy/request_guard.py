"""The final-request guard: the body the proxy sends upstream is built from an allowlist, never passed through.

A per-run worker may be prompt-injected, so the proxy forwards only the request fields it understands, per field
and per nested object, and refuses everything else before dispatch: nothing reaches an upstream, nothing is
spent. :func:`guard_chat_request` checks a worker's Chat Completions body and returns the body the proxy works
from (fields it drops removed); :func:`check_outgoing` is the last check on what the proxy itself built for one
request shape (Chat Completions, the Responses adapter, the plan route), just before it is sent.

Refusals, all ``400``, each naming the field by its JSON path (in the message and in the error's ``param``),
never its value:

- ``request_field_refused``: a field outside the allowlist, at any depth (``search_parameters``,
  ``tools[0].google_search``, ``messages[1].content[0].file.file_id``), a field the proxy knows and refuses on
  purpose (:data:`REFUSED_FIELDS`), a message role or content-part type it does not forward, and a URL that would
  make the provider fetch something beyond the request (``image_url.url`` and ``file.file_data`` must be inline
  ``data:`` URLs);
- ``hosted_tool_refused``: a ``tools[i]`` whose ``type`` is not ``function`` or ``custom``: a provider-hosted tool
  (remote MCP, hosted search, code interpreter, ...) or no type at all;
- ``data_policy_violation``: ``store: true`` or ``metadata`` under a data policy that allows no retention;
- ``invalid_request``: an allowlisted field of the wrong JSON type, or a required one missing.

A known field the proxy refuses is accepted when it is ``null`` (it asks for nothing) and is not forwarded.
JSON Schemas (``tools[i].function.parameters``, ``response_format.json_schema.schema``) are forwarded as they
are: they are data the model reads, not options an upstream acts on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from clawstack.models.policy import DataPolicy
from clawstack.models.refs import PREFERENCE_KEYS
from clawstack.proxy.errors import RequestError
from clawstack.proxy.plan.chatgpt import DROPPED_FIELDS as PLAN_DROPPED_FIELDS
from clawstack.proxy.responses_api import RESPONSES_FIELDS

Check = Callable[[Any, str], Any]
"""Checks one value found at a JSON path; returns the value to forward, or raises :class:`RequestError`."""
Shape = Literal["chat", "responses", "plan"]

_PLAIN_KEY: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_TOKEN_ID: Final = re.compile(r"[0-9]{1,10}")
_UNKNOWN: Final = "is not a field the proxy forwards"


def field_path(parent: str, key: str) -> str:
    """``parent.key``; a key that is not a plain name is quoted (JSON, ASCII, cut at 64 characters)."""
    if _PLAIN_KEY.fullmatch(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key[:64])}]"


def field_refused(path: str, why: str) -> RequestError:
    """``request_field_refused`` naming ``path``."""
    return RequestError(f"{path}: {why}", code="request_field_refused", param=path)


def _malformed(path: str, what: str) -> RequestError:
    return RequestError(f"{path} must be {what}", code="invalid_request", param=path)


def _hosted(path: str) -> RequestError:
    return RequestError(
        f"{path}: names a provider-hosted tool (or none), which per-run workers may not use; "
        "send function or custom tools",
        code="hosted_tool_refused",
        param=path,
    )


# ------------------------------------------------------------------------------------------------- scalars


def _string(value: Any, path: str) -> Any:
    if not isinstance(value, str):
        raise _malformed(path, "a string")
    return value


def _model(value: Any, path: str) -> Any:
    if not isinstance(value, str) or not value:
        raise _malformed(path, "a non-empty string")
    return value


def _boolean(value: Any, path: str) -> Any:
    if not isinstance(value, bool):
        raise _malformed(path, "a boolean")
    return value


def _integer(value: Any, path: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(path, "an integer")
    return value


def _number(value: Any, path: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _malformed(path, "a number")
    return value


def _as_is(value: Any, path: str) -> Any:
    return value


def _schema(value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise _malformed(path, "an object")
    return value


def _enum(*choices: str) -> Check:
    def check(value: Any, path: str) -> Any:
        if value not in choices:
            raise _malformed(path, "one of " + ", ".join(choices))
        return value

    return check


def _inline_data(value: Any, path: str) -> Any:
    if not isinstance(value, str):
        raise _malformed(path, "a string")
    if value[:5].lower() != "data:":
        raise field_refused(
            path, "only inline data: URLs are forwarded; a URL elsewhere would have the provider fetch it"
        )
    return value


# --------------------------------------------------------------------------------------------- combinators


def _object(
    fields: Mapping[str, Check],
    *,
    required: tuple[str, ...] = (),
    dropped: frozenset[str] = frozenset(),
    refused: Mapping[str, str] | None = None,
) -> Check:
    """An object of ``fields`` only: ``dropped`` keys are accepted and removed, ``refused`` ones are refused for
    the reason given (unless ``null``), any other key is refused."""
    refused = refused or {}

    def check(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _malformed(path or "the body", "an object")
        out: dict[str, Any] = {}
        for key, item in value.items():
            at = field_path(path, key)
            if key in fields:
                out[key] = None if item is None and key not in required else fields[key](item, at)
            elif key in refused and item is not None:
                raise field_refused(at, refused[key])
            elif key not in dropped and key not in refused:
                raise field_refused(at, _UNKNOWN)
        for key in required:
            if value.get(key) is None:
                raise _malformed(field_path(path, key), "set")
        return out

    return check


def _tagged(tag: str, variants: Mapping[str, Check], unknown: Callable[[str], RequestError]) -> Check:
    """An object whose ``tag`` (``type``, ``role``) selects its variant; an unknown tag is ``unknown(path)``."""

    def check(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            raise _malformed(path, "an object")
        kind = value.get(tag)
        if not isinstance(kind, str) or kind not in variants:
            raise unknown(field_path(path, tag))
        return variants[kind](value, path)

    return check


def _kinds(*names: str) -> Callable[[str], RequestError]:
    return lambda path: field_refused(path, "is not one the proxy forwards (" + ", ".join(names) + ")")


def _typed(variants: Mapping[str, Check]) -> Check:
    return _tagged("type", variants, _kinds(*variants))


def _list(item: Check, *, non_empty: bool = False) -> Check:
    def check(value: Any, path: str) -> Any:
        if not isinstance(value, list) or (non_empty and not value):
            raise _malformed(path, "a non-empty array" if non_empty else "an array")
        return [item(element, f"{path}[{index}]") for index, element in enumerate(value)]

    return check


def _string_or(parts: Check) -> Check:
    def check(value: Any, path: str) -> Any:
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise _malformed(path, "a string or an array")
        return parts(value, path)

    return check


def _map(key: re.Pattern[str] | None, value: Check) -> Check:
    def check(mapping: Any, path: str) -> Any:
        if not isinstance(mapping, dict):
            raise _malformed(path, "an object")
        for name, item in mapping.items():
            at = field_path(path, name)
            if key is not None and not key.fullmatch(name):
                raise _malformed(at, "named by a token id")
            value(item, at)
        return mapping

    return check


def _modalities(value: Any, path: str) -> Any:
    if not isinstance(value, list):
        raise _malformed(path, "an array")
    for index, item in enumerate(value):
        if item != "text":
            raise field_refused(f"{path}[{index}]", "only text output is relayed by the proxy")
    return value


# ------------------------------------------------------------------------------------------------- shapes

_TYPE: Final = {"type": _string}
_TEXT_PART: Final = _object({**_TYPE, "text": _string}, required=("text",))
_TEXT_CONTENT: Final = _string_or(_list(_typed({"text": _TEXT_PART})))
_USER_PART: Final = _typed(
    {
        "text": _TEXT_PART,
        "image_url": _object(
            {
                **_TYPE,
                "image_url": _object({"url": _inline_data, "detail": _enum("auto", "low", "high")}, required=("url",)),
            },
            required=("image_url",),
        ),
        "input_audio": _object(
            {
                **_TYPE,
                "input_audio": _object({"data": _string, "format": _enum("wav", "mp3")}, required=("data", "format")),
            },
            required=("input_audio",),
        ),
        "file": _object(
            {
                **_TYPE,
                "file": _object(
                    {"file_data": _inline_data, "filename": _string},
                    required=("file_data",),
                    refused={
                        "file_id": "a file id reads a file stored at the provider, outside this run; send file_data"
                    },
                ),
            },
            required=("file",),
        ),
    }
)
_ASSISTANT_PART: Final = _typed(
    {"text": _TEXT_PART, "refusal": _object({**_TYPE, "refusal": _string}, required=("refusal",))}
)
_TOOL_CALL: Final = _typed(
    {
        "function": _object(
            {**_TYPE, "id": _string, "function": _object({"name": _string, "arguments": _string}, required=("name",))},
            required=("id", "function"),
        ),
        "custom": _object(
            {**_TYPE, "id": _string, "custom": _object({"name": _string, "input": _string}, required=("name",))},
            required=("id", "custom"),
        ),
    }
)
_LEGACY = "the legacy function-calling fields are not forwarded; send tools and tool_choice"
_TEXT_ROLE: Final = _object({"role": _string, "content": _TEXT_CONTENT, "name": _string}, required=("content",))
_MESSAGE: Final = _tagged(
    "role",
    {
        "system": _TEXT_ROLE,
        "developer": _TEXT_ROLE,
        "user": _object(
            {"role": _string, "content": _string_or(_list(_USER_PART)), "name": _string}, required=("content",)
        ),
        "assistant": _object(
            {
                "role": _string,
                "content": _string_or(_list(_ASSISTANT_PART)),
                "refusal": _string,
                "name": _string,
                "tool_calls": _list(_TOOL_CALL),
                # The model's own earlier reasoning, echoed back as text (reasoning models require it).
                "reasoning_content": _string,
            },
            dropped=frozenset({"annotations"}),  # a previous answer's citations, echoed back; the provider ignores them
            refused={
                "audio": "a previous audio answer is stored at the provider; the proxy relays text only",
                "function_call": _LEGACY,
            },
        ),
        "tool": _object(
            {"role": _string, "content": _TEXT_CONTENT, "tool_call_id": _string, "name": _string},
            required=("content", "tool_call_id"),
        ),
    },
    _kinds("system", "developer", "user", "assistant", "tool"),
)
_FUNCTION: Final = _object(
    {"name": _string, "description": _string, "parameters": _schema, "strict": _boolean}, required=("name",)
)
_CUSTOM_FORMAT: Final = _typed(
    {
        "text": _object(_TYPE),
        "grammar": _object(
            {
                **_TYPE,
                "grammar": _object(
                    {"definition": _string, "syntax": _enum("lark", "regex")}, required=("definition", "syntax")
                ),
            },
            required=("grammar",),
        ),
    }
)
_TOOL: Final = _tagged(
    "type",
    {
        "function": _object({**_TYPE, "function": _FUNCTION}, required=("function",)),
        "custom": _object(
            {
                **_TYPE,
                "custom": _object(
                    {"name": _string, "description": _string, "format": _CUSTOM_FORMAT}, required=("name",)
                ),
            },
            required=("custom",),
        ),
    },
    _hosted,
)
_NAMED: Final = _object({"name": _string}, required=("name",))
_NAMED_CHOICE: Final = _typed(
    {
        "function": _object({**_TYPE, "function": _NAMED}, required=("function",)),
        "custom": _object({**_TYPE, "custom": _NAMED}, required=("custom",)),
    }
)


def _tool_choice(value: Any, path: str) -> Any:
    if isinstance(value, str):
        return _enum("none", "auto", "required")(value, path)
    return _NAMED_CHOICE(value, path)


_RESPONSE_FORMAT: Final = _typed(
    {
        "text": _object(_TYPE),
        "json_object": _object(_TYPE),
        "json_schema": _object(
            {
                **_TYPE,
                "json_schema": _object(
                    {"name": _string, "description": _string, "schema": _schema, "strict": _boolean},
                    required=("name",),
                ),
            },
            required=("json_schema",),
        ),
    }
)

CHAT_FIELDS: Final[Mapping[str, Check]] = {
    "model": _model,
    "messages": _list(_MESSAGE, non_empty=True),
    "frequency_penalty": _number,
    "logit_bias": _map(_TOKEN_ID, _number),
    "logprobs": _boolean,
    "max_completion_tokens": _integer,
    "max_tokens": _integer,
    "metadata": _map(None, _string),
    "modalities": _modalities,
    "n": _integer,
    "parallel_tool_calls": _boolean,
    "prediction": _typed({"content": _object({**_TYPE, "content": _TEXT_CONTENT}, required=("content",))}),
    "presence_penalty": _number,
    "prompt_cache_key": _string,
    "provider": _object(dict.fromkeys(PREFERENCE_KEYS, _as_is)),  # values: chat.provider_object
    "response_format": _RESPONSE_FORMAT,
    "safety_identifier": _string,
    "seed": _integer,
    "stop": _string_or(_list(_string)),
    "store": _boolean,
    "stream": _boolean,
    "stream_options": _object({"include_usage": _boolean, "include_obfuscation": _boolean}),
    "temperature": _number,
    "tool_choice": _tool_choice,
    "tools": _list(_TOOL),
    "top_logprobs": _integer,
    "top_p": _number,
    "user": _string,
    "verbosity": _enum("low", "medium", "high"),
}
"""The worker's Chat Completions fields the proxy forwards (``model`` is replaced by the chain entry's model;
``provider`` reaches only ``openrouter/`` routes, merged with the slot's preferences and the data policy's)."""
DROPPED_FIELDS: Final = frozenset({"reasoning_effort"})
"""Accepted and not forwarded: the proxy sends the slot's own ``reasoning_effort``, or none."""
REFUSED_FIELDS: Final[Mapping[str, str]] = {
    "audio": "audio output is not relayed by the proxy, which carries text",
    "function_call": _LEGACY,
    "functions": _LEGACY,
    "service_tier": "the service tier is a billing choice of the operator, not of a run",
    "web_search_options": "hosted web search is a provider-hosted capability, which per-run workers may not use",
}
"""Known fields the proxy refuses on purpose (``request_field_refused``), with the reason it gives."""

_CHAT_BODY: Final = _object(CHAT_FIELDS, required=("model", "messages"), dropped=DROPPED_FIELDS, refused=REFUSED_FIELDS)


def guard_chat_request(body: Any, policy: DataPolicy) -> dict[str, Any]:
    """The worker's chat body as the proxy forwards it: every field checked against :data:`CHAT_FIELDS`, dropped
    fields removed; raises :class:`RequestError` (see the module docstring for the codes)."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object", code="invalid_request")
    guarded: dict[str, Any] = _CHAT_BODY(body, "")
    if policy.enforces_zero_retention():
        if guarded.get("store") is True:
            raise RequestError(
                "store: true asks the provider to retain the conversation, which the data policy forbids",
                code="data_policy_violation",
                param="store",
            )
        if guarded.get("metadata") is not None:
            raise RequestError(
                "metadata is kept by the provider with a stored request, which the data policy forbids",
                code="data_policy_violation",
                param="metadata",
            )
    return guarded


OUTGOING_FIELDS: Final[Mapping[Shape, frozenset[str]]] = {
    "chat": frozenset({*CHAT_FIELDS, "reasoning_effort"}),
    "responses": RESPONSES_FIELDS,
    "plan": RESPONSES_FIELDS - frozenset({*PLAN_DROPPED_FIELDS, "provider"}),
}
"""The top-level fields each request shape may carry upstream."""


def check_outgoing(shape: Shape, payload: Mapping[str, Any]) -> None:
    """Refuse (``request_field_refused``) a body the proxy built for ``shape`` that carries a field outside that
    shape's allowlist; it is never sent."""
    allowed = OUTGOING_FIELDS[shape]
    for key in payload:
        if key not in allowed:
            raise field_refused(field_path("", key), f"is not a field of the {shape} request shape")


__all__ = [
    "CHAT_FIELDS",
    "DROPPED_FIELDS",
    "OUTGOING_FIELDS",
    "REFUSED_FIELDS",
    "Check",
    "Shape",
    "check_outgoing",
    "field_path",
    "field_refused",
    "guard_chat_request",
]

"""Tool descriptors: the v2 documents tool services publish, which the pod compiler checks and the proxy serves.

Business capabilities reach a worker only as proxy-managed tools. A tool service publishes a descriptor naming
its HTTP tool endpoints and, optionally, the name of the environment variable that holds the bearer the proxy
must send it::

    {"version": 2,
     "auth": {"type": "bearer", "env": "TICKET_API_TOKEN"},
     "tools": [{"name": "get_ticket", "description": "Read one ticket.",
                "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
                "http": {"method": "POST", "path": "/tools/get_ticket"}}]}

The descriptor is parsed strictly because it decides where the proxy sends a bearer: a path that could escape
the service's base URL (``..``, ``//``, a scheme, a query) or a field the parser does not understand is refused
rather than guessed at. The bearer itself never appears here: the caller resolves ``auth.env`` from the proxy's
own configuration and hands the value to :class:`ToolService`, whose ``repr`` hides it.

Names: a tool is granted and allowlisted by its *qualified* name ``service.tool``; the model sees it as the
function ``service__tool``, because OpenAI function names allow only ``[A-Za-z0-9_-]{1,64}``. Service names
cannot contain ``_``, so the first ``__`` always splits a function name back into service and tool, and every
``<service>__…`` name of a known service belongs to the managed namespace whether or not it is allowed.

Errors: a malformed descriptor raises :class:`DescriptorError` with code ``tool_descriptor_invalid`` and a
message naming the service and the field, never a value. The pod compiler (:mod:`clawstack.pod.compile`) checks them; the proxy's catalog is
:mod:`clawstack.proxy.tools`.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from clawstack.common import strictjson
from clawstack.common.errors import ClawError
from clawstack.common.strictjson import StrictJSONError

TOOL_NAME: Final = r"[a-z0-9][a-z0-9_-]{0,47}"
SERVICE_NAME: Final = r"[a-z0-9][a-z0-9-]{0,47}"
ENV_NAME: Final = r"[A-Z_][A-Z0-9_]*"
FUNCTION_SEPARATOR: Final = "__"
MAX_FUNCTION_NAME: Final = 64
"""OpenAI's limit on a function name, so on ``service__tool``."""
MAX_TOOLS_PER_SERVICE: Final = 128
"""OpenAI-compatible APIs refuse more than 128 function tools in one request."""
MAX_DESCRIPTOR_BYTES: Final = 1024 * 1024
MAX_PATH_LENGTH: Final = 1024
DESCRIPTOR_INVALID: Final = "tool_descriptor_invalid"

_TOOL_RE: Final = re.compile(TOOL_NAME)
_SERVICE_RE: Final = re.compile(SERVICE_NAME)
_ENV_RE: Final = re.compile(ENV_NAME)
# RFC 3986 path characters without percent-encoding, so that no encoded "." or "/" can hide a traversal.
_PATH_RE: Final = re.compile(r"/[A-Za-z0-9._~!$&'()*+,;=:@/-]*")
_BEARER_RE: Final = re.compile(r"[\x21-\x7e]+")  # visible ASCII: nothing that could split a header

_DESCRIPTOR_KEYS: Final = frozenset({"version", "auth", "tools"})
_AUTH_KEYS: Final = frozenset({"type", "env"})
_TOOL_KEYS: Final = frozenset({"name", "description", "parameters", "http"})
_HTTP_KEYS: Final = frozenset({"method", "path"})


def function_name_for(service: str, tool: str) -> str:
    """The function name the model sees for ``service.tool``: ``service__tool``."""
    return f"{service}{FUNCTION_SEPARATOR}{tool}"


def qualified_name_for(function_name: str) -> str | None:
    """The qualified name a function name stands for (``service__tool`` → ``service.tool``), or ``None``.

    Pure syntax: the result need not name a known tool; use it to record a refused call by the name grants use.
    """
    service, separator, tool = function_name.partition(FUNCTION_SEPARATOR)
    return f"{service}.{tool}" if separator else None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One managed tool: how it is named, what the model is told about it, and where it is dispatched.

    ``qualified`` (``service.tool``, the name grants and allowlists use) and ``function_name``
    (``service__tool``, the name the model sees) are derived from ``service`` and ``name``. ``parameters`` is a
    JSON Schema object; ``path`` is relative to the service's base URL. Constructing a spec with a name outside
    :data:`SERVICE_NAME` / :data:`TOOL_NAME`, or whose function name exceeds 64 characters, is a ``ValueError``.
    """

    service: str
    name: str
    description: str
    parameters: Mapping[str, Any] = field(hash=False)
    method: Literal["POST"]
    path: str
    qualified: str = field(init=False)
    function_name: str = field(init=False)

    def __post_init__(self) -> None:
        if not _SERVICE_RE.fullmatch(self.service):
            raise ValueError(f"a tool service name must match {SERVICE_NAME}")
        if not _TOOL_RE.fullmatch(self.name):
            raise ValueError(f"a tool name must match {TOOL_NAME}")
        function_name = function_name_for(self.service, self.name)
        if len(function_name) > MAX_FUNCTION_NAME:
            raise ValueError(f"the function name {function_name} is longer than {MAX_FUNCTION_NAME} characters")
        if self.method != "POST":
            raise ValueError("managed tools are dispatched with POST")
        if _path_problem(self.path) is not None:
            raise ValueError("a tool path must be a plain absolute path")
        object.__setattr__(self, "qualified", f"{self.service}.{self.name}")
        object.__setattr__(self, "function_name", function_name)

    def openai_tool(self) -> dict[str, Any]:
        """This tool as an OpenAI function tool; a fresh copy the caller may change."""
        return {
            "type": "function",
            "function": {
                "name": self.function_name,
                "description": self.description,
                "parameters": copy.deepcopy(dict(self.parameters)),
            },
        }


@dataclass(frozen=True, slots=True)
class ServiceDescriptor:
    """A parsed v2 descriptor: the service's name, the env var naming its bearer (or ``None``), its tools."""

    service: str
    auth_env: str | None
    tools: tuple[ToolSpec, ...]


class DescriptorError(ClawError):
    """A tool descriptor that cannot be used."""

    code = "tool_descriptor_invalid"


class _Invalid(Exception):
    """Internal: one descriptor field is wrong; turned into a DescriptorError naming the service."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}")


def parse_descriptor(service: str, data: bytes | Mapping[str, Any]) -> ServiceDescriptor:
    """Parse and check the v2 descriptor that the tool service ``service`` publishes.

    ``data`` is the descriptor's bytes (parsed by the strict JSON parser) or an already-decoded mapping (which is
    checked to be plain JSON the same way). Raises :class:`DescriptorError` (``tool_descriptor_invalid``) naming the
    service and the offending field; messages never quote a value.
    """
    if not isinstance(service, str) or not _SERVICE_RE.fullmatch(service):
        raise DescriptorError(f"a tool service name must match {SERVICE_NAME}", code=DESCRIPTOR_INVALID)
    try:
        document = _decode(data)
        return _descriptor(service, document)
    except _Invalid as exc:
        raise DescriptorError(f"tool descriptor of service {service!r}: {exc}", code=DESCRIPTOR_INVALID) from None
    except StrictJSONError as exc:
        raise DescriptorError(
            f"tool descriptor of service {service!r} is not valid JSON: {exc.message} ({exc.code})",
            code=DESCRIPTOR_INVALID,
        ) from exc


def _decode(data: bytes | Mapping[str, Any]) -> Any:
    if isinstance(data, bytes | bytearray | memoryview):
        return strictjson.loads(bytes(data), max_bytes=MAX_DESCRIPTOR_BYTES)
    if not isinstance(data, Mapping):
        raise _Invalid("the descriptor", "must be bytes or a mapping")
    # A round trip through the strict parser refuses what JSON cannot carry (NaN, sets, lone surrogates, huge
    # integers) and leaves the catalog with its own copy that no caller holds.
    try:
        text = json.dumps(data, ensure_ascii=True, allow_nan=False, separators=(",", ":"), default=_plain_mapping)
    except (TypeError, ValueError) as exc:
        raise _Invalid("the descriptor", "holds a value JSON cannot represent") from exc
    return strictjson.loads(text.encode("ascii"), max_bytes=MAX_DESCRIPTOR_BYTES)


def _plain_mapping(value: Any) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _descriptor(service: str, document: Any) -> ServiceDescriptor:
    _check_object(document, "the descriptor", _DESCRIPTOR_KEYS, required=frozenset({"version", "tools"}))
    version = document["version"]
    if type(version) is not int or version != 2:
        raise _Invalid("field 'version'", "must be the integer 2")
    auth_env = _auth(document["auth"]) if "auth" in document else None
    tools = document["tools"]
    if not isinstance(tools, list) or not tools:
        raise _Invalid("field 'tools'", "must be a non-empty array")
    if len(tools) > MAX_TOOLS_PER_SERVICE:
        raise _Invalid("field 'tools'", f"holds more than {MAX_TOOLS_PER_SERVICE} tools")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for index, item in enumerate(tools):
        spec = _tool(service, item, f"tools[{index}]")
        if spec.name in seen:
            raise _Invalid(f"field 'tools[{index}].name'", f"repeats the tool name {spec.name!r}")
        seen.add(spec.name)
        specs.append(spec)
    return ServiceDescriptor(service=service, auth_env=auth_env, tools=tuple(specs))


def _auth(auth: Any) -> str:
    _check_object(auth, "field 'auth'", _AUTH_KEYS, required=_AUTH_KEYS)
    if auth["type"] != "bearer":
        raise _Invalid("field 'auth.type'", 'must be "bearer"')
    env = auth["env"]
    if not isinstance(env, str) or not _ENV_RE.fullmatch(env):
        raise _Invalid("field 'auth.env'", f"must be an environment variable name matching {ENV_NAME}")
    return env


def _tool(service: str, item: Any, where: str) -> ToolSpec:
    _check_object(item, f"field '{where}'", _TOOL_KEYS, required=_TOOL_KEYS)
    name = item["name"]
    if not isinstance(name, str) or not _TOOL_RE.fullmatch(name):
        raise _Invalid(f"field '{where}.name'", f"must match {TOOL_NAME}")
    function_name = function_name_for(service, name)
    if len(function_name) > MAX_FUNCTION_NAME:
        raise _Invalid(
            f"field '{where}.name'",
            f"makes the function name {function_name} longer than {MAX_FUNCTION_NAME} characters",
        )
    description = item["description"]
    if not isinstance(description, str) or not description.strip():
        raise _Invalid(f"field '{where}.description'", "must be a non-empty string")
    parameters = item["parameters"]
    _check_parameters(parameters, f"{where}.parameters")
    http = item["http"]
    _check_object(http, f"field '{where}.http'", _HTTP_KEYS, required=_HTTP_KEYS)
    if http["method"] != "POST":
        raise _Invalid(f"field '{where}.http.method'", 'must be "POST"')
    path = http["path"]
    problem = _path_problem(path)
    if problem is not None:
        raise _Invalid(f"field '{where}.http.path'", problem)
    return ToolSpec(
        service=service, name=name, description=description, parameters=parameters, method="POST", path=path
    )


def _check_object(value: Any, where: str, allowed: frozenset[str], *, required: frozenset[str]) -> None:
    if not isinstance(value, dict):
        raise _Invalid(where, "must be an object")
    unknown = sorted(key for key in value if key not in allowed)
    if unknown:
        shown = unknown[0] if len(unknown[0]) <= 40 else unknown[0][:40] + "…"
        raise _Invalid(where, f"has an unknown field {shown!r}")
    missing = sorted(required - value.keys())
    if missing:
        raise _Invalid(where, f"lacks the field {missing[0]!r}")


def _check_parameters(schema: Any, where: str) -> None:
    if not isinstance(schema, dict):
        raise _Invalid(f"field '{where}'", "must be a JSON Schema object")
    if schema.get("type") != "object":
        raise _Invalid(f"field '{where}.type'", 'must be "object"')
    if "properties" in schema and not isinstance(schema["properties"], dict):
        raise _Invalid(f"field '{where}.properties'", "must be an object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(item, str) for item in required):
        raise _Invalid(f"field '{where}.required'", "must be an array of strings")


def _path_problem(path: Any) -> str | None:
    """Why ``path`` is not a plain absolute path under a base URL, or ``None`` if it is."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "must be a string starting with '/'"
    if len(path) > MAX_PATH_LENGTH:
        return f"is longer than {MAX_PATH_LENGTH} characters"
    if "?" in path or "#" in path:
        return "may not carry a query or a fragment"
    if "//" in path:
        return "may not contain '//'"
    if ".." in path or "/./" in path or path.endswith("/."):
        return "may not contain '..' or '.' segments"
    if not _PATH_RE.fullmatch(path):
        return "may hold only unreserved path characters (no percent-encoding, spaces or controls)"
    return None


__all__ = [
    "DESCRIPTOR_INVALID",
    "ENV_NAME",
    "FUNCTION_SEPARATOR",
    "MAX_DESCRIPTOR_BYTES",
    "MAX_FUNCTION_NAME",
    "MAX_TOOLS_PER_SERVICE",
    "SERVICE_NAME",
    "TOOL_NAME",
    "DescriptorError",
    "ServiceDescriptor",
    "ToolSpec",
    "function_name_for",
    "parse_descriptor",
    "qualified_name_for",
]

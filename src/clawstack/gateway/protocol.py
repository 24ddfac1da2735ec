"""The gateway WebSocket protocol's wire format: frames, request parameters, error shapes and constants.

This module is transport-free: it parses untrusted frames and parameters into typed values and builds the JSON
objects the server sends. :mod:`clawstack.gateway.server` adapts it to aiohttp. The subset implemented, and the
frames it exchanges, are described in ``docs/gateway-protocol.md``; they follow the OpenClaw gateway protocol
(version 4) as observed on a real gateway.

Frames::

    {"type": "req", "id": str, "method": str, "params": object}        client → server
    {"type": "res", "id": str, "ok": true, "payload": object}          server → client
    {"type": "res", "id": str, "ok": false, "error": ErrorShape}       server → client
    {"type": "event", "event": str, "payload": object, "seq": int}     server → client

Errors are values, not exceptions on the wire: :class:`ProtocolError` carries an :data:`ErrorCode` (``code``),
a message and optional ``details``, and :meth:`ProtocolError.to_shape` is the ``error`` object of a ``res`` frame::

    GatewayError                       (clawstack.gateway.errors)
     └── ProtocolError                 "protocol_error"; wire code in ``wire_code``
          ├── FrameError               a frame that is not a request; ``frame_id`` when one could be read
          ├── ParamsError              invalid parameters, message "invalid <what> params: at <pointer>: <problem>"
          └── MissingScopeError        ``FORBIDDEN`` / ``MISSING_SCOPE``: the connection lacks the scope it needs

Scopes: :data:`METHOD_SCOPES` says which operator scope each method needs; the commands a ``chat.send`` message
may run need their own (:data:`clawstack.gateway.commands.COMMAND_SCOPES`). :func:`scope_satisfied` is the one
rule of which scope grants which.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from clawstack.common import strictjson
from clawstack.gateway.errors import GatewayError

__all__ = [
    "CLIENT_IDS",
    "CLIENT_MODES",
    "DEFAULT_MAX_BUFFERED_BYTES",
    "DEFAULT_MAX_PAYLOAD",
    "DEFAULT_TICK_INTERVAL_MS",
    "EVENTS",
    "MAX_FRAME_DEPTH",
    "METHOD_SCOPES",
    "OPERATOR_SCOPES",
    "PREAUTH_MAX_PAYLOAD",
    "PROTOCOL_VERSION",
    "SCOPED_CLIENTS",
    "ChannelIdentityParams",
    "ChatAbortParams",
    "ChatHistoryParams",
    "ChatSendParams",
    "ClientInfo",
    "ConnectAuth",
    "ConnectParams",
    "ErrorCode",
    "FrameError",
    "HookAgentParams",
    "MissingScopeError",
    "OperatorScope",
    "ParamsError",
    "ProtocolError",
    "RequestFrame",
    "SessionsListParams",
    "SessionsResetParams",
    "SessionsSubscribeParams",
    "UsersIdentityParams",
    "UsersListIdentitiesParams",
    "UsersSetRoleParams",
    "event_frame",
    "granted_scopes",
    "missing_scope",
    "parse_params",
    "parse_request_frame",
    "response_error",
    "response_ok",
    "scope_satisfied",
]

#: The one protocol version this gateway speaks.
PROTOCOL_VERSION: Final = 4

#: ``policy.maxPayload``: the largest frame accepted, in bytes (OpenClaw's value).
DEFAULT_MAX_PAYLOAD: Final = 25 * 1024 * 1024

#: The largest frame accepted before the handshake has succeeded, in bytes (OpenClaw's ``MAX_PREAUTH_PAYLOAD_BYTES``).
#: A ``connect`` request is a few hundred bytes; the cap keeps an unauthenticated peer from making the gateway
#: buffer ``maxPayload``.
PREAUTH_MAX_PAYLOAD: Final = 64 * 1024

#: How deeply arrays and objects may nest in any frame, before or after the handshake. The deepest legitimate
#: request (``chat.send`` params, a ``connect`` with its ``client`` and ``auth``) nests three levels.
MAX_FRAME_DEPTH: Final = 64

#: ``policy.maxBufferedBytes``: how much unsent output a connection may hold before it is closed as too slow.
DEFAULT_MAX_BUFFERED_BYTES: Final = 50 * 1024 * 1024

#: ``policy.tickIntervalMs``: the interval of ``tick`` events.
DEFAULT_TICK_INTERVAL_MS: Final = 30_000

ErrorCode = Literal["INVALID_REQUEST", "FORBIDDEN", "UNAVAILABLE"]
"""The wire error codes this gateway sends; ``details.code`` refines some of them."""

#: ``(client id, mode)`` pairs that keep the scopes they ask for without a device identity.
SCOPED_CLIENTS: Final[frozenset[tuple[str, str]]] = frozenset({("gateway-client", "backend"), ("cli", "cli")})

OperatorScope = Literal["operator.admin", "operator.write", "operator.read"]
"""OpenClaw's operator scopes: ``operator.admin`` grants every scope, ``operator.write`` also grants read."""

#: The operator scopes, strongest first.
OPERATOR_SCOPES: Final[tuple[OperatorScope, ...]] = get_args(OperatorScope)

#: The scope each method needs (see :func:`scope_satisfied`).
METHOD_SCOPES: Final[Mapping[str, OperatorScope]] = {
    "chat.send": "operator.write",
    "chat.abort": "operator.write",
    "chat.history": "operator.read",
    "sessions.list": "operator.read",
    "sessions.messages.subscribe": "operator.read",
    "sessions.messages.unsubscribe": "operator.read",
    "sessions.reset": "operator.admin",
    "users.setRole": "operator.admin",
    "users.linkChannelIdentity": "operator.admin",
    "users.unlinkChannelIdentity": "operator.admin",
    "users.listChannelIdentities": "operator.admin",
}

#: The events a connection may receive.
EVENTS: Final[tuple[str, ...]] = ("connect.challenge", "chat", "chat.metadata.changed", "agent", "tick")


class ProtocolError(GatewayError):
    """A request the gateway refuses: ``wire_code`` and ``details`` become the ``res`` frame's ``error``."""

    code = "protocol_error"

    def __init__(self, wire_code: ErrorCode, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.wire_code: ErrorCode = wire_code
        self.details: dict[str, Any] | None = None if details is None else dict(details)

    def to_shape(self) -> dict[str, Any]:
        """``{"code", "message"}`` plus ``details`` when present."""
        shape: dict[str, Any] = {"code": self.wire_code, "message": self.message}
        if self.details is not None:
            shape["details"] = self.details
        return shape


class MissingScopeError(ProtocolError):
    """The connection lacks ``scope``, which the method or the command it sent needs."""

    def __init__(self, scope: OperatorScope) -> None:
        super().__init__(
            "FORBIDDEN",
            f"missing scope: {scope}",
            details={"code": "MISSING_SCOPE", "missingScope": scope, "requiredScopes": [scope]},
        )
        self.scope: OperatorScope = scope


class FrameError(ProtocolError):
    """An incoming frame is not a well-formed ``req`` frame; ``frame_id`` is its ``id`` when one could be read."""

    def __init__(self, problem: str, frame_id: str | None = None) -> None:
        super().__init__("INVALID_REQUEST", f"invalid request frame: {problem}")
        self.frame_id = frame_id


class ParamsError(ProtocolError):
    """The parameters of a request do not match the method's schema."""

    def __init__(self, what: str, pointer: str, problem: str) -> None:
        where = pointer or "root"
        super().__init__("INVALID_REQUEST", f"invalid {what} params: at {where}: {problem}")
        self.pointer = pointer


# --------------------------------------------------------------------------------------------------------------------
# Frames


@dataclass(frozen=True, slots=True)
class RequestFrame:
    """A well-formed ``req`` frame; ``params`` is whatever the client sent (checked per method)."""

    id: str
    method: str
    params: object


def parse_request_frame(text: str | bytes, *, max_bytes: int = DEFAULT_MAX_PAYLOAD) -> RequestFrame:
    """Parse one incoming frame; raise :class:`FrameError` (``INVALID_REQUEST``) unless it is a ``req`` frame.

    The frame is parsed strictly (:mod:`clawstack.common.strictjson`): at most ``max_bytes`` of UTF-8, nested at
    most :data:`MAX_FRAME_DEPTH` deep (checked before decoding), no duplicate keys, lone surrogates, ``NaN`` or
    integers beyond ±(2^53−1). Problems are named without quoting the frame's values.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    try:
        frame = strictjson.loads(data, max_bytes=max_bytes, max_depth=MAX_FRAME_DEPTH)
    except strictjson.StrictJSONError as exc:
        raise FrameError(_json_problem(exc, max_bytes)) from None
    if not isinstance(frame, dict):
        raise FrameError("must be object")
    raw_id = frame.get("id")
    frame_id = raw_id if isinstance(raw_id, str) and raw_id else None
    if frame.get("type") != "req":
        raise FrameError('at /type: must be equal to "req"', frame_id)
    if frame_id is None:
        raise FrameError("at /id: must be a non-empty string")
    method = frame.get("method")
    if not isinstance(method, str) or not method:
        raise FrameError("at /method: must be a non-empty string", frame_id)
    unexpected = sorted(set(frame) - {"type", "id", "method", "params"})
    if unexpected:
        raise FrameError(f"at root: unexpected property {unexpected[0]!r}", frame_id)
    return RequestFrame(frame_id, method, frame.get("params", {}))


def _json_problem(exc: strictjson.StrictJSONError, max_bytes: int) -> str:
    """What is wrong with a frame the strict parser refused, in :class:`FrameError`'s words."""
    if exc.code == "json_too_large":
        return f"larger than {max_bytes} bytes"
    if exc.code == "json_too_deep":
        return f"nested deeper than {MAX_FRAME_DEPTH} levels"
    if exc.code in ("json_syntax", "json_invalid_utf8"):
        return "not JSON"
    return exc.message  # duplicate key (named, truncated), lone surrogate, integer range, NaN / Infinity


def response_ok(frame_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A successful ``res`` frame."""
    return {"type": "res", "id": frame_id, "ok": True, "payload": dict(payload)}


def response_error(frame_id: str | None, error: ProtocolError) -> dict[str, Any]:
    """A failed ``res`` frame; ``frame_id`` is ``None`` when the request had no readable id."""
    return {"type": "res", "id": frame_id, "ok": False, "error": error.to_shape()}


def event_frame(event: str, payload: Mapping[str, Any], seq: int | None) -> dict[str, Any]:
    """An ``event`` frame; ``seq`` is left out only for ``connect.challenge``."""
    frame: dict[str, Any] = {"type": "event", "event": event, "payload": dict(payload)}
    if seq is not None:
        frame["seq"] = seq
    return frame


# --------------------------------------------------------------------------------------------------------------------
# Parameters


class _Params(BaseModel):
    """Base of every parameter schema: closed objects, no coercion, inputs never echoed in errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)


NonEmpty = Annotated[StrictStr, Field(min_length=1)]
ClientId = Literal[
    "webchat-ui",
    "openclaw-control-ui",
    "webchat",
    "cli",
    "gateway-client",
    "openclaw-macos",
    "openclaw-ios",
    "openclaw-android",
    "node-host",
    "test",
    "fingerprint",
    "openclaw-probe",
]
ClientMode = Literal["webchat", "cli", "ui", "backend", "node", "probe", "test"]

#: The client ids a ``connect`` may name (anything else is refused as invalid params).
CLIENT_IDS: Final[tuple[str, ...]] = get_args(ClientId)

#: The client modes a ``connect`` may name.
CLIENT_MODES: Final[tuple[str, ...]] = get_args(ClientMode)

P = TypeVar("P", bound="_Params")


class ClientInfo(_Params):
    """``connect.params.client``: who is connecting."""

    id: ClientId
    mode: ClientMode
    version: NonEmpty
    platform: NonEmpty
    displayName: NonEmpty | None = None
    instanceId: NonEmpty | None = None


class ConnectAuth(_Params):
    """``connect.params.auth``: the shared secret, as a token or a password."""

    token: StrictStr | None = None
    password: StrictStr | None = None


class ConnectParams(_Params):
    """``connect.params``, a closed object."""

    minProtocol: Annotated[StrictInt, Field(ge=1)]
    maxProtocol: Annotated[StrictInt, Field(ge=1)]
    client: ClientInfo
    role: Literal["operator"] = "operator"
    scopes: list[NonEmpty] = Field(default_factory=list)
    caps: list[NonEmpty] = Field(default_factory=list)
    auth: ConnectAuth | None = None
    locale: StrictStr | None = None
    userAgent: StrictStr | None = None
    device: dict[str, Any] | None = None


class ChatSendParams(_Params):
    """``chat.send``: one user message for a session; ``idempotencyKey`` becomes the run id."""

    sessionKey: NonEmpty
    message: NonEmpty
    idempotencyKey: Annotated[StrictStr, Field(min_length=1, max_length=256)]


class ChatHistoryParams(_Params):
    """``chat.history``: a window of a session's transcript, counted back from the newest message."""

    sessionKey: NonEmpty
    limit: Annotated[StrictInt, Field(ge=1, le=1000)] = 200
    offset: Annotated[StrictInt, Field(ge=0)] = 0
    maxChars: Annotated[StrictInt, Field(ge=1)] | None = None


class ChatAbortParams(_Params):
    """``chat.abort``: cancel the session's runs, or only ``runId``."""

    sessionKey: NonEmpty
    runId: NonEmpty | None = None


class HookAgentParams(_Params):
    """The body of ``POST <hooks.path>/agent`` (the HTTP hooks endpoint, not a WebSocket method)."""

    message: NonEmpty
    name: NonEmpty | None = None
    agentId: NonEmpty | None = None
    sessionKey: NonEmpty | None = None
    deliver: StrictBool = True
    timeoutSeconds: Annotated[StrictInt, Field(ge=1, le=3600)] | None = None
    idempotencyKey: Annotated[StrictStr, Field(min_length=1, max_length=256)] | None = None


class SessionsListParams(_Params):
    """``sessions.list``: live sessions, most recently updated first."""

    limit: Annotated[StrictInt, Field(ge=1, le=1000)] = 100
    agentId: NonEmpty | None = None


class SessionsResetParams(_Params):
    """``sessions.reset``: start a new incarnation of one session."""

    key: NonEmpty


class UsersSetRoleParams(_Params):
    """``users.setRole``: give an operator exactly one role (``None``: none at all)."""

    profileId: NonEmpty
    role: OperatorScope | None


class ChannelIdentityParams(_Params):
    """A channel identity: the channel adapter's name and its verified sender id."""

    channelId: NonEmpty
    senderId: NonEmpty
    accountId: NonEmpty | None = None


class UsersIdentityParams(_Params):
    """``users.linkChannelIdentity`` / ``users.unlinkChannelIdentity``."""

    profileId: NonEmpty
    identity: ChannelIdentityParams


class UsersListIdentitiesParams(_Params):
    """``users.listChannelIdentities``."""

    profileId: NonEmpty


class SessionsSubscribeParams(_Params):
    """``sessions.messages.subscribe`` / ``unsubscribe``: one session's ``chat`` and ``agent`` events."""

    sessionKey: NonEmpty


_TYPE_NAMES: Final[Mapping[str, str]] = {
    "string_type": "must be string",
    "int_type": "must be integer",
    "bool_type": "must be boolean",
    "list_type": "must be array",
    "tuple_type": "must be array",
    "dict_type": "must be object",
    "model_type": "must be object",
    "model_attributes_type": "must be object",
    "literal_error": "must be equal to one of the allowed values",
}


def _pointer(loc: tuple[int | str, ...]) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in loc)


def _problem(error: Mapping[str, Any]) -> tuple[str, str]:
    """``(JSON pointer, problem)`` for one pydantic error, in the words of a JSON Schema validator."""
    loc: tuple[int | str, ...] = tuple(error["loc"])
    kind: str = error["type"]
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if kind == "missing":
        return _pointer(loc[:-1]), f"must have required property {str(loc[-1])!r}"
    if kind == "extra_forbidden":
        return _pointer(loc[:-1]), f"unexpected property {str(loc[-1])!r}"
    if kind == "string_too_short":
        return _pointer(loc), f"must NOT have fewer than {ctx.get('min_length')} characters"
    if kind == "string_too_long":
        return _pointer(loc), f"must NOT have more than {ctx.get('max_length')} characters"
    if kind == "greater_than_equal":
        return _pointer(loc), f"must be >= {ctx.get('ge')}"
    if kind == "less_than_equal":
        return _pointer(loc), f"must be <= {ctx.get('le')}"
    return _pointer(loc), _TYPE_NAMES.get(kind, "is invalid")


def parse_params(model: type[P], what: str, params: object) -> P:
    """Validate ``params`` against ``model``; raise :class:`ParamsError` naming the first problem's JSON pointer."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ParamsError(what, "", "must be object")
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        pointer, problem = _problem(exc.errors()[0])
        raise ParamsError(what, pointer, problem) from None


# --------------------------------------------------------------------------------------------------------------------
# Scopes


def granted_scopes(params: ConnectParams) -> tuple[str, ...]:
    """The scopes a connection gets: what it asked for if its ``(id, mode)`` may keep scopes, else none.

    Device identities are not supported, so a ``device`` object grants nothing either.
    """
    if (params.client.id, params.client.mode) in SCOPED_CLIENTS:
        return tuple(dict.fromkeys(params.scopes))
    return ()


def scope_satisfied(held: Iterable[str], needed: str) -> bool:
    """Whether ``held`` grants ``needed``: ``operator.admin`` grants all, ``operator.write`` grants ``operator.read``."""
    scopes = frozenset(held)
    return "operator.admin" in scopes or needed in scopes or (needed == "operator.read" and "operator.write" in scopes)


def missing_scope(method: str, scopes: tuple[str, ...]) -> OperatorScope | None:
    """The scope ``method`` needs that ``scopes`` lacks, or ``None`` when it may be called."""
    needed = METHOD_SCOPES.get(method)
    if needed is None or scope_satisfied(scopes, needed):
        return None
    return needed

"""The gateway's protocol methods: what each request a connection may make does, and what it answers.

:class:`GatewayMethods` answers ``chat.send``, ``chat.history``, ``chat.abort``, ``sessions.list``,
``sessions.reset``, ``sessions.messages.subscribe`` / ``unsubscribe`` and the ``users.*`` admin methods, once the
server (:mod:`clawstack.gateway.server`) has checked the connection's scopes.

Runs: ``chat.send`` starts a run on the server's :class:`~clawstack.gateway.runner.GatewayRuns` (its id is the
idempotency key) and answers ``started``; its events go to every connection subscribed to the session, which
``chat.send`` subscribes the sender to. ``chat.abort`` answers once the run is recorded ``aborted`` and the
``aborted`` event is sent.

Commands: a message that is a built-in command (``/stop``, ``/reset``, … see :mod:`clawstack.gateway.commands`)
runs that command. A message ``/<name> [args]`` naming a registered plugin command runs that command instead of an
agent turn, under the same run contract; an unknown ``/<name>`` is an ordinary agent turn. Channel messages
(:mod:`clawstack.gateway.http_routes`) go through the same command handling. Before anything else, ``chat.send``
checks the connection's scopes against the scope its message needs (:meth:`GatewayMethods.required_scope`); a
refusal is ``FORBIDDEN`` / ``MISSING_SCOPE``, as for a method, and nothing is done: no subscription, no run, no
reset.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from clawstack.common.clock import Clock
from clawstack.gateway.authority import OPERATOR_SCOPES, ChannelIdentity, OperatorAuthority
from clawstack.gateway.commands import (
    COMMAND_SCOPES,
    PLUGIN_COMMAND_SCOPES,
    RESERVED_COMMANDS,
    BuiltinCommands,
    split_command,
)
from clawstack.gateway.config import GatewayConfig, split_model_ref
from clawstack.gateway.dispatch import GATEWAY_OPERATOR, IdempotencyConflictError, Requester, RunRequest
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import SessionKeyError, parse_session_key
from clawstack.gateway.plugins import PluginLoader, RegisteredCommand
from clawstack.gateway.protocol import (
    METHOD_SCOPES,
    ChatAbortParams,
    ChatHistoryParams,
    ChatSendParams,
    MissingScopeError,
    OperatorScope,
    ProtocolError,
    RequestFrame,
    SessionsListParams,
    SessionsResetParams,
    SessionsSubscribeParams,
    UsersIdentityParams,
    UsersListIdentitiesParams,
    UsersSetRoleParams,
    parse_params,
    scope_satisfied,
)
from clawstack.gateway.runner import GatewayRuns
from clawstack.gateway.sessions import Message, SessionStore

__all__ = ["Caller", "GatewayMethods"]


class Caller(Protocol):
    """The connection a request came on, as the methods see it."""

    @property
    def scopes(self) -> tuple[str, ...]:
        """The operator scopes granted at the handshake."""
        ...

    @property
    def connected(self) -> bool:
        """Whether the connection is authenticated."""
        ...

    @property
    def subscriptions(self) -> set[str]:
        """The session keys whose events the connection receives."""
        ...


class GatewayMethods:
    """The protocol methods of a running gateway; see the module docstring.

    ``require_runs`` returns the server's runs, or raises ``UNAVAILABLE`` once the server is stopping; ``plugins``
    holds the registered plugin commands; ``clock`` timestamps ``sessions.list``.
    """

    def __init__(
        self,
        config: GatewayConfig,
        store: SessionStore,
        *,
        require_runs: Callable[[], GatewayRuns],
        authority: OperatorAuthority,
        builtins: BuiltinCommands,
        plugins: PluginLoader,
        clock: Clock,
    ) -> None:
        self._config = config
        self._store = store
        self._require_runs = require_runs
        self._authority = authority
        self._builtins = builtins
        self._plugins = plugins
        self._clock = clock

    async def call(self, caller: Caller, frame: RequestFrame) -> Mapping[str, Any]:
        """Answer a request whose method exists and is within the caller's scopes: its ``res`` frame's payload."""
        method = frame.method
        if method == "chat.send":
            return await self._chat_send(caller, parse_params(ChatSendParams, method, frame.params))
        if method == "chat.history":
            return await self._chat_history(parse_params(ChatHistoryParams, method, frame.params))
        if method == "chat.abort":
            return await self._chat_abort(parse_params(ChatAbortParams, method, frame.params))
        if method == "sessions.list":
            return await self._sessions_list(parse_params(SessionsListParams, method, frame.params))
        if method.startswith("users."):
            return self._users(method, frame.params)
        if method == "sessions.reset":
            return await self._sessions_reset(parse_params(SessionsResetParams, method, frame.params))
        params = parse_params(SessionsSubscribeParams, method, frame.params)
        key = _session_key(params.sessionKey)
        if method == "sessions.messages.subscribe":
            caller.subscriptions.add(key)
            return {"subscribed": True, "sessionKey": key}
        caller.subscriptions.discard(key)
        return {"subscribed": False, "sessionKey": key}

    async def builtin(self, request: RunRequest, requester: Requester) -> dict[str, Any] | None:
        """Run a built-in command (``/stop``, ``/reset``, … see :mod:`clawstack.gateway.commands`); its
        ``chat.send`` answer, or ``None`` when the message is no built-in. ``/stop``, ``/reset`` and ``/new`` need
        an authenticated sender (``FORBIDDEN`` otherwise)."""
        name, _, args = self._parse(request.message)
        if name is None:
            return None
        runs, store = self._require_runs(), self._store
        key = request.session_key
        if name in ("stop", "reset", "new") and not requester.authenticated:
            raise ProtocolError(
                "FORBIDDEN",
                f"command /{name} needs an authenticated sender",
                details={"code": "COMMAND_AUTH_REQUIRED", "command": name},
            )
        if name == "stop":
            run_ids = await runs.abort(key)
            return {"ok": True, "aborted": bool(run_ids), "runIds": run_ids}
        if name in ("reset", "new"):
            if request.idempotency_key is not None and await runs.known_run(key, request.idempotency_key):
                started = await runs.start(request, requester=requester, builtin=_fixed(""))
                return {"runId": started.run_id, "status": started.status}
            session = await asyncio.to_thread(store.get, key)
            if session is not None and session.owner is not None:
                raise ProtocolError("FORBIDDEN", "the session belongs to someone else")
            await runs.abort(key)
            if session is not None:
                await asyncio.to_thread(store.reset, key)
            text = "✅ Session reset." if name == "reset" else "✅ New session started."
            started = await runs.start(request, requester=requester, builtin=_fixed(text))
            return {"runId": started.run_id, "status": started.status}
        answer = self._builtins.answer(name, args, key, request.agent_id, run_id=request.idempotency_key)
        started = await runs.start(request, requester=requester, builtin=answer)
        return {"runId": started.run_id, "status": started.status}

    def find_command(self, message: str, *, authenticated: bool) -> tuple[RegisteredCommand | None, str]:
        """The plugin command ``message`` invokes and its arguments, or ``(None, "")`` for an agent turn.

        Refuses (``INVALID_REQUEST``) arguments to a command without ``accepts_args`` and a ``require_auth``
        command from an unauthenticated connection.
        """
        _, command, args = self._parse(message)
        if command is None:
            return None, ""
        if args and not command.accepts_args:
            raise ProtocolError(
                "INVALID_REQUEST",
                f"command /{command.name} takes no arguments",
                details={"code": "COMMAND_NO_ARGS", "command": command.name},
            )
        if command.require_auth and not authenticated:
            raise ProtocolError(
                "FORBIDDEN",
                f"command /{command.name} needs an authenticated sender",
                details={"code": "COMMAND_AUTH_REQUIRED", "command": command.name},
            )
        return command, args

    def required_scope(self, message: str) -> OperatorScope:
        """The operator scope a Gateway client needs to send ``message`` with ``chat.send``: the built-in
        command's (:data:`~clawstack.gateway.commands.COMMAND_SCOPES`), the plugin command's by its
        ``require_auth`` (:data:`~clawstack.gateway.commands.PLUGIN_COMMAND_SCOPES`), else ``chat.send``'s own."""
        builtin, command, _ = self._parse(message)
        if builtin is not None:
            return COMMAND_SCOPES[builtin]
        if command is not None:
            return PLUGIN_COMMAND_SCOPES[command.require_auth]
        return METHOD_SCOPES["chat.send"]

    def _parse(self, message: str) -> tuple[str | None, RegisteredCommand | None, str]:
        """What ``message`` runs: ``(built-in name, None, args)``, ``(None, plugin command, args)``, or
        ``(None, None, "")`` for an agent turn. Built-in names match lower-cased; plugin command names as written."""
        parsed = split_command(message)
        if parsed is None:
            return None, None, ""
        name, args = parsed
        if name.lower() in RESERVED_COMMANDS:
            return name.lower(), None, args
        command = self._plugins.commands.get(name)
        return (None, None, "") if command is None else (None, command, args)

    async def _chat_send(self, caller: Caller, params: ChatSendParams) -> Mapping[str, Any]:
        needed = self.required_scope(params.message)
        if not scope_satisfied(caller.scopes, needed):
            raise MissingScopeError(needed)
        key = _session_key(params.sessionKey)
        parsed = parse_session_key(key)
        if parsed.agent_id is None:
            raise ProtocolError("INVALID_REQUEST", "chat.send needs an agent session key (agent:<id>:…)")
        try:
            self._config.agent(parsed.agent_id)
        except KeyError:
            raise ProtocolError("INVALID_REQUEST", f"unknown agent: {parsed.agent_id}") from None
        caller.subscriptions.add(key)
        request = RunRequest(key, parsed.agent_id, params.message, "main", idempotency_key=params.idempotencyKey)
        requester = Requester(
            key, parsed.agent_id, "gateway", authenticated=True, operator=GATEWAY_OPERATOR, scopes=caller.scopes
        )
        try:
            builtin = await self.builtin(request, requester)
            if builtin is not None:
                return builtin
            command, command_args = self.find_command(params.message, authenticated=caller.connected)
            started = await self._require_runs().start(
                request, requester=requester, command=command, command_args=command_args
            )
        except IdempotencyConflictError as exc:
            raise ProtocolError(
                "INVALID_REQUEST", exc.message, details={"code": exc.code, "reason": "chat-request-conflict"}
            ) from None
        return {"runId": started.run_id, "status": started.status}

    async def _chat_history(self, params: ChatHistoryParams) -> Mapping[str, Any]:
        key = _session_key(params.sessionKey)
        store = self._store
        session = await asyncio.to_thread(store.get, key)
        page = await asyncio.to_thread(
            store.history, key, limit=params.limit, offset=params.offset, max_chars=params.maxChars
        )
        active = self._require_runs().active_run_ids(key)
        result: dict[str, Any] = {
            "sessionKey": key,
            "sessionId": None if session is None else session.session_id,
            "messages": [self._message_to_wire(message) for message in page.messages],
            "hasMore": page.has_more,
            "totalMessages": page.total,
            "sessionInfo": {"key": key, "hasActiveRun": bool(active), "activeRunIds": active},
        }
        if session is not None:
            result["sessionInfo"].update(
                {"agentId": session.agent_id, "createdAt": session.created_at_ms, "updatedAt": session.updated_at_ms}
            )
            defaults = self._model_defaults(session.agent_id)
            if defaults is not None:
                result["defaults"] = defaults
        if page.has_more:
            result["nextOffset"] = params.offset + len(page.messages)
        return result

    def _model_defaults(self, agent_id: str) -> dict[str, Any] | None:
        """``chat.history``'s ``defaults``: the provider, model and context window the agent's turns start on."""
        try:
            ref = self._config.agent_model(agent_id).chain[0]
            _, model = self._config.resolve_model(ref)
        except (KeyError, ValueError):
            return None
        defaults: dict[str, Any] = {"modelProvider": split_model_ref(ref)[0], "model": model.id}
        if model.context_window is not None:
            defaults["contextTokens"] = model.context_window
        return defaults

    def _message_to_wire(self, message: Message) -> dict[str, Any]:
        wire = message.to_wire()
        if message.role == "assistant" and message.provider is not None:
            provider = self._config.models.providers.get(message.provider)
            if provider is not None:
                wire["api"] = provider.api
        return wire

    async def _chat_abort(self, params: ChatAbortParams) -> Mapping[str, Any]:
        key = _session_key(params.sessionKey)
        run_ids = await self._require_runs().abort(key, params.runId)
        return {"ok": True, "aborted": bool(run_ids), "runIds": run_ids}

    def _users(self, method: str, raw: object) -> Mapping[str, Any]:
        """The operator-authority admin methods (OpenClaw's ``users.*`` names and shapes). A change applies at
        once: work retained under authority it takes away is revoked. Changes live until the next restart or
        config reload, which start again from the config's ``operators``."""
        authority = self._authority
        try:
            if method == "users.setRole":
                role = parse_params(UsersSetRoleParams, method, raw)
                change = authority.set_roles(role.profileId, [] if role.role is None else [role.role])
                roles = next(e.roles for e in authority.operators if e.name == role.profileId)
                return {
                    "ok": True,
                    "profileId": role.profileId,
                    "roles": [r for r in OPERATOR_SCOPES if r in roles],
                    "changed": change.changed,
                    "revoked": len(change.revocations),
                }
            if method == "users.listChannelIdentities":
                listed = parse_params(UsersListIdentitiesParams, method, raw)
                links = [
                    {"channelId": i.channel, "senderId": i.sender_id} for i in authority.links_of(listed.profileId)
                ]
                return {"profileId": listed.profileId, "links": links}
            params = parse_params(UsersIdentityParams, method, raw)
            identity = ChannelIdentity(params.identity.channelId, params.identity.senderId)
            if method == "users.linkChannelIdentity":
                change = authority.link(params.profileId, identity)
                return {"ok": True, "changed": change.changed, "revoked": len(change.revocations)}
            change = authority.unlink(params.profileId, identity)
            return {"ok": True, "removed": change.changed, "revoked": len(change.revocations)}
        except GatewayError as exc:
            if isinstance(exc, ProtocolError):
                raise
            raise ProtocolError("INVALID_REQUEST", exc.message, details={"code": exc.code}) from None

    async def _sessions_reset(self, params: SessionsResetParams) -> Mapping[str, Any]:
        """Abort the session's runs and start its new incarnation (a new ``sessionId``, an empty transcript)."""
        key = _session_key(params.key)
        store = self._store
        session = await asyncio.to_thread(store.get, key)
        if session is None:
            raise ProtocolError("INVALID_REQUEST", f"no session has the key {key}")
        if session.owner is not None:
            raise ProtocolError("FORBIDDEN", "the session belongs to someone else")
        await self._require_runs().abort(key)
        fresh = await asyncio.to_thread(store.reset, key)
        entry = {"sessionId": fresh.session_id, "createdAt": fresh.created_at_ms, "updatedAt": fresh.updated_at_ms}
        return {"ok": True, "key": key, "entry": entry}

    async def _sessions_list(self, params: SessionsListParams) -> Mapping[str, Any]:
        store = self._store
        sessions = await asyncio.to_thread(store.list, agent_id=params.agentId, limit=params.limit)
        busy = self._require_runs().busy_sessions()
        rows = [
            {
                "key": session.key,
                "kind": parse_session_key(session.key).kind,
                "agentId": session.agent_id,
                "sessionId": session.session_id,
                "label": session.label,
                "createdAt": session.created_at_ms,
                "updatedAt": session.updated_at_ms,
                "hasActiveRun": session.key in busy,
            }
            for session in sessions
        ]
        return {"ts": self._now_ms(), "count": len(rows), "sessions": rows}

    def _now_ms(self) -> int:
        return int(self._clock.now().timestamp() * 1000)


def _fixed(text: str) -> Callable[[], Awaitable[str]]:
    async def answer() -> str:
        return text

    return answer


def _session_key(raw: str) -> str:
    try:
        return str(parse_session_key(raw))
    except SessionKeyError as exc:
        raise ProtocolError("INVALID_REQUEST", f"invalid sessionKey: {exc.message}") from None

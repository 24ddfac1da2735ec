"""The gateway's HTTP endpoints beside the WebSocket: the hook trigger and the webhook channel's inbound messages.

:class:`HttpRoutes` adds them to the server's aiohttp router (:mod:`clawstack.gateway.server`):

* with ``hooks.enabled``, ``POST <hooks.path>/agent`` starts an HTTP hook turn on the reserved ``cron`` slot;
* with ``channels.webhook.enabled``, ``POST <channels.webhook.path>`` takes signed messages from a bridge
  (:mod:`clawstack.gateway.channels`); each runs like a ``chat.send`` on the sender's channel session (commands
  included, see :mod:`clawstack.gateway.methods`), with the sender's channel authority, and its final answer (and
  announcements to that sender) go back out on the channel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Final

from aiohttp import web

from clawstack.common.ids import new_uuid, secrets_equal
from clawstack.gateway.channels import WebhookChannel, WebhookError
from clawstack.gateway.config import GatewayConfig
from clawstack.gateway.dispatch import (
    IdempotencyConflictError,
    Requester,
    RunRequest,
    TurnOptions,
    wrap_external_content,
)
from clawstack.gateway.errors import GatewayError
from clawstack.gateway.keys import main_key
from clawstack.gateway.methods import GatewayMethods
from clawstack.gateway.protocol import HookAgentParams, ProtocolError, parse_params
from clawstack.gateway.runner import GatewayRuns, RunsClosedError

__all__ = ["HttpRoutes"]

#: The largest body ``POST <hooks.path>/agent`` accepts.
_HOOK_MAX_BODY: Final = 256 * 1024


class HttpRoutes:
    """The hook and webhook-channel endpoints of a running gateway; see the module docstring.

    ``require_runs`` returns the server's runs, or raises ``UNAVAILABLE`` once the server is stopping; ``methods``
    runs the commands a channel message may be; ``webhook`` is the channel when ``channels.webhook.enabled``.
    """

    def __init__(
        self,
        config: GatewayConfig,
        methods: GatewayMethods,
        *,
        require_runs: Callable[[], GatewayRuns],
        webhook: WebhookChannel | None,
    ) -> None:
        self._config = config
        self._methods = methods
        self._require_runs = require_runs
        self._webhook = webhook

    def add_to(self, router: web.UrlDispatcher) -> None:
        """Add the endpoints the config enables to ``router``."""
        if self._config.hooks.enabled:
            router.add_post(f"{self._config.hooks.path}/agent", self.hook_agent)
        if self._webhook is not None:
            router.add_post(self._config.channels.webhook.path, self.webhook_inbound)

    async def hook_agent(self, request: web.Request) -> web.Response:
        """``POST <hooks.path>/agent``: an external trigger's agent turn on the reserved ``cron`` slot.

        Body: ``{message, name?, agentId? = the default agent, sessionKey? (hook:…), deliver? = true, timeoutSeconds?,
        idempotencyKey?}``; ``Authorization: Bearer <hooks.token>``. Answers 202 ``{ok: true, runId}``; 401 for a
        missing or wrong token, 400 ``{ok: false, error}`` for a bad body, 413 past 256 KiB.
        """
        token = self._config.hooks.token
        offered = request.headers.get("Authorization", "")
        scheme, _, value = offered.partition(" ")
        if token is None or scheme.lower() != "bearer" or not secrets_equal(value.strip(), token.get_secret_value()):
            return web.json_response({"ok": False, "error": "unauthorized"}, status=401)
        if request.content_length is not None and request.content_length > _HOOK_MAX_BODY:
            return web.json_response({"ok": False, "error": "body too large"}, status=413)
        raw = await request.content.read(_HOOK_MAX_BODY + 1)
        if len(raw) > _HOOK_MAX_BODY:
            return web.json_response({"ok": False, "error": "body too large"}, status=413)
        try:
            body = parse_params(HookAgentParams, "hooks.agent", json.loads(raw))
            session_key = body.sessionKey or f"hook:http:{new_uuid()}"
            if not session_key.startswith("hook:"):
                raise ProtocolError("INVALID_REQUEST", "sessionKey must begin with hook:")
            agent_id = body.agentId or self._config.default_agent_id
            started = await self._require_runs().start_run(
                RunRequest(
                    session_key=session_key,
                    agent_id=agent_id,
                    message=wrap_external_content(body.message, source="webhook", name=body.name),
                    lane="cron",
                    options=TurnOptions(timeout_s=body.timeoutSeconds),
                    idempotency_key=body.idempotencyKey,
                    announce_to=Requester(main_key(agent_id), agent_id, "gateway", authenticated=False),
                    deliver=body.deliver,
                    reserved=True,
                    label=body.name,
                )
            )
        except RunsClosedError as exc:
            return web.json_response({"ok": False, "error": exc.message}, status=503)
        except (ValueError, GatewayError) as exc:
            message = exc.message if isinstance(exc, GatewayError) else "invalid request body"
            return web.json_response({"ok": False, "error": message}, status=400)
        return web.json_response({"ok": True, "runId": started.run_id}, status=202)

    async def webhook_inbound(self, request: web.Request) -> web.Response:
        """``POST <channels.webhook.path>``: a signed channel message, run like ``chat.send`` on its sender's session.

        Answers 202 ``{ok: true, runId, status}`` (a redelivered ``messageId`` gets its first run); 202
        ``{ok: false, error}`` for a command the sender may not run (the refusal also goes out on the channel);
        401/400/413 ``{ok: false, error: {code, message}}`` for an unsigned, malformed or oversized request, with
        nothing recorded; 409 for a redelivered ``messageId`` with different text; 503 while the gateway is stopping.
        """
        channel = self._webhook
        assert channel is not None  # the route exists only with the channel
        try:
            inbound = await channel.receive(request)
        except WebhookError as exc:
            return web.json_response({"ok": False, "error": exc.to_dict()}, status=exc.status)
        try:
            builtin = await self._methods.builtin(inbound.run_request, inbound.requester)
            if builtin is not None:
                return web.json_response({"ok": True, **builtin}, status=202)
            command, args = self._methods.find_command(inbound.text, authenticated=inbound.requester.authenticated)
        except ProtocolError as exc:
            return web.json_response(channel.refuse(inbound, exc), status=202)
        try:
            started = await self._require_runs().start(
                inbound.run_request, requester=inbound.requester, command=command, command_args=args
            )
        except IdempotencyConflictError as exc:
            return web.json_response({"ok": False, "error": exc.to_dict()}, status=409)
        except GatewayError as exc:
            error = {"code": "unavailable", "message": exc.message}
            return web.json_response({"ok": False, "error": error}, status=503)
        return web.json_response({"ok": True, "runId": started.run_id, "status": started.status}, status=202)

"""ClawConnect's errors: each carries a stable ``code`` (and ``retryable``) as data.

::

    ClawError                              (clawstack.common.errors)
     └── ConnectError                      "connect_error"
          ├── AgentsConfigError            "agents_*": agents.json (or the environment) cannot be used
          ├── GatewayError                 "gateway_error": talking to a gateway failed
          │    ├── GatewayTransportError   "gateway_transport_lost" (retryable): no answer because the socket went
          │    ├── GatewayTimeoutError     "gateway_timeout" (retryable): no answer in time
          │    ├── HandshakeError          "gateway_handshake_refused", "gateway_handshake_timeout",
          │    │                           "gateway_handshake_invalid"
          │    └── GatewayRequestError     the gateway answered ``ok: false``; ``code`` is its wire code
          ├── JobStoreError                "job_store_unavailable", "job_store_locked", "job_store_corrupt"
          ├── AgentSessionError            "agent_session_error": the agent-session seam
          │    ├── AgentSessionRegistrationError "agent_session_registration_invalid": a runtime refused at
          │    │                           registration (bad id, duplicate id, missing or non-callable callback)
          │    └── AttachmentStoreError    "attachment_store_unavailable", "attachment_store_locked"
          └── ToolError                    a tool call refused; answered as a structured error result
               ├── "invalid_arguments", "unknown_tool", "agent_not_found", "agent_mismatch", "job_not_found",
               │   "task_not_found", "session_mismatch", "task_terminal", "gateway_unavailable"
               ├── SessionOwnedError       "session_not_found": no session of this caller has the key (another
               │                           caller's session reads exactly as one that does not exist)
               └── SessionBusyError        "session_busy" (retryable): the session's job is still running

Messages never contain a password, a token or task text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clawstack.common.errors import ClawError


class ConnectError(ClawError):
    """Base of every ClawConnect error."""

    code = "connect_error"


class AgentsConfigError(ConnectError):
    """``agents.json`` or the ``OPENCLAW_*`` environment is missing, malformed or inconsistent."""

    code = "agents_invalid"


class GatewayError(ConnectError):
    """A gateway could not be used."""

    code = "gateway_error"


class GatewayTransportError(GatewayError):
    """The WebSocket closed (or was never open) before the answer came; the request may be retried."""

    code = "gateway_transport_lost"
    retryable = True


class GatewayTimeoutError(GatewayError):
    """The gateway did not answer in time."""

    code = "gateway_timeout"
    retryable = True


class HandshakeError(GatewayError):
    """The ``connect`` handshake failed: refused, malformed, or not answered in time."""

    code = "gateway_handshake_refused"

    def __init__(self, message: str, *, code: str | None = None, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.details = dict(details or {})


class GatewayRequestError(GatewayError):
    """The gateway answered a request with ``ok: false``; ``code`` is its wire code, ``details`` its details."""

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.details = dict(details or {})


class JobStoreError(ConnectError):
    """The job store cannot be opened, read or written."""

    code = "job_store_unavailable"


class AgentSessionError(ConnectError):
    """The agent-session seam (:mod:`clawstack.connect.agent_session`)."""

    code = "agent_session_error"


class AgentSessionRegistrationError(AgentSessionError):
    """A runtime cannot be registered: a bad or duplicate id, a missing or non-callable callback."""

    code = "agent_session_registration_invalid"


class AttachmentStoreError(AgentSessionError):
    """The attachment store cannot be opened, read or written."""

    code = "attachment_store_unavailable"


class ToolError(ConnectError):
    """A tool call refused with a stable code; ``data`` adds machine-readable fields to the error result."""

    code = "invalid_arguments"

    def __init__(self, message: str, *, code: str | None = None, retryable: bool | None = None, **data: Any) -> None:
        super().__init__(message, code=code, retryable=retryable)
        self.data = data

    def to_result(self) -> dict[str, Any]:
        """The ``error`` object of a tool's error result."""
        return {"code": self.code, "message": self.message, "retryable": self.retryable, **self.data}


class SessionOwnedError(ToolError):
    """A session key that names no session of this caller: another caller's, one ClawConnect never created, or
    (for every caller but the stdio operator) any gateway session ClawConnect did not create for it."""

    code = "session_not_found"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="sessionKey")


class SessionBusyError(ToolError):
    """A task was asked for on a session whose job is still running."""

    code = "session_busy"
    retryable = True


__all__ = [
    "AgentSessionError",
    "AgentSessionRegistrationError",
    "AgentsConfigError",
    "AttachmentStoreError",
    "ConnectError",
    "GatewayError",
    "GatewayRequestError",
    "GatewayTimeoutError",
    "GatewayTransportError",
    "HandshakeError",
    "JobStoreError",
    "SessionBusyError",
    "SessionOwnedError",
    "ToolError",
]

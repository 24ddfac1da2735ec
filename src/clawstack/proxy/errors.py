"""The model proxy's exception tree.

::

    ProxyError (ClawError)                 status: int (HTTP), error_type: OpenAI envelope "type"
     ├── AuthError                         401 missing or malformed credentials
     ├── ForbiddenError                    403 unknown, revoked or expired identity, wrong secret, bad operator token
     ├── RequestError                      400 malformed or refused request (data policy, bad option)
     ├── NotFoundError                     404 unknown model or identity
     ├── ConflictError                     409 identity id reused with other content, or already revoked
     ├── UpstreamError                     502 / 504 / 429 / 400: the model chain could not serve
     ├── RevocationError                   503 the revocation directory cannot record (never acknowledged)
     ├── CapacityError                     503 the revocation bound leaves no room for a new identity
     ├── ConfigError                       the proxy's configuration is invalid (start-up only)
     ├── JournalError                      503 the trace journal cannot be written
     └── ToolError                         a managed tool descriptor or dispatch failed

Every error renders as the OpenAI envelope ``{"error":{"message","type","code"}}``, with ``param`` added when the
error is about one request field (its JSON path, e.g. ``tools[0].google_search``). Messages never contain a
token, a message body or a filesystem path.
"""

from __future__ import annotations

from typing import Any

from clawstack.common.errors import ClawError


class ProxyError(ClawError):
    """Base of the proxy's errors: a stable ``code``, an HTTP ``status`` and an OpenAI ``error_type``."""

    code = "proxy_error"
    status = 500
    error_type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, code=code, retryable=retryable)
        if status is not None:
            self.status = status
        self.param = param

    def envelope(self) -> dict[str, Any]:
        """The OpenAI-shaped error body; ``param`` names the request field at fault, when there is one."""
        error: dict[str, Any] = {"message": self.message, "type": self.error_type, "code": self.code}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}


class AuthError(ProxyError):
    code = "missing_credentials"
    status = 401
    error_type = "authentication_error"


class ForbiddenError(ProxyError):
    code = "identity_refused"
    status = 403
    error_type = "permission_error"


class RequestError(ProxyError):
    code = "invalid_request"
    status = 400
    error_type = "invalid_request_error"


class NotFoundError(ProxyError):
    code = "not_found"
    status = 404
    error_type = "invalid_request_error"


class ConflictError(ProxyError):
    code = "conflict"
    status = 409
    error_type = "invalid_request_error"


class UpstreamError(ProxyError):
    code = "upstream_unavailable"
    status = 502
    error_type = "upstream_error"
    retryable = True


class RevocationError(ProxyError):
    code = "revocation_unwritable"
    status = 503
    error_type = "server_error"
    retryable = True


class CapacityError(ProxyError):
    code = "revocation_capacity"
    status = 503
    error_type = "server_error"


class ConfigError(ProxyError):
    code = "config_invalid"
    status = 500


class JournalError(ProxyError):
    code = "journal_unwritable"
    status = 503
    error_type = "server_error"


class ToolError(ProxyError):
    code = "tool_error"
    status = 502
    error_type = "tool_error"


__all__ = [
    "AuthError",
    "CapacityError",
    "ConfigError",
    "ConflictError",
    "ForbiddenError",
    "JournalError",
    "NotFoundError",
    "ProxyError",
    "RequestError",
    "RevocationError",
    "ToolError",
    "UpstreamError",
]

"""The supervisor's exception tree: every API refusal is a :class:`RunsError` with the spec's code and status.

::

    RunsError (ClawError)        code, status, extra (fields added to the error object, e.g. current_template_id)
     ├── request_invalid 400     malformed body, unknown field, bad identifier, spec outside the subset
     ├── body_too_large 413 · body_timeout 408
     ├── digest_invalid 400 · digest_mismatch 409 · template_changed 409 · cancelled 409 · stale_generation 409
     ├── grant_exceeded 422 · template_unknown 422 · callbacks_disabled 422
     ├── template_unsupported 422 a template compiled for another backend than the supervisor runs
     ├── home_busy 409            another run reserves the home (a launch, or a home's deletion)
     ├── home_unknown 404 · deliverable_unknown 404 · deliverable_changed 409 · deliverable_too_large 413
     ├── deliverables_unreadable 503  the supervisor could not read the deliverables (never an empty list)
     ├── not_found 404 · result_unavailable 409 · method_not_allowed 405
     ├── proxy_unavailable 503    the proxy could not be reached to move a run's authority or report its
     │                            plan sign-ins (retry the call)
     ├── subscriptions_unsupported 501 (a proxy without plan routes) · internal_error 500
     └── network_unavailable 503  no address block for a compose task-home run's network, or a bad
                                  CLAW_RUN_SUBNET_BASE

Errors render as ``{"error":{"code","message",…},"run":null}`` and never echo task text or credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clawstack.common.errors import ClawError

STATUS = {
    "request_invalid": 400,
    "body_too_large": 413,
    "body_timeout": 408,
    "digest_invalid": 400,
    "digest_mismatch": 409,
    "template_changed": 409,
    "cancelled": 409,
    "stale_generation": 409,
    "grant_exceeded": 422,
    "template_unknown": 422,
    "callbacks_disabled": 422,
    "template_unsupported": 422,
    "not_found": 404,
    "result_unavailable": 409,
    "home_busy": 409,
    "home_unknown": 404,
    "deliverable_unknown": 404,
    "deliverable_changed": 409,
    "deliverable_too_large": 413,
    "deliverables_unreadable": 503,
    "network_unavailable": 503,
    "proxy_unavailable": 503,
    "subscriptions_unsupported": 501,
    "method_not_allowed": 405,
    "internal_error": 500,
}


class RunsError(ClawError):
    """An API refusal with its stable code; ``status`` follows from the code."""

    def __init__(self, code: str, message: str, *, extra: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.status = STATUS.get(code, 400)
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}, "run": None}


__all__ = ["STATUS", "RunsError"]

"""The plan route's exception tree.

::

    ProxyError (clawstack.proxy.errors)
     ├── PlanError                      reason: one of REASONS, also its ``code``
     │    ├── PlanSigninRequired        subscription_signin_required     nobody signed in, or the sign-in expired
     │    ├── PlanLimitReached          subscription_limit_reached       the plan's usage limit is spent
     │    ├── PlanUnavailable           subscription_unavailable         a temporary fault (retryable)
     │    ├── PlanNotEligible           subscription_not_eligible        the account or its policy refuses plan usage
     │    └── PlanUnsupported           subscription_unsupported_request the request uses an unsupported feature
     ├── PlanLoginError                 signin_denied | signin_failed | signin_timeout | signin_listen_failed
     └── PlanStoreError                 auth_store_unsafe | auth_store_unreadable

Messages never contain a token, an authorization code, a PKCE verifier, a state value or a store file's contents.
"""

from __future__ import annotations

from typing import Final

from clawstack.models.refs import PLAN_REASONS, PlanReason
from clawstack.proxy.errors import ProxyError

REASONS: Final = PLAN_REASONS


class PlanError(ProxyError):
    """The plan route cannot serve; :attr:`reason` (equal to ``code``) is one of :data:`REASONS`."""

    code = "subscription_unavailable"
    status = 502
    error_type = "upstream_error"

    @property
    def reason(self) -> PlanReason:
        """The plan-failure reason the chain router records."""
        return plan_reason(self.code)


class PlanSigninRequired(PlanError):
    code = "subscription_signin_required"


class PlanLimitReached(PlanError):
    code = "subscription_limit_reached"
    status = 429


class PlanUnavailable(PlanError):
    code = "subscription_unavailable"
    retryable = True


class PlanNotEligible(PlanError):
    code = "subscription_not_eligible"
    status = 403


class PlanUnsupported(PlanError):
    code = "subscription_unsupported_request"
    status = 400
    error_type = "invalid_request_error"


class PlanLoginError(ProxyError):
    """``claw proxy auth login`` did not complete."""

    code = "signin_failed"
    status = 502
    error_type = "upstream_error"


class PlanStoreError(ProxyError):
    """The sign-in store is unsafe (mode, owner, type) or unreadable. The message names the path, never contents."""

    code = "auth_store_unsafe"
    status = 503
    error_type = "server_error"


_BY_REASON: Final[dict[str, type[PlanError]]] = {
    cls.code: cls for cls in (PlanSigninRequired, PlanLimitReached, PlanUnavailable, PlanNotEligible, PlanUnsupported)
}


def plan_reason(code: str) -> PlanReason:
    """``code`` as a :data:`PlanReason`; anything unknown is ``subscription_unavailable``."""
    for reason in REASONS:
        if reason == code:
            return reason
    return "subscription_unavailable"


def plan_error(reason: PlanReason, message: str) -> PlanError:
    """The :class:`PlanError` subclass for ``reason``."""
    return _BY_REASON[reason](message)


__all__ = [
    "REASONS",
    "PlanError",
    "PlanLimitReached",
    "PlanLoginError",
    "PlanNotEligible",
    "PlanReason",
    "PlanSigninRequired",
    "PlanStoreError",
    "PlanUnavailable",
    "PlanUnsupported",
    "plan_error",
    "plan_reason",
]

"""Plan routes: serving ``chatgpt/<model>`` from the operator's ChatGPT plan through "Sign in with ChatGPT".

* :mod:`.chatgpt` holds every vendor fact: OAuth constants, the request shape, the failure table.
* :class:`AuthStore` keeps one owner-only sign-in record per provider; :func:`login` writes it.
* :class:`PlanTokens` hands out access tokens, refreshing them one at a time.

The exception tree is drawn in :mod:`.errors`. No token appears in a message, a log line or a ``repr``.
"""

import ssl
import typing

from clawstack.proxy.plan.errors import (
    REASONS,
    PlanError,
    PlanLimitReached,
    PlanLoginError,
    PlanNotEligible,
    PlanReason,
    PlanSigninRequired,
    PlanStoreError,
    PlanUnavailable,
    PlanUnsupported,
    plan_error,
)
from clawstack.proxy.plan.login import login
from clawstack.proxy.plan.store import PROVIDERS, AuthStore, SignIn, SubscriptionState, signin_state
from clawstack.proxy.plan.tokens import PlanTokens

if typing.TYPE_CHECKING:
    from clawstack.proxy.config import PlanRoute


def plan_ssl_context(route: "PlanRoute") -> ssl.SSLContext:
    """The TLS context of a plan route's sign-in, refresh and backend calls.

    Default verification against the system's CAs; with ``route.ca_file``, a context that trusts only that CA
    bundle (for tests). Hostname checking stays on either way.
    """
    if route.ca_file is None:
        return ssl.create_default_context()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=route.ca_file)
    return context


__all__ = [
    "PROVIDERS",
    "REASONS",
    "AuthStore",
    "PlanError",
    "PlanLimitReached",
    "PlanLoginError",
    "PlanNotEligible",
    "PlanReason",
    "PlanSigninRequired",
    "PlanStoreError",
    "PlanTokens",
    "PlanUnavailable",
    "PlanUnsupported",
    "SignIn",
    "SubscriptionState",
    "login",
    "plan_error",
    "plan_ssl_context",
    "signin_state",
]

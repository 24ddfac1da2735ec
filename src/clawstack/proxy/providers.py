"""Provider prefixes, upstreams, credentials and the health of each key.

A model reference is ``provider/model``. Built-in prefixes map to their public OpenAI-compatible endpoints and to
the environment-variable name of their API key; the proxy's configuration may override any of them (tests point
``openai`` at the scripted fake) or add a custom prefix for a self-hosted upstream. ``vercel/<provider>/<model>``
and ``openrouter/<vendor>/<model>`` keep the rest of the reference as the upstream model id. ``chatgpt/`` is a
plan route: it needs the operator's plan sign-in, which this proxy does not hold, so it always reports
``subscription_signin_required`` and the chain moves on.

Key health: a key the upstream called dead (401/402/403, or 429 with an exhausted quota) is skipped until
``dead_key_recheck_s`` passes; a rate-limited key rests for its ``Retry-After``, capped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from clawstack.common.clock import Clock
from clawstack.models.policy import PLAN_POLICY_ENDPOINT
from clawstack.models.refs import PLAN_PREFIXES, PROVIDER_BASE_URLS, PROVIDER_KEY_ENV, CredentialClass, split_model_ref
from clawstack.proxy.config import ProxyConfig, Upstream

BUILTIN_UPSTREAMS: Final[Mapping[str, Upstream]] = {
    prefix: Upstream(base_url=url, api_key_env=PROVIDER_KEY_ENV[prefix]) for prefix, url in PROVIDER_BASE_URLS.items()
}


@dataclass(frozen=True, slots=True)
class Route:
    """Where one chain entry's requests go."""

    prefix: str
    model: str
    base_url: str
    api_key: str | None
    key_id: str
    credential_class: CredentialClass
    plan: bool = False
    keyless: bool = False  # a self-hosted upstream configured without a key variable

    @property
    def policy_endpoint(self) -> str:
        """The endpoint the data policy attests for this route (the plan route's is fixed by the spec)."""
        return PLAN_POLICY_ENDPOINT if self.plan else self.base_url


class Upstreams:
    """Resolves model references to routes, with the credentials from the proxy's configuration."""

    def __init__(self, config: ProxyConfig, *, environ: Mapping[str, str] | None = None) -> None:
        self._config = config
        self._environ = environ
        self._table: dict[str, Upstream] = {**BUILTIN_UPSTREAMS, **config.upstreams}

    def known_prefix(self, prefix: str) -> bool:
        return prefix in self._table or prefix in PLAN_PREFIXES

    def resolve(self, ref: str) -> Route | None:
        """The route for ``ref``, or ``None`` for an unknown prefix or a malformed reference."""
        parts = split_model_ref(ref)
        if parts is None:
            return None
        prefix, model = parts
        if prefix in PLAN_PREFIXES and prefix not in self._table:
            return Route(prefix, model, "", None, f"plan:{prefix}", "subscription", plan=True)
        upstream = self._table.get(prefix)
        if upstream is None:
            return None
        key = self._config.resolve_env(upstream.api_key_env, self._environ) if upstream.api_key_env else None
        key_id = f"{prefix}:{upstream.api_key_env or '-'}"
        return Route(
            prefix,
            model,
            upstream.base_url,
            key,
            key_id,
            upstream.credential_class,
            keyless=upstream.api_key_env is None,
        )


@dataclass(slots=True)
class _KeyState:
    until: float
    reason: Literal["key_dead", "rate_limited"]


class KeyHealth:
    """Which keys are dead or resting, on the monotonic clock."""

    def __init__(self, clock: Clock, *, dead_recheck_s: float, retry_after_cap_s: float) -> None:
        self._clock = clock
        self._dead_recheck_s = dead_recheck_s
        self._cap_s = retry_after_cap_s
        self._states: dict[str, _KeyState] = {}

    def blocked(self, key_id: str) -> Literal["key_dead", "rate_limited"] | None:
        state = self._states.get(key_id)
        if state is None:
            return None
        if self._clock.monotonic() >= state.until:
            del self._states[key_id]
            return None
        return state.reason

    def mark_dead(self, key_id: str) -> None:
        self._states[key_id] = _KeyState(self._clock.monotonic() + self._dead_recheck_s, "key_dead")

    def rest(self, key_id: str, retry_after_s: float | None) -> None:
        delay = self._cap_s if retry_after_s is None else min(max(retry_after_s, 0.0), self._cap_s)
        if delay > 0:
            self._states[key_id] = _KeyState(self._clock.monotonic() + delay, "rate_limited")

    def snapshot(self) -> dict[str, str]:
        """Key ids (never keys) and their state, for health."""
        return {key: reason for key in list(self._states) if (reason := self.blocked(key)) is not None}


__all__ = ["BUILTIN_UPSTREAMS", "KeyHealth", "Route", "Upstreams"]

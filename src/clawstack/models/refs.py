"""Model references: ``provider/model``, the provider prefixes this stack knows, chain slots and slot options.

A reference is ``provider/model``; ``vercel/<provider>/<model>`` and ``openrouter/<vendor>/<model>`` keep the rest
of the reference as the upstream's model id. ``provider/@family`` names a model family, which the pod compiler
resolves to an exact model (:mod:`clawstack.models.families`); the proxy only ever sees exact references.
``chatgpt/`` is a plan route: it is served from the operator's plan sign-in, never from a key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, Literal, get_args

SLOT: Final = re.compile(r"primary|fallback(?:-([2-9]|[1-9][0-9]))?")
OPENROUTER_SLUG: Final = re.compile(r"[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*){0,3}")
FAMILY: Final = re.compile(r"@[a-z0-9][a-z0-9._-]{0,62}")
REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high")
KEYED_PREFIXES: Final = frozenset({"openai", "anthropic", "xai", "google", "meta", "openrouter", "vercel"})
PLAN_PREFIXES: Final = frozenset({"chatgpt"})
BUILTIN_PREFIXES: Final = KEYED_PREFIXES | PLAN_PREFIXES
CredentialClass = Literal["api_key", "subscription"]
"""What served a model call: a provider key, or the operator's plan sign-in."""
CREDENTIAL_CLASSES: Final[tuple[CredentialClass, ...]] = get_args(CredentialClass)
PlanReason = Literal[
    "subscription_signin_required",
    "subscription_limit_reached",
    "subscription_unavailable",
    "subscription_not_eligible",
    "subscription_unsupported_request",
]
"""Why a plan route could not serve (the spec's table); the proxy records it, a run reports the last one."""
PLAN_REASONS: Final[tuple[PlanReason, ...]] = get_args(PlanReason)
PROVIDER_KEY_ENV: Final[Mapping[str, str]] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "xai": "XAI_API_KEY",
    "google": "GEMINI_API_KEY",
    "meta": "LLAMA_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "vercel": "AI_GATEWAY_API_KEY",
}
PROVIDER_BASE_URLS: Final[Mapping[str, str]] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "xai": "https://api.x.ai/v1",
    "google": "https://generativelanguage.googleapis.com/v1beta/openai",
    "meta": "https://api.llama.com/compat/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "vercel": "https://ai-gateway.vercel.sh/v1",
}
"""The public OpenAI-compatible endpoint of each keyed prefix (a pod or proxy configuration may override one)."""
PREFERENCE_KEYS: Final = ("only", "allow_fallbacks", "require_parameters", "zdr", "data_collection")
"""OpenRouter provider preferences a slot may set; each can only narrow routing."""
NARROWING: Final[Mapping[str, object]] = {
    "zdr": True,
    "require_parameters": True,
    "allow_fallbacks": False,
    "data_collection": "deny",
}
"""The one accepted value of each boolean-like preference (``only`` narrows by being a subset)."""


def split_model_ref(ref: str) -> tuple[str, str] | None:
    """``(provider, model)`` for ``provider/model``; ``None`` when malformed. A family reference splits too
    (``("openai", "@terra")``): see :func:`is_family_ref`."""
    prefix, sep, model = ref.partition("/")
    if not sep or not prefix or not model or any(not part for part in model.split("/")):
        return None
    if prefix in ("vercel", "openrouter") and "/" not in model:
        return None
    return prefix, model


def is_family_ref(ref: str) -> bool:
    """Whether ``ref`` names a family (``openai/@terra``, ``vercel/openai/@nano``) rather than an exact model:
    its last segment is ``@name``."""
    return split_model_ref(ref) is not None and FAMILY.fullmatch(ref.rsplit("/", 1)[1]) is not None


def slot_order(slot: str) -> int:
    """``primary`` 0, ``fallback`` 1, ``fallback-N`` N."""
    if slot == "primary":
        return 0
    if slot == "fallback":
        return 1
    return int(slot.split("-", 1)[1])


def slot_name(position: int) -> str:
    """The slot at ``position`` of a chain: ``primary``, ``fallback``, ``fallback-2``, …"""
    return "primary" if position == 0 else "fallback" if position == 1 else f"fallback-{position}"


__all__ = [
    "BUILTIN_PREFIXES",
    "CREDENTIAL_CLASSES",
    "FAMILY",
    "KEYED_PREFIXES",
    "NARROWING",
    "OPENROUTER_SLUG",
    "PLAN_PREFIXES",
    "PLAN_REASONS",
    "PREFERENCE_KEYS",
    "PROVIDER_BASE_URLS",
    "PROVIDER_KEY_ENV",
    "REASONING_EFFORTS",
    "SLOT",
    "CredentialClass",
    "PlanReason",
    "is_family_ref",
    "slot_name",
    "slot_order",
    "split_model_ref",
]

"""The data policy: where a pod's model calls may be processed, and what providers may do with them.

A pod declares it in ``x-claw.data-policy``; without one the default applies: processing in the US or the EU, no
training on the data, no retention by the provider. ``permissive`` is an explicit value that lifts every
constraint. A *constrained* policy admits a chain entry only with evidence for its provider at its endpoint:

- an **attestation** the operator declares, ``{provider, endpoint, guarantees}`` with guarantees drawn from
  ``processing:<region>``, ``training:none``, ``retention:none``. It covers exactly that provider at exactly that
  endpoint: an attestation for ``openai`` does not cover the ``chatgpt`` plan route, whose endpoint for the policy
  is ``https://api.openai.com/v1``;
- a **regional route** (:data:`REGIONAL_ROUTES`): an endpoint the provider documents as processing in one region
  is evidence of ``processing:<region>`` and of nothing else;
- a control the proxy **enforces itself** (:data:`ENFORCED_CONTROLS`): on OpenRouter it sets zero data retention
  and ``data_collection: deny`` on every request and refuses a request that would weaken them. An OpenRouter
  ``only`` pin selects endpoints but is not evidence of where processing happens.

``local_retention`` is what the proxy itself keeps: ``metadata`` (identities, the tool audit and, when the journal
is on, the trace journal: never message content), which is all this proxy keeps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

REGION: Final = re.compile(r"[a-z]{2,8}")
GUARANTEE: Final = re.compile(r"processing:[a-z]{2,8}|training:none|retention:none")
DEFAULT_REGIONS: Final = ("us", "eu")
LOCAL_RETENTION: Final = "metadata"
PLAN_POLICY_ENDPOINT: Final = "https://api.openai.com/v1"
"""The endpoint the policy attests for the ``chatgpt`` plan route."""
REGIONAL_ROUTES: Final[Mapping[str, Mapping[str, str]]] = {
    "openai": {"https://eu.api.openai.com/v1": "eu", "https://us.api.openai.com/v1": "us"},
    "openrouter": {"https://eu.openrouter.ai/api/v1": "eu"},
}
"""Per provider, endpoints that process in one region (OpenAI's data-residency hosts, OpenRouter's EU host)."""
ENFORCED_CONTROLS: Final[Mapping[str, frozenset[str]]] = {
    "openrouter": frozenset({"training:none", "retention:none"}),
}
"""Guarantees the proxy enforces per request itself, so they need no attestation."""


class PolicyError(ValueError):
    """A data policy that cannot be used; the message names the key."""


@dataclass(frozen=True, slots=True)
class Attestation:
    provider: str
    endpoint: str
    guarantees: frozenset[str]

    def to_config(self) -> dict[str, Any]:
        return {"provider": self.provider, "endpoint": self.endpoint, "guarantees": sorted(self.guarantees)}


@dataclass(frozen=True, slots=True)
class DataPolicy:
    permissive: bool = False
    regions: tuple[str, ...] = DEFAULT_REGIONS
    training: Literal["none", "allowed"] = "none"
    retention: Literal["none", "allowed"] = "none"
    attestations: tuple[Attestation, ...] = field(default_factory=tuple)

    @property
    def constrained(self) -> bool:
        return not self.permissive

    def required(self) -> list[str]:
        """What a chain entry needs evidence of: ``processing:<region>`` (one of the regions), then
        ``training:none`` and ``retention:none`` when the policy asks for them."""
        if self.permissive:
            return []
        wanted = ["processing:" + "|".join(self.regions)] if self.regions else []
        if self.training == "none":
            wanted.append("training:none")
        if self.retention == "none":
            wanted.append("retention:none")
        return wanted

    def missing(self, provider: str, endpoint: str) -> list[str]:
        """What ``provider`` at ``endpoint`` lacks evidence of under this policy (empty when admitted)."""
        if self.permissive:
            return []
        endpoint = endpoint.rstrip("/")
        evidence: set[str] = set(ENFORCED_CONTROLS.get(provider, frozenset()))
        for item in self.attestations:
            if item.provider == provider and item.endpoint == endpoint:
                evidence |= item.guarantees
        regional = REGIONAL_ROUTES.get(provider, {}).get(endpoint)
        if regional is not None:
            evidence.add(f"processing:{regional}")
        lacking = []
        if self.regions:
            processed = {g.split(":", 1)[1] for g in evidence if g.startswith("processing:")}
            if not processed or not processed <= set(self.regions):
                lacking.append("processing:" + "|".join(self.regions))
        for guarantee, wanted in (("training:none", self.training), ("retention:none", self.retention)):
            if wanted == "none" and guarantee not in evidence:
                lacking.append(guarantee)
        return lacking

    def enforces_zero_retention(self) -> bool:
        return not self.permissive and self.retention == "none"

    def enforces_no_training(self) -> bool:
        return not self.permissive and self.training == "none"

    def listing(self) -> dict[str, Any]:
        """What ``GET /v1/templates`` shows: attestations by provider only, never endpoints or guarantees."""
        return {
            "mode": "permissive" if self.permissive else "constrained",
            "regions": [] if self.permissive else list(self.regions),
            "training": "allowed" if self.permissive else self.training,
            "retention": "allowed" if self.permissive else self.retention,
            "local_retention": LOCAL_RETENTION,
            "attested_providers": sorted({item.provider for item in self.attestations}),
        }

    def to_config(self) -> dict[str, Any] | str:
        """The proxy configuration's ``data_policy`` value (what :func:`parse_policy` reads back)."""
        if self.permissive:
            return "permissive"
        return {
            "regions": list(self.regions),
            "training": self.training,
            "retention": self.retention,
            "local_retention": LOCAL_RETENTION,
            "attestations": [item.to_config() for item in self.attestations],
        }


DEFAULT_POLICY: Final = DataPolicy()
PERMISSIVE: Final = DataPolicy(permissive=True, regions=(), training="allowed", retention="allowed")


def parse_policy(value: Any, *, dashed: bool = False) -> DataPolicy:
    """Read a policy: ``None`` (the default), ``"permissive"``, or a mapping. ``dashed`` reads the pod file's
    spelling (``local-retention``). Raises :class:`PolicyError` naming the key; every accepted key has effect."""
    if value is None:
        return DEFAULT_POLICY
    if value == "permissive":
        return PERMISSIVE
    if not isinstance(value, Mapping):
        raise PolicyError("must be permissive or a mapping of regions, training, retention, attestations")
    local_key = "local-retention" if dashed else "local_retention"
    allowed = {"regions", "training", "retention", local_key, "attestations"}
    for key in value:
        if key not in allowed:
            raise PolicyError(f"unknown key {key!r}: use {', '.join(sorted(allowed))} (or the value permissive)")
    regions = value.get("regions", list(DEFAULT_REGIONS))
    if not isinstance(regions, list) or not all(isinstance(r, str) and REGION.fullmatch(r) for r in regions):
        raise PolicyError("regions: must be a list of region names such as us and eu")
    if not regions:
        raise PolicyError("regions: must name at least one region (or make the policy permissive)")
    choices: dict[str, Literal["none", "allowed"]] = {}
    for key in ("training", "retention"):
        item = value.get(key, "none")
        if item not in ("none", "allowed"):
            raise PolicyError(f"{key}: must be none or allowed")
        choices[key] = item
    local = value.get(local_key, LOCAL_RETENTION)
    if local != LOCAL_RETENTION:
        raise PolicyError(
            f"{local_key}: {local!r} is not supported: this proxy keeps call metadata (identities, the tool audit, "
            "the trace journal without content), so metadata is the only true value"
        )
    raw = value.get("attestations", [])
    if not isinstance(raw, list):
        raise PolicyError("attestations: must be a list of {provider, endpoint, guarantees}")
    attestations = []
    for index, item in enumerate(raw):
        where = f"attestations[{index}]"
        if not isinstance(item, Mapping) or set(item) != {"provider", "endpoint", "guarantees"}:
            raise PolicyError(f"{where}: must have exactly provider, endpoint and guarantees")
        provider, endpoint, guarantees = item["provider"], item["endpoint"], item["guarantees"]
        if not isinstance(provider, str) or not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,31}", provider):
            raise PolicyError(f"{where}.provider: must be a provider prefix")
        if not isinstance(endpoint, str) or not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", endpoint):
            raise PolicyError(f"{where}.endpoint: must be an http(s) URL without query or fragment")
        if (
            not isinstance(guarantees, list)
            or not guarantees
            or not all(isinstance(g, str) and GUARANTEE.fullmatch(g) for g in guarantees)
        ):
            raise PolicyError(f"{where}.guarantees: must list processing:<region>, training:none, retention:none")
        attestations.append(Attestation(provider, endpoint.rstrip("/"), frozenset(guarantees)))
    return DataPolicy(
        regions=tuple(regions),
        training=choices["training"],
        retention=choices["retention"],
        attestations=tuple(attestations),
    )


__all__ = [
    "DEFAULT_POLICY",
    "ENFORCED_CONTROLS",
    "LOCAL_RETENTION",
    "PERMISSIVE",
    "PLAN_POLICY_ENDPOINT",
    "REGIONAL_ROUTES",
    "Attestation",
    "DataPolicy",
    "PolicyError",
    "parse_policy",
]

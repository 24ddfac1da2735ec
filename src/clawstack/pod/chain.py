"""A template's model chain as the pod file declares it: slots, references, families, efforts, preferences.

``x-claw.models`` (or the pod's ``models-defaults``) maps slots to references; ``primary`` first, then
``fallback``, ``fallback-2``, … without gaps. A family reference (``openai/@terra``) resolves here through the
pod's :class:`~clawstack.models.families.FamilyTable`, and the slot keeps both the exact ``ref`` and the
``requested`` family. Each keyed entry needs its provider's key in ``cllama-env``; a ``chatgpt/`` plan entry needs
none and never gets one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from clawstack.models.families import FamilyError, FamilyTable
from clawstack.models.refs import (
    KEYED_PREFIXES,
    NARROWING,
    OPENROUTER_SLUG,
    PLAN_PREFIXES,
    PREFERENCE_KEYS,
    PROVIDER_KEY_ENV,
    REASONING_EFFORTS,
    SLOT,
    is_family_ref,
    slot_order,
    split_model_ref,
)
from clawstack.pod.errors import ValidationError
from clawstack.pod.values import mapping


class UpstreamDecl(Protocol):
    @property
    def base_url(self) -> str: ...

    @property
    def api_key_env(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ModelSlot:
    slot: str
    ref: str
    reasoning_effort: str | None = None
    provider_preferences: Mapping[str, Any] | None = None
    requested: str | None = None  # the family the pod wrote, when ``ref`` was resolved from one

    @property
    def prefix(self) -> str:
        return self.ref.split("/", 1)[0]

    @property
    def needs_signin(self) -> bool:
        return self.prefix in PLAN_PREFIXES


def parse_models(
    x_claw: dict[str, Any],
    defaults: dict[str, Any],
    upstreams: Mapping[str, UpstreamDecl],
    env: Mapping[str, str],
    families: FamilyTable,
    where: str,
) -> tuple[ModelSlot, ...]:
    declared = mapping(x_claw.get("models"), f"{where}.x-claw.models") or dict(defaults)
    source = "x-claw.models" if x_claw.get("models") else "x-claw.models-defaults"
    for slot in declared:
        if not isinstance(slot, str) or not SLOT.fullmatch(slot):
            raise ValidationError(
                f"{slot!r} is not a slot: use primary, fallback, fallback-2, …", where=f"{where}.{source}"
            )
    if "primary" not in declared:
        raise ValidationError("a per-run template needs a primary model", where=f"{where}.x-claw.models")
    order = sorted(declared, key=slot_order)
    for expected, slot in enumerate(order):
        if slot_order(slot) != expected:
            missing = "fallback" if expected == 1 else f"fallback-{expected}"
            raise ValidationError(f"{slot} without {missing}: slots run without gaps", where=f"{where}.{source}")
    efforts = mapping(x_claw.get("reasoning-effort"), f"{where}.x-claw.reasoning-effort")
    prefs = mapping(x_claw.get("provider-preferences"), f"{where}.x-claw.provider-preferences")
    for slot, effort in efforts.items():
        if slot not in declared:
            raise ValidationError(f"slot {slot!r} has no model", where=f"{where}.x-claw.reasoning-effort")
        if effort not in REASONING_EFFORTS:
            raise ValidationError(
                f"{effort!r} is not one of {', '.join(REASONING_EFFORTS)}",
                where=f"{where}.x-claw.reasoning-effort.{slot}",
            )
    for slot in prefs:
        if slot not in declared:
            raise ValidationError(f"slot {slot!r} has no model", where=f"{where}.x-claw.provider-preferences")
    slots = []
    for slot in order:
        written = declared[slot]
        slot_where = f"{where}.{source}.{slot}"
        if not isinstance(written, str):
            raise ValidationError("must be a provider/model reference", where=slot_where)
        ref, requested = _resolve(written, families, slot_where)
        prefix = ref.split("/", 1)[0]
        if prefix not in KEYED_PREFIXES and prefix not in PLAN_PREFIXES and prefix not in upstreams:
            raise ValidationError(
                f"unknown provider {prefix!r}: use openai, anthropic, xai, google, meta, openrouter, vercel, chatgpt "
                "or an upstream declared in x-claw.upstreams",
                where=slot_where,
            )
        key_env = PROVIDER_KEY_ENV.get(prefix) or (upstreams[prefix].api_key_env if prefix in upstreams else None)
        if key_env is not None and not env.get(key_env, "").strip():
            raise ValidationError(
                f"{ref} needs {key_env} in x-claw.cllama-env (or cllama-defaults.env), with a value", where=slot_where
            )
        slot_prefs = (
            _preferences(prefs[slot], prefix, f"{where}.x-claw.provider-preferences.{slot}") if slot in prefs else None
        )
        slots.append(ModelSlot(slot, ref, efforts.get(slot), slot_prefs, requested))
    return tuple(slots)


def _resolve(written: str, families: FamilyTable, where: str) -> tuple[str, str | None]:
    """``(ref, requested)``: an exact reference is itself with no ``requested``; a family resolves."""
    if split_model_ref(written) is None:
        raise ValidationError(f"{written!r} is not provider/model", where=where)
    if not is_family_ref(written):
        if "@" in written:
            raise ValidationError(f"{written!r}: a family is provider/@name, such as openai/@terra", where=where)
        return written, None
    try:
        return families.resolve(written), written
    except FamilyError as exc:
        raise ValidationError(str(exc), where=where) from None


def _preferences(value: Any, prefix: str, where: str) -> dict[str, Any]:
    if prefix != "openrouter":
        raise ValidationError("provider preferences apply only to openrouter/* models", where=where)
    prefs = mapping(value, where)
    if not prefs:
        raise ValidationError("must name at least one preference", where=where)
    for key, item in prefs.items():
        if key not in PREFERENCE_KEYS:
            raise ValidationError(f"{key!r} is not accepted; use {', '.join(PREFERENCE_KEYS)}", where=where)
        if key == "only":
            if (
                not isinstance(item, list)
                or not item
                or not all(isinstance(slug, str) and OPENROUTER_SLUG.fullmatch(slug) for slug in item)
            ):
                raise ValidationError(
                    "must be a non-empty list of provider[/variant][/region][/tier] slugs", where=f"{where}.only"
                )
        elif item != NARROWING[key] or isinstance(item, bool) != isinstance(NARROWING[key], bool):
            wanted = str(NARROWING[key]).lower() if isinstance(NARROWING[key], bool) else NARROWING[key]
            raise ValidationError(
                f"can only narrow routing: the one accepted value is {wanted}", where=f"{where}.{key}"
            )
    return dict(prefs)


__all__ = ["ModelSlot", "parse_models"]

"""The model policy of work a plugin starts: ``plugins.entries.<id>.subagent``.

One rule for every path a plugin can choose a model on: ``api.runtime.subagent.complete``, ``subagent.run`` and
a native child's ``spawn`` (reply-dispatch and command-scoped facades alike, with or without a profile, which
cannot name a model itself). :func:`check_model_override` admits an override only when
``allowModelOverride`` is true, the override is a canonical ``provider/model`` reference (split at the first
``/``, as the config splits one), it names exactly a model the destination agent can be configured with (a
provider under ``models.providers`` and one of that provider's ``models[].id``, both compared exactly), and it is
in ``allowedModels`` (or that list holds ``"*"``). Anything else is refused with
:class:`~clawstack.gateway.plugins.api.ModelOverrideRefusedError` (``subagent_model_refused``), never replaced by
another model.
"""

from __future__ import annotations

import json

from clawstack.gateway.config import GatewayConfig, PluginSubagentPolicy, split_model_ref
from clawstack.gateway.plugins.api import ModelOverrideRefusedError

__all__ = ["check_model_override"]


def check_model_override(config: GatewayConfig, plugin_id: str, agent_id: str, model: str) -> str:
    """``model`` if ``plugin_id`` may run ``agent_id``'s work on it; else :class:`ModelOverrideRefusedError`."""
    entry = config.plugins.entries.get(plugin_id)
    policy = entry.subagent if entry is not None else PluginSubagentPolicy()
    where = f"plugins.entries.{plugin_id}.subagent"
    if not policy.allow_model_override:
        raise ModelOverrideRefusedError(
            f"plugin {plugin_id!r} may not choose a model ({where}.allowModelOverride is not true)"
        )
    try:
        provider_id, model_id = split_model_ref(model)
    except ValueError:
        raise ModelOverrideRefusedError(
            f"model override {json.dumps(model)} is not a canonical provider/model reference"
        ) from None
    provider = config.models.providers.get(provider_id)
    if provider is None:
        raise ModelOverrideRefusedError(
            f"model override {json.dumps(model)}: agent {agent_id!r} has no provider {json.dumps(provider_id)}"
        )
    if all(configured.id != model_id for configured in provider.models):
        raise ModelOverrideRefusedError(
            f"model override {json.dumps(model)}: provider {json.dumps(provider_id)} has no model"
            f" {json.dumps(model_id)} configured (model ids are compared exactly)"
        )
    if "*" not in policy.allowed_models and model not in policy.allowed_models:
        raise ModelOverrideRefusedError(f"model {json.dumps(model)} is not in {where}.allowedModels")
    return model

"""The ``models`` section and model selections: providers, the models they serve, ``primary`` + ``fallbacks``.

A model selection (``agents.defaults.model``, ``agents.entries.<id>.model``) is OpenClaw's: either a string
``"provider/model"`` (that model alone, no fallbacks) or ``{primary, fallbacks?}``. Both become a
:class:`ModelSelection`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    StrictFloat,
    StrictStr,
)
from pydantic.alias_generators import to_camel

from clawstack.gateway.config.values import ModelRef, PositiveInt, ProviderId, check_base_url, check_no_space

__all__ = [
    "ModelCost",
    "ModelSelection",
    "ModelSelectionInput",
    "ModelsConfig",
    "ProviderConfig",
    "ProviderModel",
    "Section",
]


class Section(BaseModel):
    """Base of every config section: camelCase keys, unknown keys refused, immutable, inputs never echoed."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=False,
        hide_input_in_errors=True,
    )


class ModelCost(Section):
    """``models.providers.<id>.models[].cost``: price per million tokens (informational)."""

    input: Annotated[StrictFloat, Field(ge=0)] = 0.0
    output: Annotated[StrictFloat, Field(ge=0)] = 0.0
    cache_read: Annotated[StrictFloat, Field(ge=0)] = 0.0
    cache_write: Annotated[StrictFloat, Field(ge=0)] = 0.0


class ProviderModel(Section):
    """One model a provider serves: ``{id, name?, contextWindow?, maxTokens?, reasoning?, input?, cost?}``."""

    id: Annotated[StrictStr, AfterValidator(check_no_space)]
    name: StrictStr | None = None
    context_window: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    reasoning: StrictBool = False
    input: Annotated[tuple[Literal["text", "image"], ...], Field(min_length=1)] = ("text",)
    cost: ModelCost = ModelCost()


class ProviderConfig(Section):
    """``models.providers.<id>``: an OpenAI-compatible endpoint and the models it serves."""

    base_url: Annotated[StrictStr, AfterValidator(check_base_url)]
    api_key: SecretStr | None = None
    api: Literal["openai-completions"] = "openai-completions"
    models: Annotated[tuple[ProviderModel, ...], Field(min_length=1)]


class ModelsConfig(Section):
    """``models``: the configured providers (at least one)."""

    providers: Annotated[dict[ProviderId, ProviderConfig], Field(min_length=1)]


class ModelSelection(Section):
    """A model selection: a primary ``provider/model`` and the fallbacks tried in order after it."""

    primary: ModelRef
    fallbacks: tuple[ModelRef, ...] = ()

    @property
    def chain(self) -> tuple[str, ...]:
        """The primary followed by the fallbacks."""
        return (self.primary, *self.fallbacks)


def _selection_from_string(value: Any) -> Any:
    # OpenClaw's string form: that model alone, with no fallbacks.
    return {"primary": value} if isinstance(value, str) else value


#: A model selection as the file may write it: ``"provider/model"`` or ``{primary, fallbacks?}``.
ModelSelectionInput = Annotated[ModelSelection, BeforeValidator(_selection_from_string)]

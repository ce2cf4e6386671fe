"""Oversubscription targets per zone and GPU model (thunder-api.md 2.5).

The item keys inside ``oversubscriptionTargets`` are uncertain, so a few plausible
spellings are accepted; an item that names no model or no usable value is ignored.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)

# The factor used when nothing usable is configured, or the targets cannot be read.
NEUTRAL_TARGET = 1.0


def _unset_if_invalid(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        result = handler(value)
    except ValidationError:
        return None
    if result is None or not math.isfinite(result) or result <= 0:
        return None
    return result


# Absent, null, zero, negative, non-finite or non-numeric all mean "unset".
_Target = Annotated[float | None, WrapValidator(_unset_if_invalid)]


class OversubscriptionTarget(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, validate_by_name=True)

    gpu_type: str | None = Field(
        default=None, validation_alias=AliasChoices("gpuType", "gpu_type", "model")
    )
    target: _Target = Field(
        default=None,
        validation_alias=AliasChoices("oversubscriptionTarget", "target", "value"),
    )

    @field_validator("gpu_type", mode="wrap")
    @classmethod
    def _type_or_none(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            return None


def _drop_unusable_items(value: Any) -> Any:
    if value is None:
        return []
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


class OversubscriptionTargets(BaseModel):
    """The answer of ``GET /zones/{zoneId}/oversubscription-targets``."""

    model_config = ConfigDict(extra="ignore", frozen=True, validate_by_name=True)

    targets: list[OversubscriptionTarget] = Field(
        default_factory=list, validation_alias=AliasChoices("oversubscriptionTargets", "targets")
    )
    default: _Target = Field(
        default=None, validation_alias=AliasChoices("defaultOversubscriptionTarget", "default")
    )

    @field_validator("targets", mode="before")
    @classmethod
    def _items(cls, value: Any) -> Any:
        return _drop_unusable_items(value)

    def target_for(self, gpu_type: str) -> float:
        """The model's item if set (case-insensitive match), else the default, else 1."""
        wanted = gpu_type.casefold()
        for item in self.targets:
            matches = item.gpu_type is not None and item.gpu_type.casefold() == wanted
            if matches and item.target is not None:
                return item.target
        if self.default is not None:
            return self.default
        return NEUTRAL_TARGET


def oversubscription_target(targets: OversubscriptionTargets | None, gpu_type: str) -> float:
    """The target for ``gpu_type``; ``None`` (targets unreadable) means 1x."""
    if targets is None:
        return NEUTRAL_TARGET
    return targets.target_for(gpu_type)

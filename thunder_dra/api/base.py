"""The base model, validated string types and status conditions shared by the CRDs."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from thunder_dra.api import syntax


class ApiModel(BaseModel):
    """Base of every resource model: camelCase on the wire, immutable in memory.

    Unknown fields are ignored rather than refused: the API server already prunes or
    rejects them (structural schema, strict field validation), and ignoring keeps an
    older operator able to read an object written against a newer CRD.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        frozen=True,
        extra="ignore",
        use_attribute_docstrings=True,
    )

    def to_json_dict(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, unset optionals omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _checked(problem: Callable[[str], str | None]) -> AfterValidator:
    """A validator that reports `problem(value)` with the offending value quoted."""

    def check(value: str) -> str:
        reason = problem(value)
        if reason is not None:
            raise PydanticCustomError(
                "invalid_value", '{reason}, got "{value}"', {"reason": reason, "value": value}
            )
        return value

    return AfterValidator(check)


def _dns_label_problem(value: str) -> str | None:
    if syntax.is_dns_label(value):
        return None
    return (
        "must be a DNS label (at most 63 lower-case letters, digits and '-', "
        "alphanumeric at both ends)"
    )


def _dns_subdomain_problem(value: str) -> str | None:
    if syntax.is_dns_subdomain(value):
        return None
    return "must be a DNS subdomain (dot-separated DNS labels, at most 253 characters)"


def _driver_name_problem(value: str) -> str | None:
    if syntax.is_dns_subdomain(value) and len(value) <= syntax.DNS_LABEL_MAX:
        return None
    return "must be a DNS subdomain of at most 63 characters, such as example.com"


def _qualified_name_problem(value: str) -> str | None:
    if syntax.is_qualified_name(value):
        return None
    return "must be a label key such as example.com/name"


def _label_value_problem(value: str) -> str | None:
    if syntax.is_label_value(value):
        return None
    return "must be a label value (at most 63 letters, digits, '-', '_' or '.')"


def _absolute_path_problem(value: str) -> str | None:
    if value.startswith("/") and "\x00" not in value and len(value) <= 4096:
        return None
    return "must be an absolute path"


INTEGER_MAX: Final = 2**53 - 1
"""The largest integer a schema bound can name exactly: the API server holds `maximum` as a
float64, in which 2**63 - 1 rounds up and overflows int64."""
QUANTITY_MAX_LENGTH: Final = 64
"""Longer than any quantity a person writes; bounds what the API server stores."""

Count = Annotated[int, Field(ge=0, le=INTEGER_MAX)]
"""A non-negative count or generation, within what the API server can bound exactly."""

QUANTITY_PATTERN: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


_URL_PATTERN: Final = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"

DnsLabel = Annotated[
    str,
    _checked(_dns_label_problem),
    WithJsonSchema(
        {"type": "string", "pattern": syntax.DNS_LABEL_PATTERN, "maxLength": syntax.DNS_LABEL_MAX}
    ),
]
DnsSubdomain = Annotated[
    str,
    _checked(_dns_subdomain_problem),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": syntax.DNS_SUBDOMAIN_PATTERN,
            "maxLength": syntax.DNS_SUBDOMAIN_MAX,
        }
    ),
]
DriverName = Annotated[
    str,
    _checked(_driver_name_problem),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": syntax.DNS_SUBDOMAIN_PATTERN,
            "maxLength": syntax.DNS_LABEL_MAX,
        }
    ),
]
QualifiedName = Annotated[
    str,
    _checked(_qualified_name_problem),
    # 253 for the prefix, '/', 63 for the name.
    WithJsonSchema({"type": "string", "pattern": syntax.QUALIFIED_NAME_PATTERN, "maxLength": 317}),
]
LabelValue = Annotated[
    str,
    _checked(_label_value_problem),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": syntax.LABEL_VALUE_PATTERN,
            "maxLength": syntax.LABEL_VALUE_MAX,
        }
    ),
]
ThunderURL = Annotated[
    str,
    _checked(syntax.url_problem),
    WithJsonSchema({"type": "string", "pattern": _URL_PATTERN, "maxLength": 2048}),
]
AbsolutePath = Annotated[
    str,
    _checked(_absolute_path_problem),
    WithJsonSchema({"type": "string", "pattern": "^/", "maxLength": 4096}),
]


def _quantity(value: object) -> int | str:
    # One validator for both forms, so an error names the field, not a union branch.
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value <= INTEGER_MAX:
            return value
        raise PydanticCustomError(
            "quantity_range",
            "must be between 0 and {maximum}, got {value}",
            {"maximum": INTEGER_MAX, "value": value if abs(value) < 10**30 else "a huge number"},
        )
    if (
        isinstance(value, str)
        and len(value) <= QUANTITY_MAX_LENGTH
        and re.fullmatch(QUANTITY_PATTERN, value)
    ):
        if value.startswith("-"):
            raise PydanticCustomError(
                "quantity_range", 'must not be negative, got "{value}"', {"value": value}
            )
        return value
    if isinstance(value, str) and len(value) > QUANTITY_MAX_LENGTH:
        raise PydanticCustomError(
            "quantity",
            "must be a Kubernetes quantity of at most {maximum} characters",
            {"maximum": QUANTITY_MAX_LENGTH},
        )
    raise PydanticCustomError(
        "quantity",
        'must be a Kubernetes quantity such as "100m", "64Mi" or 2, got "{value}"',
        {"value": value},
    )


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    # The exact shape controller-gen emits for resource.Quantity: the one anyOf a
    # structural schema allows.
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "maxLength": QUANTITY_MAX_LENGTH,
            "minimum": 0,
            "maximum": INTEGER_MAX,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


class ObjectMeta(ApiModel):
    """The metadata fields the driver reads; everything else is ignored."""

    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    deletion_timestamp: datetime | None = None


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(ApiModel):
    """One aspect of the resource's current state, in the Kubernetes condition shape."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    """The aspect this condition describes, e.g. Ready."""
    status: ConditionStatus
    """Whether the aspect holds: True, False or Unknown."""
    reason: Annotated[
        str,
        Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"),
    ]
    """A CamelCase word saying why, for programs and for kubectl columns."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """A human-readable explanation."""
    last_transition_time: datetime
    """When the status last changed (not when it was last written)."""
    observed_generation: Count | None = None
    """The metadata.generation this condition was computed from."""


def set_condition(conditions: Sequence[Condition], new: Condition) -> list[Condition]:
    """Replace the condition of `new.type`, keeping its transition time if its status held.

    A condition whose status did not change keeps its old `lastTransitionTime`, so the
    field means what Kubernetes tools expect (time of the last change, not of the write).
    """
    result: list[Condition] = []
    replaced = False
    for old in conditions:
        if old.type != new.type:
            result.append(old)
            continue
        replaced = True
        if old.status == new.status:
            new = new.model_copy(update={"last_transition_time": old.last_transition_time})
        result.append(new)
    if not replaced:
        result.append(new)
    return result


def find_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of `type_`, or None."""
    return next((c for c in conditions if c.type == type_), None)

"""Pydantic models of Thunder API responses (thunder-api.md section 2).

Attributes are snake_case; the wire spelling is camelCase. Unknown fields are ignored.
Fields the contract confirms are validated strictly enough to fail loudly; fields it marks
uncertain are lenient: a value of the wrong shape reads as absent instead of discarding a
whole listing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)
from pydantic.alias_generators import to_camel

from thunder_dra.thunder.claims import JwtClaims
from thunder_dra.thunder.redact import Secret

# Host statuses that count as healthy (thunder-api.md 2.3); an empty or absent status is
# healthy too.
HEALTHY_HOST_STATUSES = frozenset({"active", "online", "ready", "healthy", ""})


def _absent_if_invalid(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]
LenientTime = Annotated[datetime | None, WrapValidator(_absent_if_invalid)]
LenientStr = Annotated[str | None, WrapValidator(_absent_if_invalid)]
LenientInt = Annotated[int | None, WrapValidator(_absent_if_invalid)]


class ThunderModel(BaseModel):
    """Base: camelCase on the wire, unknown fields ignored, immutable once parsed."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="ignore",
        frozen=True,
    )


def _none_as_empty_list(value: Any) -> Any:
    return [] if value is None else value


class Zone(ThunderModel):
    """An item of ``GET /api/v1/zones``."""

    zone_id: NonEmptyStr
    display_name: str
    node_count: LenientInt = None
    client_count: LenientInt = None
    created_at: LenientTime = None


class HostConfigurations(ThunderModel):
    cordoned: bool = False


class Host(ThunderModel):
    """An item of ``GET /api/v1/hosts`` (a GPU server running thunderd)."""

    host_id: NonEmptyStr = Field(validation_alias=AliasChoices("hostId", "serverId", "host_id"))
    zone_id: NonEmptyStr
    display_name: str = ""
    hostname: str = ""
    # Kept exactly as Thunder spells it: minting sends it back verbatim (thunder-api.md 7.5).
    gpu_type: NonEmptyStr
    gpu_count: Annotated[int, Field(ge=0)]
    status: str = ""
    thunderd_version: LenientStr = None
    last_seen_at: LenientTime = None
    configurations: Annotated[HostConfigurations | None, WrapValidator(_absent_if_invalid)] = None

    @field_validator("display_name", "hostname", "status", mode="before")
    @classmethod
    def _null_as_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    @property
    def healthy(self) -> bool:
        return self.status.strip().lower() in HEALTHY_HOST_STATUSES

    @property
    def cordoned(self) -> bool:
        return self.configurations is not None and self.configurations.cordoned

    @property
    def adds_capacity(self) -> bool:
        """Only healthy, uncordoned hosts add GPUs to a pool (thunder-api.md 2.3)."""
        return self.healthy and not self.cordoned


class ClientRecord(ThunderModel):
    """An item of ``GET /api/v1/clients``: one exchanged client enrollment."""

    client_id: NonEmptyStr
    zone_id: NonEmptyStr
    decommissioned_at: datetime | None = None
    display_name: LenientStr = None
    gpu_type: LenientStr = None
    gpu_count: LenientInt = None
    created_at: LenientTime = None
    updated_at: LenientTime = None
    last_seen_at: LenientTime = None

    @property
    def live(self) -> bool:
        """Revoked clients stay listed; only those without ``decommissionedAt`` are live."""
        return self.decommissioned_at is None


class ZoneList(ThunderModel):
    zones: list[Zone]

    @field_validator("zones", mode="before")
    @classmethod
    def _null_as_empty(cls, value: Any) -> Any:
        return _none_as_empty_list(value)


class HostList(ThunderModel):
    hosts: list[Host]

    @field_validator("hosts", mode="before")
    @classmethod
    def _null_as_empty(cls, value: Any) -> Any:
        return _none_as_empty_list(value)


class ClientList(ThunderModel):
    clients: list[ClientRecord]

    @field_validator("clients", mode="before")
    @classmethod
    def _null_as_empty(cls, value: Any) -> Any:
        return _none_as_empty_list(value)


class MintedToken(ThunderModel):
    """The answer of a mint (thunder-api.md 2.6). ``enrollment_token`` is the single-use secret."""

    enrollment_token_id: NonEmptyStr
    enrollment_token: Secret
    role: NonEmptyStr
    expires_at: LenientTime = None
    org_id: LenientStr = None
    zone_id: LenientStr = None
    gpu_type: LenientStr = None
    gpu_count: LenientInt = None

    @field_validator("enrollment_token")
    @classmethod
    def _token_present(cls, value: Secret) -> Secret:
        if not value:
            raise ValueError("enrollmentToken is empty")
        return value


class UnenrollResult(ThunderModel):
    """The answer of ``DELETE /enrollment-tokens/{id}/node`` (thunder-api.md 2.7).

    ``already_gone`` is set by the client when Thunder answered 404 or 410.
    """

    enrollment_token_id: NonEmptyStr
    node_deleted: bool = False
    role: LenientStr = None
    client_id: LenientStr = None
    host_id: LenientStr = Field(
        default=None, validation_alias=AliasChoices("hostId", "serverId", "host_id")
    )
    deleted_at: LenientTime = None
    already_gone: bool = False


class ClientRevocation(ThunderModel):
    """The answer of ``POST /clients/{id}/revoke`` (thunder-api.md 2.8).

    ``already_gone`` on 404/410.
    """

    client_id: NonEmptyStr
    decommissioned_at: LenientTime = None
    already_gone: bool = False


class ExchangeResponse(ThunderModel):
    """The wire body of the exchange (thunder-api.md 2.9), before the JWT payload is checked."""

    auth_token: Secret
    jwt: Secret

    @field_validator("auth_token", "jwt")
    @classmethod
    def _present(cls, value: Secret) -> Secret:
        if not value:
            raise ValueError("is empty")
        return value


class EnrollmentExchange(ThunderModel):
    """A completed exchange: the client's long-lived credential and its claims."""

    auth_token: Secret
    jwt: Secret
    claims: JwtClaims


def smallest_zone_id(zones: list[Zone], display_name: str) -> str | None:
    """Display names are not unique: a name resolves to the smallest ``zoneId`` among exact
    matches (thunder-api.md 2.1), so every caller picks the same zone."""
    matches = [zone.zone_id for zone in zones if zone.display_name == display_name]
    return min(matches) if matches else None


def zones_by_name(zones: list[Zone]) -> dict[str, list[Zone]]:
    """Zones grouped by display name, each group sorted by ``zoneId`` (resolved one first)."""
    groups: dict[str, list[Zone]] = {}
    for zone in sorted(zones, key=lambda z: z.zone_id):
        groups.setdefault(zone.display_name, []).append(zone)
    return groups

"""The Client resource: the record of one Thunder enrollment made for one ResourceClaim.

The daemon creates it (with the `thundercompute.com/client-cleanup` finalizer) when it
mints an enrollment for a claim and deletes it at unprepare; the operator's reaper
revokes the enrollment of a Client whose claim is gone for longer than the grace period.

`status.orphanedSince` is where the reaper records when it first saw the claim gone.
It is status rather than an annotation because it is an observation of the world by a
controller: it is written through the status subresource (so a `kubectl apply` of the
object cannot reset or forge it), survives operator restarts with the object, and if
it is ever lost (a backup restored without status) the grace period simply starts
again, which delays a revocation but never hastens one.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from thunder_dra.api.base import ApiModel, DnsLabel, DnsSubdomain, ObjectMeta
from thunder_dra.api.constants import API_VERSION


class ClaimReference(ApiModel):
    """The ResourceClaim the enrollment was made for."""

    namespace: DnsLabel
    """Namespace of the claim."""
    name: DnsSubdomain
    """Name of the claim."""
    uid: Annotated[str, Field(min_length=1, max_length=128)]
    """UID of the claim; a claim with the same name and another UID is a different claim."""


class ZoneReference(ApiModel):
    """The Thunder zone the enrollment belongs to."""

    name: Annotated[str, Field(min_length=1, max_length=256)]
    """Zone display name (the node's topology.kubernetes.io/zone label)."""
    id: Annotated[str, Field(min_length=1, max_length=256)]
    """Thunder zone ID the display name resolved to."""


class ConsumerKind(StrEnum):
    """What consumes the GPUs of the claim."""

    POD = "Pod"
    VIRTUAL_MACHINE = "VirtualMachine"


def _immutable(what: str) -> dict[str, Any]:
    """A CRD transition rule: the field keeps its value once the object exists."""
    return {
        "x-kubernetes-validations": [
            {"rule": "self == oldSelf", "message": f"{what} is immutable"},
        ]
    }


def _set_once(what: str) -> dict[str, Any]:
    """A CRD transition rule: empty may become a value, a value never changes."""
    return {
        "x-kubernetes-validations": [
            {
                "rule": "oldSelf == '' || self == oldSelf",
                "message": f"{what} may be set once and then never change",
            },
        ]
    }


class ClientSpec(ApiModel):
    """What was enrolled, for which claim, where. Immutable once set: the API server
    enforces it (CRD validation rules), so it holds whether or not the webhook is up."""

    claim: Annotated[ClaimReference, Field(json_schema_extra=_immutable("claim"))]
    """The ResourceClaim this enrollment serves."""
    node_name: Annotated[DnsSubdomain, Field(json_schema_extra=_immutable("nodeName"))]
    """Node whose daemon prepared the claim."""
    zone: Annotated[ZoneReference, Field(json_schema_extra=_immutable("zone"))]
    """Thunder zone of the enrollment."""
    gpu_type: Annotated[
        str, Field(min_length=1, max_length=256, json_schema_extra=_immutable("gpuType"))
    ]
    """GPU model, exactly as Thunder spells it."""
    gpu_count: Annotated[int, Field(ge=1, le=1024, json_schema_extra=_immutable("gpuCount"))]
    """GPUs enrolled."""
    enrollment_token_id: Annotated[
        str, Field(max_length=256, json_schema_extra=_set_once("enrollmentTokenId"))
    ] = ""
    """Thunder enrollment token ID, the handle revocation uses. May be set once if the
    record was written before the mint answered."""
    consumer_kind: Annotated[ConsumerKind, Field(json_schema_extra=_immutable("consumerKind"))] = (
        ConsumerKind.POD
    )
    """Pod (the daemon exchanged the token) or VirtualMachine (the guest enrolls itself)."""
    consumer_name: Annotated[
        str, Field(max_length=253, json_schema_extra=_set_once("consumerName"))
    ] = ""
    """Name of the consuming pod or VirtualMachine, if known."""
    client_id: Annotated[str, Field(max_length=256, json_schema_extra=_set_once("clientId"))] = ""
    """Thunder client ID the token was exchanged for (a pod's claim); empty for a VM, whose
    guest enrolls itself. Records of earlier releases carry it in `status.clientId` only."""


class ClientPhase(StrEnum):
    """Lifecycle of the enrollment."""

    PENDING = "Pending"
    ENROLLED = "Enrolled"
    REVOKING = "Revoking"
    REVOKED = "Revoked"
    FAILED = "Failed"


class ClientStatus(ApiModel):
    """Where the enrollment stands."""

    phase: ClientPhase = ClientPhase.PENDING
    """Pending, Enrolled, Revoking, Revoked or Failed."""
    client_id: Annotated[str, Field(max_length=256)] | None = None
    """Thunder client ID once the token has been exchanged."""
    revoked_at: datetime | None = None
    """When the enrollment was revoked."""
    orphaned_since: datetime | None = None
    """When the operator first saw the claim gone (or replaced by another UID); cleared
    when it reappears. Revocation happens once this is older than orphanGracePeriod."""
    message: Annotated[str, Field(max_length=32768)] | None = None
    """Human-readable detail, e.g. the last revocation error."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The metadata.generation this status was written for."""


class Client(ApiModel):
    """A whole Client object, as read from the API server."""

    api_version: str = API_VERSION
    kind: Literal["Client"] = "Client"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ClientSpec
    status: ClientStatus | None = None

    @property
    def client_id(self) -> str | None:
        """The recorded Thunder client ID: `spec.clientId`, else (a record of an earlier
        release) `status.clientId`; None if neither has one."""
        status_id = self.status.client_id if self.status else None
        return self.spec.client_id or status_id or None

"""The Lease the operator replicas elect a leader on, as the elector reads and writes it.

`LeaseStore` is the elector's view: three calls on one Lease, each failing as
`LeaseConflict` (another writer came first) or `LeaseUnavailable` (the apiserver failed,
refused or timed out). `KubeLeaseStore` makes them on a `coordination.k8s.io/v1` Lease
through the operator's one Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from thunder_dra.kube import bodies
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import Conflict, KubeError
from thunder_dra.kube.resources import LEASES


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election fields of a Lease's spec, and the version they were read at."""

    holder: str
    lease_duration_seconds: int
    acquire_time: str | None
    renew_time: str | None
    transitions: int
    resource_version: str | None = None


class LeaseConflict(Exception):
    """The Lease changed (or appeared) since it was read: another candidate wrote first."""


class LeaseUnavailable(Exception):
    """The Lease could not be read or written: the apiserver failed, refused or timed out."""


class LeaseStore(Protocol):
    """The three Lease calls the elector makes."""

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord: ...

    async def update(self, record: LeaseRecord) -> LeaseRecord: ...


def micro_time(moment: datetime) -> str:
    """A `MicroTime` as the apiserver writes it: RFC 3339 in UTC, six fractional digits."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeLeaseStore:
    """One Lease in one namespace, through the operator's one Kubernetes client.

    Every Lease request carries its own timeout, `request_timeout` (the renew deadline),
    in place of the client's: a request that outlives it could not keep the term alive
    anyway, and a slow apiserver must not hold a renewal for the client's longer default.
    """

    def __init__(
        self, kube: KubeClient, namespace: str, name: str, *, request_timeout: float
    ) -> None:
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be positive seconds, got {request_timeout!r}")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.request_timeout = request_timeout

    @staticmethod
    def _record(lease: Mapping[str, Any]) -> LeaseRecord:
        spec = bodies.spec(lease)
        return LeaseRecord(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=bodies.resource_version(lease),
        )

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record.resource_version is not None:
            metadata["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": record.holder or None,
                "leaseDurationSeconds": record.lease_duration_seconds,
                "acquireTime": record.acquire_time,
                "renewTime": record.renew_time,
                "leaseTransitions": record.transitions,
            },
        }

    def _unavailable(self, exc: KubeError) -> LeaseUnavailable:
        return LeaseUnavailable(f"Lease {self.namespace}/{self.name}: {exc}")

    async def get(self) -> LeaseRecord | None:
        try:
            found = await self.kube.get_optional(
                LEASES.item(self.name, self.namespace), request_timeout=self.request_timeout
            )
        except KubeError as exc:
            raise self._unavailable(exc) from None
        return None if found is None else self._record(found)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(replace(record, resource_version=None))
        try:
            created = await self.kube.create(
                LEASES.collection(self.namespace), body, request_timeout=self.request_timeout
            )
            return self._record(created)
        except Conflict:
            raise LeaseConflict(f"Lease {self.namespace}/{self.name} exists") from None
        except KubeError as exc:
            raise self._unavailable(exc) from None

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        body = self._body(record)
        try:
            replaced = await self.kube.replace(
                LEASES.item(self.name, self.namespace), body, request_timeout=self.request_timeout
            )
            return self._record(replaced)
        except Conflict:
            raise LeaseConflict(f"Lease {self.namespace}/{self.name} changed") from None
        except KubeError as exc:
            raise self._unavailable(exc) from None

"""One inventory pass: Thunder inventory in, ResourceSlices and DeviceClasses out.

    token (Secret) -> Thunder zones, hosts, clients, targets   (thunderread)
                   -> compute_capacity -> build_pools -> build_device_classes
                   -> plan and apply the writes                 (publish)

The published slices, classes and the claims' allocations are listed alongside the
Thunder read. Nothing published is removed when Thunder cannot be read: a failed zone
list keeps everything, a failed zone keeps its pools (and their classes). A pass where
nothing changed makes no write, also in a freshly started process, which compares with
what it lists rather than with anything remembered.

`extendedResourceName` support is learnt once per process: from existing classes that
carry the field, else from a server-side dry run, else from reading back the first
class written. Once the API server is seen to drop it, classes are planned without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import trace

from thunder_dra.api.constants import API_VERSION, THUNDER_CLUSTER_KIND
from thunder_dra.api.thundercluster import PoolStatus, ThunderCluster
from thunder_dra.controllers.capacity import PoolCapacity, compute_capacity
from thunder_dra.controllers.deviceclasses import build_device_classes, selector_expression
from thunder_dra.controllers.events import EventRecorder, ObjectRef
from thunder_dra.controllers.kubeapi import DEVICE_CLASSES, KubeApi, KubeError
from thunder_dra.controllers.listing import (
    list_claims,
    list_device_classes,
    list_inventory_slices,
)
from thunder_dra.controllers.metrics import OperatorMetrics
from thunder_dra.controllers.publish import Publisher, PublishOutcome
from thunder_dra.controllers.slices import (
    InventoryConfig,
    InventoryLayout,
    OwnerReference,
    build_pools,
    published_devices,
)
from thunder_dra.controllers.status import ConditionState
from thunder_dra.controllers.thunderaccess import ThunderClients, TokenUnavailable, read_token
from thunder_dra.controllers.thunderread import ThunderInventory, read_inventory
from thunder_dra.kube import naming

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

EVENT_NAMES_SHOWN: Final = 20
PROBE_CLASS_NAME: Final = "thunder-extended-resource-check"


@dataclass(slots=True)
class InventoryResult:
    """What a pass found and did, for status, metrics and the loop's timing."""

    result: str
    thunder: ConditionState
    inventory: ConditionState
    pools: list[PoolStatus] | None = None
    synced: bool = False
    writes: int = 0
    retry_soon: bool = False
    outcome: PublishOutcome | None = field(default=None, repr=False)


def _layout(
    read: ThunderInventory,
    config: InventoryConfig,
    slices: Sequence[Mapping[str, Any]],
    allocated: Mapping[str, frozenset[str]],
) -> tuple[list[PoolCapacity], dict[str, frozenset[str]], InventoryLayout]:
    """Capacities, published devices and the pools to publish: CPU work for a thread."""
    capacities = compute_capacity(read.zones)
    current = published_devices(slices)
    layout = build_pools(capacities, config, current_devices=current, allocated_devices=allocated)
    return capacities, current, layout


def _names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:EVENT_NAMES_SHOWN])
    more = len(items) - EVENT_NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}{'es' if noun.endswith('s') else 's'}"


class InventoryReconciler:
    """Runs inventory passes; one per process, shared by passes of the ThunderCluster."""

    def __init__(
        self,
        kube: KubeApi,
        publisher: Publisher,
        events: EventRecorder,
        metrics: OperatorMetrics,
        thunder_clients: ThunderClients,
    ) -> None:
        self._kube = kube
        self._publisher = publisher
        self._events = events
        self._metrics = metrics
        self._thunder_clients = thunder_clients
        self.extended_resource_supported: bool | None = None

    async def run(
        self, cluster: ThunderCluster, ref: ObjectRef, previous_pools: Sequence[PoolStatus]
    ) -> InventoryResult:
        with _tracer.start_as_current_span("thunder.inventory_pass") as span:
            result = await self._run(cluster, ref, previous_pools)
            span.set_attribute("thunder.result", result.result)
            span.set_attribute("thunder.writes", result.writes)
            if result.pools is not None:
                span.set_attribute("thunder.pools", len(result.pools))
            return result

    async def _run(
        self, cluster: ThunderCluster, ref: ObjectRef, previous_pools: Sequence[PoolStatus]
    ) -> InventoryResult:
        spec = cluster.spec
        try:
            token = await read_token(self._kube, spec.thunder)
        except TokenUnavailable as exc:
            await self._events.post(ref, "Warning", exc.reason, str(exc))
            return InventoryResult(
                "secret_unavailable",
                ConditionState(False, exc.reason, str(exc)),
                ConditionState(False, "InventoryStale", "published objects kept: " + str(exc)),
            )
        thunder = await self._thunder_clients.get(spec.thunder.api_url, token)
        concurrency = spec.operator.inventory_concurrency
        read, slices, classes, claims = await asyncio.gather(
            read_inventory(thunder, concurrency),
            list_inventory_slices(self._kube),
            list_device_classes(self._kube),
            list_claims(self._kube, spec.operator.driver_name),
        )
        if not read.available:
            message = f"Thunder inventory could not be read, every pool is kept: {read.error}"
            _log.warning(
                "thunder unreachable, keeping every published pool", extra={"error": read.error}
            )
            await self._events.post(ref, "Warning", "ThunderUnreachable", message)
            self._metrics.thunder_reachable.set(0)
            return InventoryResult(
                "thunder_unavailable",
                ConditionState(False, read.error_kind or "ThunderUnreachable", message),
                ConditionState(False, "InventoryStale", "published objects kept unchanged"),
            )
        self._metrics.thunder_reachable.set(0 if read.unavailable else 1)
        # One event per kind of failure, however many zones: an outage of the hosts
        # endpoint must not become an event per zone per pass.
        if read.unavailable:
            names = [f"{f.zone_name} ({f.zone_id})" for f in read.unavailable]
            await self._events.post(
                ref,
                "Warning",
                "ZoneUnreadable",
                f"{_plural(len(names), 'zone')} could not be read, their pools are kept: "
                f"{_names(names)}; first error: {read.unavailable[0].error}",
            )
        if read.target_failures:
            names = [f"{f.zone_name} ({f.zone_id})" for f in read.target_failures]
            await self._events.post(
                ref,
                "Warning",
                "TargetsUnreadable",
                f"oversubscription targets of {_plural(len(names), 'zone')} could not be read, "
                f"publishing them at 1x: {_names(names)}; first error: "
                f"{read.target_failures[0].error}",
            )
        owner = OwnerReference(
            API_VERSION, THUNDER_CLUSTER_KIND, cluster.metadata.name, cluster.metadata.uid or ""
        )
        config = InventoryConfig.from_spec(spec, owner=owner)
        outcome, pools = await self._publish(
            read, config, slices, classes, claims.allocated_devices(), ref
        )
        del slices
        kept = set(outcome.kept_pools)
        pool_figures = [*pools, *(p for p in previous_pools if p.pool in kept)]
        return self._result(read, outcome, pool_figures)

    async def _publish(
        self,
        read: ThunderInventory,
        config: InventoryConfig,
        slices: list[dict[str, Any]],
        classes: list[dict[str, Any]],
        allocated: Mapping[str, frozenset[str]],
        ref: ObjectRef,
    ) -> tuple[PublishOutcome, list[PoolStatus]]:
        capacities, current, layout = await asyncio.to_thread(
            _layout, read, config, slices, allocated
        )
        for capacity in capacities:
            for warning in capacity.warnings:
                _log.warning(
                    "oversubscription target ignored",
                    extra={"zone": capacity.zone_name, "model": capacity.model, "problem": warning},
                )
        for skipped in layout.skipped:
            await self._events.post(
                ref,
                "Warning",
                "PoolSkipped",
                f"zone {skipped.zone_name!r} model {skipped.model}: {skipped.reason}",
            )
        device_classes = build_device_classes(layout.pools, config)
        supported = await self._extended_resource_support(config, classes)
        outcome = await self._publisher.publish(
            layout.pools,
            device_classes,
            slices,
            classes,
            current,
            inventory_available=True,
            unavailable_zones=read.unavailable_zone_names,
            extended_resource_supported=supported,
        )
        if outcome.extended_resource_dropped and supported:
            self.extended_resource_supported = False
            self._metrics.extended_resource_supported.set(0)
            await self._events.post(
                ref,
                "Warning",
                "ExtendedResourceUnsupported",
                "the API server dropped DeviceClass extendedResourceName (DRAExtendedResource "
                "is off); classes are published without it, request GPUs with ResourceClaims",
            )
        await self._announce(outcome, ref)
        return outcome, [pool.status() for pool in layout.pools]

    async def _extended_resource_support(
        self, config: InventoryConfig, classes: Sequence[Mapping[str, Any]]
    ) -> bool:
        if not config.extended_resource_prefix:
            return True
        if self.extended_resource_supported is None:
            if any((c.get("spec") or {}).get("extendedResourceName") for c in classes):
                self.extended_resource_supported = True
            elif classes:
                self.extended_resource_supported = await self._probe(config)
        if self.extended_resource_supported is not None:
            self._metrics.extended_resource_supported.set(int(self.extended_resource_supported))
            return self.extended_resource_supported
        return True

    async def _probe(self, config: InventoryConfig) -> bool | None:
        """A server-side dry run of a class with the field: does the server keep it?"""
        name = naming.extended_resource_name(config.extended_resource_prefix, "check")
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": PROBE_CLASS_NAME},
            "spec": {
                "selectors": [
                    {"cel": {"expression": selector_expression(config.driver_name, "check")}}
                ],
                "extendedResourceName": name,
            },
        }
        try:
            stored = await self._kube.create(
                DEVICE_CLASSES.collection(), body, resource="deviceclasses", dry_run=True
            )
        except KubeError as exc:
            _log.warning("extendedResourceName probe failed", extra={"error": str(exc)})
            return None
        return bool((stored.get("spec") or {}).get("extendedResourceName"))

    async def _announce(self, outcome: PublishOutcome, ref: ObjectRef) -> None:
        """One Normal event per kind of change, naming the pools and classes."""
        changes: list[tuple[str, list[str]]] = [
            ("DeviceClassesAdded", outcome.added_classes),
            ("DeviceClassesUpdated", outcome.updated_classes),
            ("PoolsAdded", outcome.added_pools),
            (
                "PoolsResized",
                [f"{name} {old}->{new}" for name, old, new in outcome.resized_pools],
            ),
            ("PoolsRemoved", outcome.removed_pools),
            ("DeviceClassesRemoved", outcome.removed_classes),
        ]
        nouns = {"DeviceClasses": "DeviceClass", "Pools": "pool"}
        for reason, names in changes:
            if not names:
                continue
            noun = nouns["Pools" if reason.startswith("Pools") else "DeviceClasses"]
            verb = reason.removeprefix("DeviceClasses").removeprefix("Pools").lower()
            message = f"{verb} {_plural(len(names), noun)}: {_names(names)}"
            _log.info(message, extra={"reason": reason, "count": len(names)})
            await self._events.post(ref, "Normal", reason, message)
        if outcome.errors:
            await self._events.post(
                ref,
                "Warning",
                "PublishFailed",
                f"{_plural(len(outcome.errors), 'write')} failed: {'; '.join(outcome.errors[:5])}",
            )

    @staticmethod
    def _result(
        read: ThunderInventory, outcome: PublishOutcome, pools: list[PoolStatus]
    ) -> InventoryResult:
        if read.unavailable:
            names = sorted(read.unavailable_zone_names)
            thunder = ConditionState(
                False,
                "ZonesUnreadable",
                f"{_plural(len(names), 'zone')} could not be read, their pools are kept: "
                + _names(names),
            )
        else:
            thunder = ConditionState(
                True, "InventoryRead", f"read {_plural(len(read.zones), 'zone')}"
            )
        retry = outcome.conflicts > 0 or outcome.extended_resource_dropped
        if outcome.errors:
            inventory = ConditionState(
                False,
                "PublishFailed",
                f"{_plural(len(outcome.errors), 'write')} failed: " + "; ".join(outcome.errors[:5]),
            )
            result = "failed"
        elif retry:
            inventory = ConditionState(
                False, "Conflict", "objects changed while publishing; retrying"
            )
            result = "conflict"
        else:
            devices = sum(p.published for p in pools)
            inventory = ConditionState(
                True,
                "Synced",
                f"{_plural(len(pools), 'pool')} with {_plural(devices, 'device')} published",
            )
            result = "synced" if outcome.changed else "unchanged"
        if read.unavailable and result in ("synced", "unchanged"):
            result = "partial"
        return InventoryResult(
            result=result,
            thunder=thunder,
            inventory=inventory,
            pools=pools,
            synced=not outcome.errors and not retry and not read.unavailable,
            writes=outcome.writes,
            retry_soon=retry,
            outcome=outcome,
        )

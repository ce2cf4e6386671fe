"""One inventory pass: Thunder inventory in, ResourceSlices and DeviceClasses out.

    token (Secret) -> Thunder zones, hosts, clients, targets   (thunder)
                   -> compute_capacity -> build_pools (limits)  (capacity, slices)
                   -> pools kept for allocated devices, suspect shrinks held (guard)
                   -> devices Thunder does not back tainted       (taints)
                      (NoExecute too once older than noExecuteAfter, if set)
                      all of it in a thread                      (layout)
                   -> devices whose enrollment was refused tainted (binding)
                   -> build_device_classes -> plan and apply the writes (publish)

The published slices, classes and the claims' allocations are listed alongside the
Thunder read. Nothing published is removed when Thunder cannot be read: a failed zone
list keeps everything (`outage_layout`), a failed zone keeps its pools and their classes
(`plan_layout`), each with its devices tainted. A pass where nothing changed makes no
write, also in a freshly started process: it compares with what it lists (the slices'
metadata every pass, their specs from the publisher's cache while their resourceVersion
is the cached one: see listing).

What the API server keeps of `extendedResourceName`, device taints and binding
conditions is learnt once per process (support); what it drops is no longer planned.
The events a pass posts on the ThunderCluster are worded in report.

Refused enrollments come from the ResourceClaim watch (`observe_claim`), between
passes: the operator's kopf handler asks for a pass at once when one starts a
cool-down, and a pass's result says when the first cool-down ends (`wake_in`), so its
taint goes on time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from opentelemetry import trace

from thunder_dra.api.thundercluster import InventoryProtectionSpec, PoolStatus, ThunderCluster
from thunder_dra.controllers.inventory.binding import Refusals
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.layout import outage_layout, plan_layout
from thunder_dra.controllers.inventory.notices import notices, post_notices, tainted_classes
from thunder_dra.controllers.inventory.publish import Publisher, PublishOutcome
from thunder_dra.controllers.inventory.report import (
    announce,
    plural,
    report_guard,
    report_layout,
    report_unreadable,
    shown_names,
    tainted_note,
)
from thunder_dra.controllers.inventory.slices import (
    DesiredPool,
    InventoryConfig,
    published_devices,
)
from thunder_dra.controllers.inventory.support import ServerSupport
from thunder_dra.controllers.inventory.thunder import ThunderInventory, read_inventory
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.controllers.shared.objects import ClaimIndex, list_claims, list_device_classes
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.shared.status import ConditionState
from thunder_dra.controllers.shared.thunderapi import ThunderClients, TokenUnavailable, read_token
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.kube.events import EventRecorder, ObjectRef

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)


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
    suspect: ConditionState | None = None
    """InventorySuspect; None keeps the previous condition (the answer was not judged)."""
    outcome: PublishOutcome | None = field(default=None, repr=False)
    wake_in: float | None = None
    """Seconds until a refused enrollment's cool-down ends and its taint must go."""


class InventoryReconciler:
    """Runs inventory passes; one per process, shared by passes of the ThunderCluster."""

    def __init__(
        self,
        kube: KubeClient,
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
        self.support = ServerSupport(kube, events, metrics)
        """What the API server keeps of taints, binding conditions and extended resources."""
        self.streaks: dict[str, tuple[int, int]] = {}
        """Suspect pools' answers and how many consecutive passes gave them."""
        self.refusals = Refusals()
        """Devices cooling down after a refused enrollment (binding.py)."""

    def observe_claim(self, claim: Mapping[str, Any], *, deleted: bool = False) -> bool:
        """A watched ResourceClaim; whether it started a cool-down (a pass is then due)."""
        return self.refusals.observe(claim, datetime.now(UTC), deleted=deleted)

    @property
    def taints_supported(self) -> bool | None:
        """Whether the API server keeps device taints (`support`)."""
        return self.support.taints_supported

    @property
    def binding_supported(self) -> bool | None:
        """Whether the API server keeps binding conditions (`support`)."""
        return self.support.binding_supported

    async def _learn_taint_support(
        self, slices: Sequence[Mapping[str, Any]], driver_name: str
    ) -> None:
        """Learn taint support before the pass plans (a seam the tests replace)."""
        await self.support.learn_taints(slices, driver_name)

    async def _learn_binding_support(
        self, slices: Sequence[Mapping[str, Any]], driver_name: str
    ) -> None:
        """Learn binding support before the pass plans (a seam the tests replace)."""
        await self.support.learn_binding(slices, driver_name)

    async def _effective_config(
        self, config: InventoryConfig, slices: Sequence[Mapping[str, Any]]
    ) -> InventoryConfig:
        """`config` as this API server can take it: without binding conditions once they
        are seen dropped."""
        if not config.enroll_before_binding:
            return config
        await self._learn_binding_support(slices, config.driver_name)
        if self.support.binding_supported is False:
            return replace(config, enroll_before_binding=False)
        return config

    def _cooling(
        self,
        pools: Sequence[DesiredPool],
        config: InventoryConfig,
        slices: Sequence[Mapping[str, Any]],
        now: datetime,
    ) -> list[DesiredPool]:
        """`pools` with the devices whose enrollment was refused tainted for the cool-down
        (none unless enrollment before binding is on and taints are kept)."""
        if not (config.enroll_before_binding and self.support.taints):
            return list(pools)
        self.refusals.adopt(config.driver_name, slices, now)
        cooling = self.refusals.active(config.driver_name, config.enrollment_cooldown, now)
        out = []
        for pool in pools:
            refused = cooling.get(pool.name, ())
            if refused:
                published = set(pool.devices)
                refused = tuple((d, v) for d, v in refused if d in published)
            out.append(replace(pool, refused=refused) if refused or pool.refused else pool)
        return out

    def _wake_in(self, config: InventoryConfig, now: datetime) -> float | None:
        if not (config.enroll_before_binding and self.support.taints):
            return None
        return self.refusals.seconds_left(config.driver_name, config.enrollment_cooldown, now)

    async def _publish_outage(
        self,
        config: InventoryConfig,
        slices: list[dict[str, Any]],
        allocated: Mapping[str, frozenset[str]],
        ref: ObjectRef,
    ) -> PublishOutcome:
        """Thunder cannot be read at all: taint every published device, delete nothing."""
        pools = await asyncio.to_thread(
            outage_layout, config, slices, allocated, taints=self.support.taints
        )
        pools = tuple(self._cooling(pools, config, slices, datetime.now(UTC)))
        outcome = await self._publisher.publish(
            pools,
            (),
            slices,
            (),
            published_devices(slices),
            inventory_available=False,
        )
        await self.support.check_taints_kept(outcome, ref)
        await self.support.check_binding_kept(outcome, ref)
        return outcome

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
            self._publisher.cache.slices(self._kube),
            list_device_classes(self._kube),
            list_claims(self._kube, spec.operator.driver_name),
        )
        await self._learn_taint_support(slices, spec.operator.driver_name)
        owner = ThunderClusterRef(cluster.metadata.name, cluster.metadata.uid or "")
        config = await self._effective_config(InventoryConfig.from_spec(spec, owner=owner), slices)
        if not read.available:
            message = await self._report_unreachable(read, ref)
            outcome = await self._publish_outage(config, slices, claims.allocated_devices(), ref)
            del slices
            await self._notify_waiting(claims, config)
            return InventoryResult(
                "thunder_unavailable",
                ConditionState(False, read.error_kind or "ThunderUnreachable", message),
                ConditionState(
                    False,
                    "InventoryStale",
                    "published devices kept"
                    + tainted_note(self.support.taints, "ThunderUnreachable"),
                ),
                writes=outcome.writes,
                retry_soon=outcome.conflicts > 0,
                outcome=outcome,
                wake_in=self._wake_in(config, datetime.now(UTC)),
            )
        self._metrics.thunder_reachable.set(0 if read.unavailable else 1)
        await report_unreadable(self._events, read, ref, taints=self.support.taints)
        outcome, pools, suspect = await self._publish(
            read,
            config,
            spec.operator.inventory_protection,
            slices,
            classes,
            claims.allocated_devices(),
            ref,
        )
        del slices
        await self._notify_waiting(claims, config)
        kept = set(outcome.kept_pools)
        pool_figures = [*pools, *(p for p in previous_pools if p.pool in kept)]
        result = self._result(read, outcome, pool_figures)
        result.suspect = suspect
        result.wake_in = self._wake_in(config, datetime.now(UTC))
        return result

    async def _report_unreachable(self, read: ThunderInventory, ref: ObjectRef) -> str:
        """Thunder's zone list could not be read: log, event and metric; the message."""
        message = (
            f"Thunder inventory could not be read, every pool is kept"
            f"{tainted_note(self.support.taints, 'ThunderUnreachable')}: {read.error}"
        )
        _log.warning(
            "thunder unreachable, keeping every published pool", extra={"error": read.error}
        )
        await self._events.post(ref, "Warning", "ThunderUnreachable", message)
        self._metrics.thunder_reachable.set(0)
        return message

    async def _notify_waiting(self, claims: ClaimIndex, config: InventoryConfig) -> None:
        """Tell claims waiting for tainted devices, and their pods, why (`notices`). The
        slices are listed again only when a claim waits."""
        if not claims.pending:
            return
        try:
            slices = await self._publisher.cache.slices(self._kube)
        except KubeError as exc:
            _log.warning("could not list slices for waiting claims", extra={"error": str(exc)})
            return
        tainted = tainted_classes(slices, config.driver_name, config.device_class_prefix)
        if tainted:
            await post_notices(self._events, notices(claims.pending, tainted))

    async def _publish(
        self,
        read: ThunderInventory,
        config: InventoryConfig,
        protection: InventoryProtectionSpec,
        slices: list[dict[str, Any]],
        classes: list[dict[str, Any]],
        allocated: Mapping[str, frozenset[str]],
        ref: ObjectRef,
    ) -> tuple[PublishOutcome, list[PoolStatus], ConditionState]:
        planned = await asyncio.to_thread(
            partial(plan_layout, taints=self.support.taints),
            read,
            config,
            slices,
            allocated,
            protection,
            dict(self.streaks),
        )
        capacities, current, layout = planned.capacities, planned.current, planned.layout
        self.streaks = planned.decision.streaks
        suspect = await report_guard(
            self._events, planned.decision, protection, ref, taints=self.support.taints
        )
        self._metrics.pools_held.set(len(planned.decision.held))
        self._metrics.inventory_clamped.set(1 if layout.clamps else 0)
        await report_layout(self._events, layout, capacities, ref)
        pools = self._cooling(layout.pools, config, slices, datetime.now(UTC))
        device_classes = build_device_classes(pools, config)
        supported = await self.support.extended_resource(config, classes)
        outcome = await self._publisher.publish(
            pools,
            device_classes,
            slices,
            classes,
            current,
            inventory_available=True,
            unavailable_zones=read.unavailable_zone_names,
            keep_pools=planned.decision.held_names,
            extended_resource_supported=supported,
        )
        await self.support.check_extended_resource_kept(outcome, supported, ref)
        await self.support.check_taints_kept(outcome, ref)
        await self.support.check_binding_kept(outcome, ref)
        await announce(self._events, outcome, ref)
        outcome.kept_pools = sorted({*outcome.kept_pools, *planned.kept})
        figures = [pool.status() for pool in pools if pool.name not in planned.kept]
        return outcome, figures, suspect

    @staticmethod
    def _result(
        read: ThunderInventory, outcome: PublishOutcome, pools: list[PoolStatus]
    ) -> InventoryResult:
        if read.unavailable:
            names = sorted(read.unavailable_zone_names)
            thunder = ConditionState(
                False,
                "ZonesUnreadable",
                f"{plural(len(names), 'zone')} could not be read, their pools are kept: "
                + shown_names(names),
            )
        else:
            thunder = ConditionState(
                True, "InventoryRead", f"read {plural(len(read.zones), 'zone')}"
            )
        retry = outcome.conflicts > 0 or outcome.extended_resource_dropped
        if outcome.errors:
            inventory = ConditionState(
                False,
                "PublishFailed",
                f"{plural(len(outcome.errors), 'write')} failed: " + "; ".join(outcome.errors[:5]),
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
                f"{plural(len(pools), 'pool')} with {plural(devices, 'device')} published",
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

"""One inventory pass: Thunder inventory in, ResourceSlices and DeviceClasses out.

    token (Secret) -> Thunder zones, hosts, clients, targets   (thunder)
                   -> compute_capacity -> build_pools (limits)  (capacity, slices)
                   -> pools kept for allocated devices, suspect shrinks held (guard)
                   -> devices Thunder does not back tainted       (taints)
                      (NoExecute too once older than noExecuteAfter, if set)
                   -> devices whose enrollment was refused tainted (binding)
                   -> build_device_classes -> plan and apply the writes (publish)

The published slices, classes and the claims' allocations are listed alongside the
Thunder read. Nothing published is removed when Thunder cannot be read: a failed zone
list keeps everything, a failed zone keeps its pools (and their classes), each with its
devices tainted (`outage_layout`, `plan_layout`). A shrinking answer is held until it
repeats (guard), the devices it would withdraw tainted meanwhile, and devices allocated
to ResourceClaims stay published whatever Thunder says, with their pool and class
(tainted when Thunder no longer backs them). A pass where
nothing changed makes no write, also in a freshly started process: it compares with
what it lists (the slices' metadata every pass, their specs from the publisher's cache
while their resourceVersion is the cached one: see listing).

`extendedResourceName` support is learnt once per process: from existing classes that
carry the field, else from a server-side dry run, else from reading back the first
class written. Once the API server is seen to drop it, classes are planned without it.
Device taint support is learnt the same way (a listed slice with a taint, else a dry
run of a tainted slice, else the first tainted slice written back); once dropped, no
taint is planned. Binding conditions (enrollment before binding, when on) are learnt the
same way; once dropped, devices are published without them.

Refused enrollments come from the ResourceClaim watch (`observe_claim`), between
passes: the operator's kopf handler asks for a pass at once when one starts a
cool-down, and a pass's result says when the first cool-down ends (`wake_in`), so its
taint goes on time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any, Final

from opentelemetry import trace

from thunder_dra.api.thundercluster import InventoryProtectionSpec, PoolStatus, ThunderCluster
from thunder_dra.controllers.inventory.binding import (
    Refusals,
    binding_fields,
    has_binding_conditions,
)
from thunder_dra.controllers.inventory.capacity import PoolCapacity, compute_capacity
from thunder_dra.controllers.inventory.classes import build_device_classes, selector_expression
from thunder_dra.controllers.inventory.guard import GuardDecision, PublishedPool, judge
from thunder_dra.controllers.inventory.notices import notices, post_notices, tainted_classes
from thunder_dra.controllers.inventory.plan import group_by_pool
from thunder_dra.controllers.inventory.publish import Publisher, PublishOutcome
from thunder_dra.controllers.inventory.slices import (
    DesiredPool,
    InventoryConfig,
    InventoryLayout,
    build_pools,
    published_devices,
    retained_pool,
    sample_slices,
)
from thunder_dra.controllers.inventory.taints import (
    STICKY_REASONS,
    TAINT_KEY,
    TaintReason,
    has_taints,
    no_execute_due,
    own_reason,
    taint_body,
    time_added_index,
    unbacked,
)
from thunder_dra.controllers.inventory.thunder import ThunderInventory, read_inventory
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.controllers.shared.objects import ClaimIndex, list_claims, list_device_classes
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.shared.status import ConditionState
from thunder_dra.controllers.shared.thunderapi import ThunderClients, TokenUnavailable, read_token
from thunder_dra.kube import bodies, naming
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.kube.events import EventRecorder, ObjectRef
from thunder_dra.kube.resources import DEVICE_CLASSES, RESOURCE_SLICES

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

EVENT_NAMES_SHOWN: Final = 20
PROBE_CLASS_NAME: Final = "thunder-extended-resource-check"
PROBE_SLICE_NAME: Final = "thunder-device-taint-check"
PROBE_BINDING_SLICE_NAME: Final = "thunder-device-binding-check"


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


@dataclass(frozen=True, slots=True)
class PassLayout:
    """What one pass will publish, computed off the event loop."""

    capacities: list[PoolCapacity]
    current: dict[str, frozenset[str]]
    layout: InventoryLayout
    """The pools to write, held pools and those of unreadable zones included (as
    published, with the devices Thunder does not back tainted)."""
    decision: GuardDecision
    kept: frozenset[str] = frozenset()
    """Pools published as they are (held, or of an unreadable zone): their figures in
    status stay those of the last pass that read them."""


def _published_target(sample: Mapping[str, Any] | None) -> Decimal | None:
    if sample is None:
        return None
    try:
        target = Decimal(bodies.label(sample, naming.LABEL_OVERSUBSCRIPTION) or "")
    except ArithmeticError:
        return None
    return target if target.is_finite() else None


def _published_reasons(slices: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Device name -> the value of this operator's taint, over a pool's slices."""
    reasons: dict[str, str] = {}
    for obj in slices:
        for device in bodies.devices(obj):
            reason, name = own_reason(device), device.get("name")
            if reason is not None and isinstance(name, str):
                reasons[name] = reason
    return reasons


def _tainted(
    pool: DesiredPool,
    reason: TaintReason,
    published: Sequence[Mapping[str, Any]],
    no_execute_after: timedelta | None = None,
    now: datetime | None = None,
) -> DesiredPool:
    """`pool` with the devices beyond what Thunder backs tainted `reason` (see taints.py
    for when a device keeps the reason it has), and NoExecute too on those whose stored
    NoSchedule taint is at least `no_execute_after` old."""
    devices = unbacked(pool.devices, pool.backed)
    if not devices:
        return replace(pool, taints=(), no_execute=())
    sticky = reason in STICKY_REASONS
    before = _published_reasons(published) if sticky else {}
    taints = []
    for device in devices:
        kept = before.get(device)
        taints.append((device, kept if kept in STICKY_REASONS else str(reason)))
    due: tuple[str, ...] = ()
    if no_execute_after is not None:
        index = time_added_index(d for obj in published for d in bodies.devices(obj))
        due = no_execute_due(tuple(taints), index, no_execute_after, now or datetime.now(UTC))
    return replace(pool, taints=tuple(taints), no_execute=due)


def _kept_pool(
    name: str,
    samples: Mapping[str, Mapping[str, Any]],
    current: Mapping[str, frozenset[str]],
    allocated: Mapping[str, frozenset[str]],
    config: InventoryConfig,
) -> DesiredPool | None:
    """A published pool as it is (its devices and those claims hold), backed by none."""
    sample = samples.get(name)
    if sample is None:
        return None
    devices = current.get(name, frozenset()) | allocated.get(name, frozenset())
    return retained_pool(name, sample, devices, config)


def outage_layout(
    config: InventoryConfig,
    slices: Sequence[Mapping[str, Any]],
    allocated: Mapping[str, frozenset[str]],
    *,
    taints: bool = True,
    now: datetime | None = None,
) -> tuple[DesiredPool, ...]:
    """Thunder's zone list could not be read: every published pool as it is, each device
    tainted ThunderUnreachable (or untouched without taints); NoExecute too, on the
    devices whose taint is older than `config.no_execute_after`, at `now`."""
    current = published_devices(slices)
    samples = sample_slices(slices)
    by_pool = group_by_pool(slices) if config.no_execute_after is not None else {}
    pools = []
    for name in sorted(current):
        kept = _kept_pool(name, samples, current, allocated, config)
        if kept is None:
            continue
        if taints:
            kept = _tainted(
                kept,
                TaintReason.THUNDER_UNREACHABLE,
                by_pool.get(name, ()),
                config.no_execute_after,
                now,
            )
        pools.append(kept)
    return tuple(pools)


def plan_layout(
    read: ThunderInventory,
    config: InventoryConfig,
    slices: Sequence[Mapping[str, Any]],
    allocated: Mapping[str, frozenset[str]],
    protection: InventoryProtectionSpec,
    streaks: Mapping[str, tuple[int, int]],
    *,
    taints: bool = True,
    now: datetime | None = None,
) -> PassLayout:
    """Capacities, limits, kept allocations, the shrink guard and the taints of devices
    Thunder does not back: CPU work for a thread. `taints=False` (the API server drops
    them) publishes none. `now` (default: the clock) dates the taints for NoExecute."""
    capacities = compute_capacity(read.zones, max_gpus_per_host=config.max_gpus_per_host)
    current = published_devices(slices)
    listed = [*(zone.zone_name for zone in read.zones), *read.unavailable_zone_names]
    layout = build_pools(
        capacities,
        config,
        current_devices=current,
        allocated_devices=allocated,
        zone_names=listed,
    )
    samples = sample_slices(slices)
    unreadable = read.unavailable_zone_names
    pools: list[DesiredPool] = list(layout.pools)
    answered = {pool.name: pool for pool in pools}
    desired = set(answered)
    # Thunder no longer reports these pools, but claims hold some of their devices.
    for name, devices in sorted(allocated.items()):
        sample = samples.get(name)
        if name in desired or not devices or sample is None:
            continue
        if bodies.slice_zone(sample) in unreadable:
            continue
        kept = retained_pool(name, sample, devices, config)
        if kept is not None:
            pools.append(kept)
    decision = judge(
        [
            PublishedPool(name, bodies.slice_zone(samples[name]) if name in samples else "", len(d))
            for name, d in current.items()
        ],
        {pool.name: len(pool.devices) for pool in pools},
        listed_zones=read.listed_zone_names,
        unreadable_zones=unreadable,
        max_shrink_percent=protection.max_shrink_percent,
        confirm_passes=protection.confirm_passes,
        streaks=streaks,
    )
    held = decision.held_names
    if held and (config.max_devices is not None or config.max_pools is not None):
        # Held pools stay as published and count against the limits: the others share
        # what is left (the held set stays as judged, so a repeated answer is stable).
        kept_devices = sum(len(current.get(name, ())) for name in held)
        reserved = replace(
            config,
            max_devices=None
            if config.max_devices is None
            else max(config.max_devices - kept_devices, 0),
            max_pools=None if config.max_pools is None else max(config.max_pools - len(held), 0),
        )
        rebuilt = build_pools(
            capacities,
            reserved,
            current_devices=current,
            allocated_devices=allocated,
            skip_pools=held,
            zone_names=listed,
        )
        names = {pool.name for pool in rebuilt.pools}
        pools = [
            *rebuilt.pools,
            *(p for p in pools if p.name not in names and p.name not in desired),
        ]
        layout = InventoryLayout(layout.pools, layout.skipped, rebuilt.clamps)
    pools = [pool for pool in pools if pool.name not in held]
    # Held pools stay as published; Thunder backs what it answered of them.
    for name in sorted(held):
        kept = _kept_pool(name, samples, current, allocated, config)
        if kept is not None:
            backed = answered[name].backed if name in answered else 0
            pools.append(replace(kept, backed=backed))
    # Pools of zones that could not be read stay as published, backed by none.
    zone_kept = set()
    for name, sample in sorted(samples.items()):
        if bodies.slice_zone(sample) not in unreadable or name in held:
            continue
        kept = _kept_pool(name, samples, current, allocated, config)
        if kept is not None:
            zone_kept.add(kept.name)
            pools.append(kept)
    if taints:
        by_pool = group_by_pool(slices)
        pools = [
            _tainted(
                pool,
                _reason(pool, read, zone_kept, samples.get(pool.name), answered.get(pool.name)),
                by_pool.get(pool.name, ()),
                config.no_execute_after,
                now,
            )
            for pool in pools
        ]
    pools.sort(key=lambda p: p.name)
    layout = InventoryLayout(tuple(pools), layout.skipped, layout.clamps)
    return PassLayout(capacities, current, layout, decision, frozenset(held | zone_kept))


def _reason(
    pool: DesiredPool,
    read: ThunderInventory,
    zone_kept: Collection[str],
    sample: Mapping[str, Any] | None,
    answer: DesiredPool | None,
) -> TaintReason:
    """Why the devices of `pool` beyond what Thunder backs are not backed."""
    if pool.name in zone_kept:
        return TaintReason.ZONE_UNREADABLE
    if pool.zone_name not in read.listed_zone_names:
        return TaintReason.ZONE_NOT_LISTED
    published = _published_target(sample)
    if answer is not None and published is not None and answer.target < published:
        return TaintReason.TARGET_LOWERED
    return TaintReason.HOSTS_OFFLINE


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
        self.extended_resource_supported: bool | None = None
        self.streaks: dict[str, tuple[int, int]] = {}
        """Suspect pools' answers and how many consecutive passes gave them."""
        self.taints_supported: bool | None = None
        """Whether the API server keeps device taints; learnt once per process."""
        self._taints_report_due = False
        self.binding_supported: bool | None = None
        """Whether the API server keeps binding conditions; learnt once per process."""
        self._binding_report_due = False
        self.refusals = Refusals()
        """Devices cooling down after a refused enrollment (binding.py)."""

    def observe_claim(self, claim: Mapping[str, Any], *, deleted: bool = False) -> bool:
        """A watched ResourceClaim; whether it started a cool-down (a pass is then due)."""
        return self.refusals.observe(claim, datetime.now(UTC), deleted=deleted)

    async def _learn_binding_support(
        self, slices: Sequence[Mapping[str, Any]], driver_name: str
    ) -> None:
        """Whether the API server keeps bindsToNode and binding conditions, learnt once per
        process like taint support (`_learn_taint_support`)."""
        if self.binding_supported is not None:
            return
        if any(has_binding_conditions(obj) for obj in slices):
            self.binding_supported = True
            return
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": PROBE_BINDING_SLICE_NAME},
            "spec": {
                "driver": driver_name,
                "pool": {
                    "name": PROBE_BINDING_SLICE_NAME,
                    "generation": 1,
                    "resourceSliceCount": 1,
                },
                "allNodes": True,
                "devices": [{"name": "check", **binding_fields()}],
            },
        }
        try:
            stored = await self._kube.create(RESOURCE_SLICES.collection(), body, dry_run=True)
        except KubeError as exc:
            _log.warning("binding conditions probe failed", extra={"error": str(exc)})
            return
        if isinstance(stored, Mapping) and has_binding_conditions(stored):
            self.binding_supported = True
        else:
            self.binding_supported = False
            self._binding_report_due = True

    async def _check_binding_kept(self, outcome: PublishOutcome, ref: ObjectRef) -> None:
        """Once per process: the API server dropped the binding conditions written
        (DRADeviceBindingConditions off, as on 1.34 and 1.35). From then on devices are
        published and compared without them."""
        if outcome.binding_dropped and self.binding_supported is not False:
            self.binding_supported = False
            self._binding_report_due = True
        elif outcome.binding_kept and self.binding_supported is None:
            self.binding_supported = True
        if self._binding_report_due:
            self._binding_report_due = False
            message = (
                "the API server dropped ResourceSlice binding conditions "
                "(DRADeviceBindingConditions is off); spec.operator.enrollBeforeBinding is "
                "ignored: devices are published without them, and claims are enrolled when "
                "the kubelet prepares them"
            )
            _log.warning(message, extra={"reason": "DeviceBindingUnsupported"})
            await self._events.post(ref, "Warning", "DeviceBindingUnsupported", message)

    async def _effective_config(
        self, config: InventoryConfig, slices: Sequence[Mapping[str, Any]]
    ) -> InventoryConfig:
        """`config` as this API server can take it: without binding conditions once they
        are seen dropped."""
        if not config.enroll_before_binding:
            return config
        await self._learn_binding_support(slices, config.driver_name)
        if self.binding_supported is False:
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
        if not (config.enroll_before_binding and self._taints):
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
        if not (config.enroll_before_binding and self._taints):
            return None
        return self.refusals.seconds_left(config.driver_name, config.enrollment_cooldown, now)

    async def _learn_taint_support(
        self, slices: Sequence[Mapping[str, Any]], driver_name: str
    ) -> None:
        """Whether the API server keeps device taints, learnt once per process: from a
        listed slice that holds one, else from a server-side dry run (no write), else from
        the first slice written with one (`_check_taints_kept`)."""
        if self.taints_supported is not None:
            return
        if any(has_taints(obj) for obj in slices):
            self.taints_supported = True
            return
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": PROBE_SLICE_NAME},
            "spec": {
                "driver": driver_name,
                "pool": {"name": PROBE_SLICE_NAME, "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [
                    {"name": "check", "taints": [taint_body(TaintReason.THUNDER_UNREACHABLE)]}
                ],
            },
        }
        try:
            stored = await self._kube.create(RESOURCE_SLICES.collection(), body, dry_run=True)
        except KubeError as exc:
            _log.warning("device taint probe failed", extra={"error": str(exc)})
            return
        if isinstance(stored, Mapping) and has_taints(stored):
            self.taints_supported = True
        else:
            await self._taints_unsupported()

    async def _taints_unsupported(self) -> None:
        self.taints_supported = False
        self._taints_report_due = True

    @property
    def _taints(self) -> bool:
        return self.taints_supported is not False

    def _held_note(self) -> str:
        if not self._taints:
            return ""
        return f", the devices Thunder does not back tainted {TAINT_KEY}:NoSchedule,"

    def _tainted_note(self, reason: str) -> str:
        return f", their devices tainted {TAINT_KEY}={reason}:NoSchedule" if self._taints else ""

    async def _publish_outage(
        self,
        config: InventoryConfig,
        slices: list[dict[str, Any]],
        allocated: Mapping[str, frozenset[str]],
        ref: ObjectRef,
    ) -> PublishOutcome:
        """Thunder cannot be read at all: taint every published device, delete nothing."""
        pools = await asyncio.to_thread(
            outage_layout, config, slices, allocated, taints=self._taints
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
        await self._check_taints_kept(outcome, ref)
        await self._check_binding_kept(outcome, ref)
        return outcome

    async def _check_taints_kept(self, outcome: PublishOutcome, ref: ObjectRef) -> None:
        """Once per process: the API server dropped the taints written (DRADeviceTaints
        off, as on 1.34 and 1.35). From then on no taint is published or compared."""
        if outcome.taints_dropped and self._taints:
            await self._taints_unsupported()
        elif outcome.taints_kept and self.taints_supported is None:
            self.taints_supported = True
        if self._taints_report_due:
            self._taints_report_due = False
            message = (
                "the API server dropped ResourceSlice device taints (DRADeviceTaints is off); "
                "devices Thunder does not back are published without a taint, so the "
                "scheduler may still allocate them"
            )
            _log.warning(message, extra={"reason": "DeviceTaintsUnsupported"})
            await self._events.post(ref, "Warning", "DeviceTaintsUnsupported", message)

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
            message = (
                f"Thunder inventory could not be read, every pool is kept"
                f"{self._tainted_note('ThunderUnreachable')}: {read.error}"
            )
            _log.warning(
                "thunder unreachable, keeping every published pool", extra={"error": read.error}
            )
            await self._events.post(ref, "Warning", "ThunderUnreachable", message)
            self._metrics.thunder_reachable.set(0)
            outcome = await self._publish_outage(config, slices, claims.allocated_devices(), ref)
            del slices
            await self._notify_waiting(claims, config)
            return InventoryResult(
                "thunder_unavailable",
                ConditionState(False, read.error_kind or "ThunderUnreachable", message),
                ConditionState(
                    False,
                    "InventoryStale",
                    "published devices kept" + self._tainted_note("ThunderUnreachable"),
                ),
                writes=outcome.writes,
                retry_soon=outcome.conflicts > 0,
                outcome=outcome,
                wake_in=self._wake_in(config, datetime.now(UTC)),
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
                f"{_plural(len(names), 'zone')} could not be read, their pools are kept"
                f"{self._tainted_note('ZoneUnreadable')}: {_names(names)}; first error: "
                f"{read.unavailable[0].error}",
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
            partial(plan_layout, taints=self._taints),
            read,
            config,
            slices,
            allocated,
            protection,
            dict(self.streaks),
        )
        capacities, current, layout = planned.capacities, planned.current, planned.layout
        self.streaks = planned.decision.streaks
        suspect = await self._report_guard(planned.decision, protection, ref)
        self._metrics.pools_held.set(len(planned.decision.held))
        self._metrics.inventory_clamped.set(1 if layout.clamps else 0)
        if layout.clamps:
            message = "Thunder reported more than the limits allow: " + "; ".join(layout.clamps)
            _log.warning(message, extra={"reason": "InventoryClamped"})
            await self._events.post(ref, "Warning", "InventoryClamped", message)
        for capacity in capacities:
            for warning in capacity.warnings:
                _log.warning(
                    "oversubscription target ignored",
                    extra={"zone": capacity.zone_name, "model": capacity.model, "problem": warning},
                )
        if layout.skipped:
            # One event for all of them: a hostile answer may name thousands of zones.
            first = layout.skipped[0]
            names = [f"zone {s.zone_name!r} model {s.model}" for s in layout.skipped]
            await self._events.post(
                ref,
                "Warning",
                "PoolSkipped",
                f"{_plural(len(names), 'pool')} not published: {_names(names)}: {first.reason}",
            )
        pools = self._cooling(layout.pools, config, slices, datetime.now(UTC))
        device_classes = build_device_classes(pools, config)
        supported = await self._extended_resource_support(config, classes)
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
        await self._check_taints_kept(outcome, ref)
        await self._check_binding_kept(outcome, ref)
        await self._announce(outcome, ref)
        outcome.kept_pools = sorted({*outcome.kept_pools, *planned.kept})
        figures = [pool.status() for pool in pools if pool.name not in planned.kept]
        return outcome, figures, suspect

    async def _report_guard(
        self, decision: GuardDecision, protection: InventoryProtectionSpec, ref: ObjectRef
    ) -> ConditionState:
        confirm = protection.confirm_passes
        if decision.confirmed:
            described = [pool.describe(confirm) for pool in decision.confirmed]
            message = (
                f"Thunder's shrinking answer repeated {confirm} passes and is applied to "
                f"{_plural(len(described), 'pool')}: {_names(described)}"
            )
            _log.warning(message, extra={"reason": "InventoryShrinkConfirmed"})
            await self._events.post(ref, "Normal", "InventoryShrinkConfirmed", message)
        if not decision.held:
            return ConditionState(False, "InventoryTrusted", "no shrinking answer is held back")
        described = [pool.describe(confirm) for pool in decision.held]
        zones = list(decision.held_zones)
        message = (
            f"Thunder's answer would withdraw published devices; kept as published"
            f"{self._held_note()} until the same answer repeats {confirm} passes: "
            f"{_plural(len(zones), 'zone')} "
            f"({_names(zones)}), {_plural(len(described), 'pool')}: {_names(described)}"
        )
        _log.warning(message, extra={"reason": "InventorySuspect", "pools": len(described)})
        await self._events.post(ref, "Warning", "InventorySuspect", message)
        return ConditionState(True, "ShrinkHeld", message)

    async def _extended_resource_support(
        self, config: InventoryConfig, classes: Sequence[Mapping[str, Any]]
    ) -> bool:
        if not config.extended_resource_prefix:
            return True
        if self.extended_resource_supported is None:
            if any(bodies.spec(c).get("extendedResourceName") for c in classes):
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
            stored = await self._kube.create(DEVICE_CLASSES.collection(), body, dry_run=True)
        except KubeError as exc:
            _log.warning("extendedResourceName probe failed", extra={"error": str(exc)})
            return None
        return bool(bodies.spec(stored).get("extendedResourceName"))

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

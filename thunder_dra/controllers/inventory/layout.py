"""What a pass publishes: the pools laid out from Thunder's answer (`plan_layout`), or
from the published slices alone when Thunder cannot be read (`outage_layout`).

Nothing published is removed when Thunder cannot be read: a failed zone list keeps
every pool, a failed zone keeps its pools, each with its devices tainted. A shrinking
answer is held until it repeats (guard), the devices it would withdraw tainted
meanwhile, and devices allocated to ResourceClaims stay published whatever Thunder says,
with their pool (tainted when Thunder no longer backs them). Pure functions: the
reconciler runs them in a thread.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from thunder_dra.api.thundercluster import InventoryProtectionSpec
from thunder_dra.controllers.inventory.capacity import PoolCapacity, compute_capacity
from thunder_dra.controllers.inventory.guard import GuardDecision, PublishedPool, judge
from thunder_dra.controllers.inventory.plan import group_by_pool
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
    TaintReason,
    no_execute_due,
    own_reason,
    time_added_index,
    unbacked,
)
from thunder_dra.controllers.inventory.thunder import ThunderInventory
from thunder_dra.kube import bodies, naming


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


def _claimed_pools(
    samples: Mapping[str, Mapping[str, Any]],
    allocated: Mapping[str, frozenset[str]],
    desired: Collection[str],
    unreadable: Collection[str],
    config: InventoryConfig,
) -> list[DesiredPool]:
    """Published pools Thunder no longer reports whose devices claims still hold (those
    of unreadable zones are kept with their zone)."""
    pools = []
    for name, devices in sorted(allocated.items()):
        sample = samples.get(name)
        if name in desired or not devices or sample is None:
            continue
        if bodies.slice_zone(sample) in unreadable:
            continue
        kept = retained_pool(name, sample, devices, config)
        if kept is not None:
            pools.append(kept)
    return pools


def _rebuilt_around_kept(
    capacities: list[PoolCapacity],
    config: InventoryConfig,
    current: Mapping[str, frozenset[str]],
    allocated: Mapping[str, frozenset[str]],
    kept: Mapping[str, int],
    zone_names: Sequence[str],
) -> InventoryLayout:
    """The pools built again from what the limits leave once the pools published whatever
    the answer (`kept`: pool name -> the devices it keeps) are counted against them."""
    kept_devices = sum(kept.values())
    reserved = replace(
        config,
        max_devices=None
        if config.max_devices is None
        else max(config.max_devices - kept_devices, 0),
        max_pools=None if config.max_pools is None else max(config.max_pools - len(kept), 0),
    )
    return build_pools(
        capacities,
        reserved,
        current_devices=current,
        allocated_devices=allocated,
        skip_pools=frozenset(kept),
        zone_names=zone_names,
    )


def _unreadable_zone_pools(
    samples: Mapping[str, Mapping[str, Any]],
    unreadable: Collection[str],
    held: Collection[str],
    current: Mapping[str, frozenset[str]],
    allocated: Mapping[str, frozenset[str]],
    config: InventoryConfig,
) -> list[DesiredPool]:
    """The published pools of zones that could not be read (held ones aside), as they are."""
    pools = []
    for name, sample in sorted(samples.items()):
        if bodies.slice_zone(sample) not in unreadable or name in held:
            continue
        kept = _kept_pool(name, samples, current, allocated, config)
        if kept is not None:
            pools.append(kept)
    return pools


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
    claimed = _claimed_pools(samples, allocated, desired, unreadable, config)
    pools.extend(claimed)
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
    # Pools published whatever the answer: the held ones and those of zones that could
    # not be read, as published, and those kept for their claims, with the claimed devices.
    # A pool kept for its claims holds its place under the limits while Thunder does not
    # report it, so no pool is published in its place only to be withdrawn when it is back.
    as_published = held | {
        name for name, sample in samples.items() if bodies.slice_zone(sample) in unreadable
    }
    fixed = {name: len(current.get(name, ())) for name in as_published}
    fixed.update((pool.name, len(pool.devices)) for pool in claimed if pool.name not in held)
    if fixed and (config.max_devices is not None or config.max_pools is not None):
        # Pools kept count against the limits: the others share what is left (the held
        # set stays as judged, so a repeated answer is stable).
        rebuilt = _rebuilt_around_kept(capacities, config, current, allocated, fixed, listed)
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
    of_unreadable = _unreadable_zone_pools(samples, unreadable, held, current, allocated, config)
    zone_kept = {pool.name for pool in of_unreadable}
    pools.extend(of_unreadable)
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

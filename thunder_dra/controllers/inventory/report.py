"""What a pass tells: its Warning and Normal events on the ThunderCluster, and the log
lines that go with them. One event per kind of change or failure, naming at most
`EVENT_NAMES_SHOWN` objects: a hostile answer may name thousands of zones.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from thunder_dra.api.thundercluster import InventoryProtectionSpec
from thunder_dra.controllers.inventory.capacity import PoolCapacity
from thunder_dra.controllers.inventory.guard import GuardDecision
from thunder_dra.controllers.inventory.publish import PublishOutcome
from thunder_dra.controllers.inventory.slices import InventoryLayout
from thunder_dra.controllers.inventory.taints import TAINT_KEY
from thunder_dra.controllers.inventory.thunder import ThunderInventory
from thunder_dra.controllers.shared.status import ConditionState
from thunder_dra.kube.events import EventRecorder, ObjectRef

_log = logging.getLogger(__name__)

EVENT_NAMES_SHOWN: Final = 20


def shown_names(items: Sequence[str]) -> str:
    shown = ", ".join(items[:EVENT_NAMES_SHOWN])
    more = len(items) - EVENT_NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def plural(count: int, noun: str) -> str:
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}{'es' if noun.endswith('s') else 's'}"


def held_note(taints: bool) -> str:
    if not taints:
        return ""
    return f", the devices Thunder does not back tainted {TAINT_KEY}:NoSchedule,"


def tainted_note(taints: bool, reason: str) -> str:
    return f", their devices tainted {TAINT_KEY}={reason}:NoSchedule" if taints else ""


async def report_unreadable(
    events: EventRecorder, read: ThunderInventory, ref: ObjectRef, *, taints: bool
) -> None:
    """The zones, and the zones' targets, Thunder could not be read for."""
    # One event per kind of failure, however many zones: an outage of the hosts
    # endpoint must not become an event per zone per pass.
    if read.unavailable:
        names = [f"{f.zone_name} ({f.zone_id})" for f in read.unavailable]
        await events.post(
            ref,
            "Warning",
            "ZoneUnreadable",
            f"{plural(len(names), 'zone')} could not be read, their pools are kept"
            f"{tainted_note(taints, 'ZoneUnreadable')}: {shown_names(names)}; first error: "
            f"{read.unavailable[0].error}",
        )
    if read.target_failures:
        names = [f"{f.zone_name} ({f.zone_id})" for f in read.target_failures]
        await events.post(
            ref,
            "Warning",
            "TargetsUnreadable",
            f"oversubscription targets of {plural(len(names), 'zone')} could not be read, "
            f"publishing them at 1x: {shown_names(names)}; first error: "
            f"{read.target_failures[0].error}",
        )


async def report_layout(
    events: EventRecorder,
    layout: InventoryLayout,
    capacities: Sequence[PoolCapacity],
    ref: ObjectRef,
) -> None:
    """What the layout could not publish as Thunder answered: limits that clamped it,
    oversubscription targets ignored, pools skipped."""
    if layout.clamps:
        message = "Thunder reported more than the limits allow: " + "; ".join(layout.clamps)
        _log.warning(message, extra={"reason": "InventoryClamped"})
        await events.post(ref, "Warning", "InventoryClamped", message)
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
        await events.post(
            ref,
            "Warning",
            "PoolSkipped",
            f"{plural(len(names), 'pool')} not published: {shown_names(names)}: {first.reason}",
        )


async def report_guard(
    events: EventRecorder,
    decision: GuardDecision,
    protection: InventoryProtectionSpec,
    ref: ObjectRef,
    *,
    taints: bool,
) -> ConditionState:
    """The guard's decision told: pools it confirmed shrinking, pools it holds; the
    InventorySuspect condition."""
    confirm = protection.confirm_passes
    if decision.confirmed:
        described = [pool.describe(confirm) for pool in decision.confirmed]
        message = (
            f"Thunder's shrinking answer repeated {confirm} passes and is applied to "
            f"{plural(len(described), 'pool')}: {shown_names(described)}"
        )
        _log.warning(message, extra={"reason": "InventoryShrinkConfirmed"})
        await events.post(ref, "Normal", "InventoryShrinkConfirmed", message)
    if not decision.held:
        return ConditionState(False, "InventoryTrusted", "no shrinking answer is held back")
    described = [pool.describe(confirm) for pool in decision.held]
    zones = list(decision.held_zones)
    message = (
        f"Thunder's answer would withdraw published devices; kept as published"
        f"{held_note(taints)} until the same answer repeats {confirm} passes: "
        f"{plural(len(zones), 'zone')} "
        f"({shown_names(zones)}), {plural(len(described), 'pool')}: {shown_names(described)}"
    )
    _log.warning(message, extra={"reason": "InventorySuspect", "pools": len(described)})
    await events.post(ref, "Warning", "InventorySuspect", message)
    return ConditionState(True, "ShrinkHeld", message)


async def announce(events: EventRecorder, outcome: PublishOutcome, ref: ObjectRef) -> None:
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
        message = f"{verb} {plural(len(names), noun)}: {shown_names(names)}"
        _log.info(message, extra={"reason": reason, "count": len(names)})
        await events.post(ref, "Normal", reason, message)
    if outcome.errors:
        await events.post(
            ref,
            "Warning",
            "PublishFailed",
            f"{plural(len(outcome.errors), 'write')} failed: {'; '.join(outcome.errors[:5])}",
        )

"""Device taints from Thunder's view (docs/operator.md#device-taints).

A published device that Thunder no longer backs carries one taint, at once, before any
withdrawal:

    key: thundercompute.com/unbacked   effect: NoSchedule   value: why, one of
    ThunderUnreachable  the zone list could not be read: every published device
    ZoneUnreadable      the zone's hosts or clients could not be read: its every device
    ZoneNotListed       Thunder no longer lists the zone (or lists no zones at all)
    HostsOffline        the pool's hosts went offline, were cordoned or are gone
    TargetLowered       the pool's oversubscription target was lowered

The scheduler then allocates none of these devices to new claims (a claim must
tolerate the taint), and claims that hold one keep it: `NoSchedule` evicts nothing.
In a pool that Thunder backs partly, the devices beyond what it backs are tainted, the
highest indices first: the devices a confirmed shrink withdraws, or, for devices
claims hold, those that stay published only because they are allocated. The taint
goes when Thunder backs the device again (or with the device, once withdrawn).

`HostsOffline` and `TargetLowered` are told apart by the pool's published target: a
lower new target is `TargetLowered`. Once a device carries one of the two, it keeps
it while it stays unbacked, so the value does not flip on the pass after the pool's
target label was rewritten.

With `spec.operator.inventoryProtection.noExecuteAfter` set (off by default), a device
whose NoSchedule taint is at least that old, by its stored `timeAdded`, also carries the
same key and value with effect `NoExecute` (`no_execute_due`). It is a second entry
rather than a changed effect, so the NoSchedule taint keeps its `timeAdded` (the
outage's start, which the count runs from, also across operator restarts), the
NoExecute entry gets its own (from which claims' `tolerationSeconds` run), and turning
the setting off removes one entry without touching the other. kube-controller-manager's
`device-taint-eviction-controller` then evicts the pods whose claims hold the device and
do not tolerate the taint. A taint whose value changes starts counting again; both
entries go when Thunder backs the device again.

The API server fills in `timeAdded` when a taint lacks it; the planner carries the
stored `timeAdded` of the same taint (key, value and effect) on the same device back
into the desired body (`carry_time_added`), so a pass with no change writes nothing.
A server that drops `taints` (the DRADeviceTaints feature off, as on 1.34 and 1.35)
is told apart by `taints_dropped`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from thunder_dra.kube import naming

TAINT_KEY: Final = f"{naming.DRIVER_NAME}/unbacked"
EFFECT_NO_SCHEDULE: Final = "NoSchedule"
EFFECT_NO_EXECUTE: Final = "NoExecute"
MAX_TAINTS_PER_DEVICE: Final = 16
"""The API's limit of taints per device (this operator sets at most two)."""
MAX_DEVICES_PER_TAINTED_SLICE: Final = 64
"""The API's limit of devices in a slice that holds any tainted device."""


class TaintReason(StrEnum):
    """The taint's value: a label value a user can read."""

    THUNDER_UNREACHABLE = "ThunderUnreachable"
    ZONE_UNREADABLE = "ZoneUnreadable"
    ZONE_NOT_LISTED = "ZoneNotListed"
    HOSTS_OFFLINE = "HostsOffline"
    TARGET_LOWERED = "TargetLowered"


STICKY_REASONS: Final = frozenset({TaintReason.HOSTS_OFFLINE, TaintReason.TARGET_LOWERED})
"""Reasons a device keeps while it stays unbacked (see the module docstring)."""

DeviceTaints = tuple[tuple[str, str], ...]
"""(device name, reason) of a pool's tainted devices, in device order."""


def unbacked(devices: Sequence[str], backed: int) -> tuple[str, ...]:
    """The devices beyond the first `backed` (devices come in index order)."""
    return tuple(devices[max(backed, 0) :])


def taint_body(
    reason: str, time_added: str | None = None, effect: str = EFFECT_NO_SCHEDULE
) -> dict[str, Any]:
    body: dict[str, Any] = {"key": TAINT_KEY, "value": reason, "effect": effect}
    if time_added:
        body["timeAdded"] = time_added
    return body


def device_taints(device: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    taints = device.get("taints")
    if not isinstance(taints, list):
        return []
    return [t for t in taints if isinstance(t, Mapping)]


def own_reason(device: Mapping[str, Any]) -> str | None:
    """The value of this operator's taint on a published device, if it has one."""
    for taint in device_taints(device):
        if taint.get("key") == TAINT_KEY and isinstance(taint.get("value"), str):
            value: str = taint["value"]
            return value
    return None


TimeAddedIndex = Mapping[tuple[str, str, str, str], str]
"""(device name, key, value, effect) -> the stored timeAdded of that taint."""


def time_added_index(devices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str, str], str]:
    """The stored `timeAdded` of every taint of `devices` (published device bodies)."""
    index: dict[tuple[str, str, str, str], str] = {}
    for device in devices:
        name = device.get("name")
        if not isinstance(name, str):
            continue
        for taint in device_taints(device):
            added = taint.get("timeAdded")
            if isinstance(added, str) and added:
                key = (
                    name,
                    str(taint.get("key")),
                    str(taint.get("value")),
                    str(taint.get("effect")),
                )
                index[key] = added
    return index


def carry_time_added(
    device: str, taint: Mapping[str, Any], index: TimeAddedIndex
) -> dict[str, Any]:
    """`taint` with the stored timeAdded of the same taint on the same device, if any."""
    added = index.get(
        (device, str(taint.get("key")), str(taint.get("value")), str(taint.get("effect")))
    )
    return {**taint, "timeAdded": added} if added else dict(taint)


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time as the API server writes `timeAdded`; None if it is not one."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def no_execute_due(
    taints: DeviceTaints, index: TimeAddedIndex, after: timedelta | None, now: datetime
) -> tuple[str, ...]:
    """The devices of `taints` whose stored NoSchedule taint, with the same value, was
    added at least `after` before `now` (none when `after` is None): they also get the
    taint with effect NoExecute. A taint not yet stored, or with a `timeAdded` that is not
    a time, is not due."""
    if after is None:
        return ()
    due = []
    for device, reason in taints:
        added = index.get((device, TAINT_KEY, reason, EFFECT_NO_SCHEDULE))
        since = parse_time(added) if added else None
        if since is not None and now - since >= after:
            due.append(device)
    return tuple(due)


def has_taints(body: Mapping[str, Any]) -> bool:
    """Whether a ResourceSlice body holds any tainted device."""
    spec = body.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    return isinstance(devices, list) and any(
        isinstance(d, Mapping) and device_taints(d) for d in devices
    )


def taints_dropped(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """Whether the API server stored a slice without the taints it was sent."""
    return has_taints(sent) and not has_taints(stored)

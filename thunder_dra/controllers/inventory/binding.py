"""Enrollment before binding: the devices' binding conditions, and the cool-down of a
device whose enrollment Thunder refused (docs/operator.md#enrollment-before-binding).

With `spec.operator.enrollBeforeBinding.enabled` (off by default) every published
device carries

    bindsToNode: true
    bindingConditions: [thundercompute.com/Enrolled]
    bindingFailureConditions: [thundercompute.com/EnrollmentFailed]

so the scheduler, once it has allocated a device, writes the allocation for the node it
chose and waits (polling every 5 s, up to its binding timeout) until the daemon on that
node sets one of the two conditions in the claim's `status.devices`. Enrolled binds the
pod; EnrollmentFailed makes the scheduler clear the allocation and try again.

The allocator is first-fit, so its retry would pick the device that just failed. When a
claim shows EnrollmentFailed True for one of this driver's devices, the operator taints
that device

    key: thundercompute.com/enrollment-refused   effect: NoSchedule
    value: the condition's reason (as a label value), else EnrollmentRefused

for `enrollBeforeBinding.cooldown`, so the retry lands on another device. The claims are
watched (not read at the next pass: the scheduler retries within seconds and clears the
allocation, and with it the condition, soon after), and the refusal is remembered here,
not re-read from the claim. A refusal seen again while its device cools down starts the
cool-down again. The taint is part of the slices' taints like the `unbacked` one, with
its `timeAdded` carried, so it costs one write when it comes and one when it goes. An
operator that starts (or a replica that takes over) and finds such a taint published
keeps it until the cool-down counted from its `timeAdded` ends.

A server that drops the binding fields (DRADeviceBindingConditions off, as on 1.34 and
1.35) is told apart like one that drops taints (`binding_dropped`): the operator then
publishes devices without them and says so once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from thunder_dra.api import syntax
from thunder_dra.controllers.inventory.taints import (
    EFFECT_NO_SCHEDULE,
    DeviceTaints,
    device_taints,
    parse_time,
)
from thunder_dra.kube import bodies, naming
from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED

REFUSED_TAINT_KEY: Final = f"{naming.DRIVER_NAME}/enrollment-refused"
REFUSED_DEFAULT_VALUE: Final = "EnrollmentRefused"
LABEL_VALUE_MAX: Final = 63
MAX_REMEMBERED: Final = 10000
"""Most claim devices whose failure condition is remembered (so a repeated watch event of
the same failure does not restart its cool-down); beyond it the oldest are forgotten."""
LONGEST_COOLDOWN: Final = timedelta(hours=1)
"""The longest `cooldown` the ThunderCluster takes."""
_NOT_VALUE_CHARS: Final = re.compile(r"[^A-Za-z0-9_.-]+")

DeviceKey = tuple[str, str, str]
"""(driver, pool, device) of a published device."""


def binding_fields() -> dict[str, Any]:
    """The fields every device carries when enrollment before binding is on."""
    return {
        "bindsToNode": True,
        "bindingConditions": [ENROLLED],
        "bindingFailureConditions": [ENROLLMENT_FAILED],
    }


def refused_taint_body(value: str) -> dict[str, Any]:
    """The cool-down taint of a device whose enrollment Thunder refused (no timeAdded)."""
    return {"key": REFUSED_TAINT_KEY, "value": value, "effect": EFFECT_NO_SCHEDULE}


def has_binding_conditions(body: Mapping[str, Any]) -> bool:
    """Whether a ResourceSlice body has a device with binding conditions."""
    return any(d.get("bindingConditions") for d in bodies.devices(body))


def binding_dropped(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """Whether the API server stored a slice without the binding conditions it was sent."""
    return has_binding_conditions(sent) and not has_binding_conditions(stored)


def refused_value(reason: object) -> str:
    """A taint value (a label value) from a condition's reason."""
    text = _NOT_VALUE_CHARS.sub("-", reason if isinstance(reason, str) else "")
    text = text[:LABEL_VALUE_MAX].strip("-_.")
    return text if text and syntax.is_label_value(text) else REFUSED_DEFAULT_VALUE


@dataclass(frozen=True, slots=True)
class Refusal:
    value: str
    since: datetime


Failure = tuple[str, str]
"""The failure condition's reason and lastTransitionTime: one refusal's identity."""


def failed_devices(claim: Mapping[str, Any]) -> dict[DeviceKey, Failure]:
    """(driver, pool, device) -> `Failure` of every device in a claim's
    `status.devices` whose EnrollmentFailed condition is True."""
    found: dict[DeviceKey, Failure] = {}
    entries = bodies.status(claim).get("devices")
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping):
            continue
        driver, pool, device = entry.get("driver"), entry.get("pool"), entry.get("device")
        if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
            continue
        conditions = entry.get("conditions")
        for condition in conditions if isinstance(conditions, list) else ():
            if (
                isinstance(condition, Mapping)
                and condition.get("type") == ENROLLMENT_FAILED
                and condition.get("status") == "True"
            ):
                reason, since = condition.get("reason"), condition.get("lastTransitionTime")
                found[(driver, pool, device)] = (
                    reason if isinstance(reason, str) else "",
                    since if isinstance(since, str) else "",
                )
    return found


class Refusals:
    """The devices cooling down after a refused enrollment, remembered in the process."""

    def __init__(self) -> None:
        self._refusals: dict[DeviceKey, Refusal] = {}
        self._seen: dict[str, dict[DeviceKey, Failure]] = {}
        """Claim uid -> the failures it showed last, so a repeated event is not new."""
        self._adopted = False

    def __len__(self) -> int:
        return len(self._refusals)

    def observe(self, claim: Mapping[str, Any], now: datetime, *, deleted: bool = False) -> bool:
        """A claim as watched: start a cool-down for each device that newly shows
        EnrollmentFailed True. Whether one started."""
        uid = bodies.uid(claim)
        if not uid:
            return False
        failures = {} if deleted else failed_devices(claim)
        before = self._seen.pop(uid, {})
        if failures:
            self._seen[uid] = failures
            while len(self._seen) > MAX_REMEMBERED:
                del self._seen[next(iter(self._seen))]
        started = False
        for key, failure in failures.items():
            if before.get(key) == failure:
                continue
            self._refusals[key] = Refusal(refused_value(failure[0]), now)
            started = True
        return started

    def adopt(self, driver: str, slices: Iterable[Mapping[str, Any]], now: datetime) -> None:
        """Refused taints published but not remembered (the operator restarted, or
        another replica led): cool down from their `timeAdded`. Done on the first call
        only: from then on this process writes every such taint itself, and reading
        every published device each pass would undo the publisher's skipping of
        unchanged pools."""
        if self._adopted:
            return
        self._adopted = True
        for obj in slices:
            pool = bodies.pool_name(obj)
            if bodies.driver(obj) != driver or not pool:
                continue
            for device in bodies.devices(obj):
                name = device.get("name")
                if not isinstance(name, str):
                    continue
                for taint in device_taints(device):
                    if taint.get("key") != REFUSED_TAINT_KEY:
                        continue
                    key = (driver, pool, name)
                    if key in self._refusals:
                        continue
                    added = taint.get("timeAdded")
                    since = parse_time(added) if isinstance(added, str) else None
                    value = taint.get("value")
                    self._refusals[key] = Refusal(
                        value if isinstance(value, str) and value else REFUSED_DEFAULT_VALUE,
                        since or now,
                    )

    def active(self, driver: str, cooldown: timedelta, now: datetime) -> dict[str, DeviceTaints]:
        """Pool -> (device, value) of `driver`'s devices still cooling down at `now`;
        the ended cool-downs are forgotten (another driver's after the longest one)."""
        ended = [
            key
            for key, refusal in self._refusals.items()
            if now - refusal.since >= (cooldown if key[0] == driver else LONGEST_COOLDOWN)
        ]
        for key in ended:
            del self._refusals[key]
        found: dict[str, list[tuple[str, str]]] = {}
        for (owner, pool, device), refusal in sorted(self._refusals.items()):
            if owner == driver:
                found.setdefault(pool, []).append((device, refusal.value))
        return {pool: tuple(devices) for pool, devices in found.items()}

    def seconds_left(self, driver: str, cooldown: timedelta, now: datetime) -> float | None:
        """Seconds until the first of `driver`'s cool-downs ends; None without any."""
        ends = [
            (r.since + cooldown - now).total_seconds()
            for (owner, _, _), r in self._refusals.items()
            if owner == driver
        ]
        return max(min(ends), 0.0) if ends else None

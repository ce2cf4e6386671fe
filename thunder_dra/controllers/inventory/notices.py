"""Telling a waiting pod that the devices it asks for are tainted.

The scheduler allocates no device whose `NoSchedule` taint a claim does not tolerate
(`taints`), and says only "cannot allocate all claims" in the pod's events. So after a
pass, for each claim still waiting for an allocation that asks for a DeviceClass of this
driver (by the classes' name prefix) whose model has tainted devices, the operator
records a Warning event `ThunderDevicesTainted` on the claim, and on its pod when a pod
controls it (a claim made from the pod's template): which zones' devices of that model
carry `thundercompute.com/unbacked`, and why. `kubectl describe pod` then names the
taint beside the scheduler's message.

Nothing is read for this: the pass already listed the claims (`objects.PendingClaim`)
and holds the slices. The event recorder writes a repeated event once a minute at most,
so a claim waiting through a long outage costs one small write a minute.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from thunder_dra.controllers.inventory.taints import TAINT_KEY, own_reason
from thunder_dra.controllers.shared.objects import PendingClaim
from thunder_dra.kube import bodies, naming
from thunder_dra.kube.events import EventRecorder, ObjectRef

REASON: Final = "ThunderDevicesTainted"
MAX_NOTICES: Final = 100
"""Events one pass records at most (claims and their pods together)."""


@dataclass(frozen=True, slots=True)
class Notice:
    obj: ObjectRef
    message: str


def _string_attribute(device: Mapping[str, Any], name: str) -> str:
    attributes = device.get("attributes")
    value = attributes.get(name) if isinstance(attributes, Mapping) else None
    text = value.get("string") if isinstance(value, Mapping) else None
    return text if isinstance(text, str) else ""


def tainted_classes(
    slices: Iterable[Mapping[str, Any]], driver_name: str, class_prefix: str
) -> dict[str, dict[str, set[str]]]:
    """DeviceClass name -> zone -> the reasons its devices there are tainted for."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for obj in slices:
        if bodies.driver(obj) != driver_name:
            continue
        for device in bodies.devices(obj):
            reason = own_reason(device)
            label = _string_attribute(device, naming.ATTRIBUTE_GPU_TYPE_LABEL)
            if reason and label:
                zone = _string_attribute(device, naming.ATTRIBUTE_ZONE) or bodies.slice_zone(obj)
                found[class_prefix + label][zone].add(reason)
    return {name: dict(zones) for name, zones in found.items()}


def _describe(device_class: str, tainted: Mapping[str, set[str]]) -> str:
    zones = [f"{zone or '?'} ({', '.join(sorted(reasons))})" for zone, reasons in tainted.items()]
    return f"{device_class} in {', '.join(sorted(zones))}"


def notices(
    pending: Iterable[PendingClaim], tainted: Mapping[str, Mapping[str, set[str]]]
) -> list[Notice]:
    """The events to record: one per waiting claim asking for a tainted class, and one on
    the pod that controls it."""
    out: list[Notice] = []
    for claim in pending:
        asked = sorted(c for c in claim.classes if c in tainted)
        if not asked:
            continue
        where = "; ".join(_describe(c, tainted[c]) for c in asked)
        message = (
            f"Thunder does not back the devices of {where} now: they carry the taint "
            f"{TAINT_KEY}:NoSchedule, so the scheduler allocates none of them to claim "
            f"{claim.namespace}/{claim.name} until Thunder backs them again "
            f"(docs/when-thunder-fails.md)"
        )
        out.append(
            Notice(
                ObjectRef("resource.k8s.io/v1", "ResourceClaim", claim.name, claim.uid,
                          claim.namespace),
                message,
            )
        )  # fmt: skip
        if claim.pod is not None:
            pod_name, pod_uid = claim.pod
            out.append(Notice(ObjectRef("v1", "Pod", pod_name, pod_uid, claim.namespace), message))
        if len(out) >= MAX_NOTICES:
            break
    return out[:MAX_NOTICES]


async def post_notices(events: EventRecorder, found: Iterable[Notice]) -> None:
    for notice in found:
        await events.post(notice.obj, "Warning", REASON, notice.message)

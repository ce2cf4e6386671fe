"""Enrollment before binding: the names the operator and the daemon share.

With ``spec.operator.enrollBeforeBinding.enabled`` the operator publishes every device with
``bindsToNode: true`` and the two conditions below; the scheduler then waits in PreBind
until the daemon of the chosen node has enrolled the claim with Thunder and set
:data:`ENROLLED` True in the claim's ``status.devices``, or gives up when it sets
:data:`ENROLLMENT_FAILED` True (and schedules the pod again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

ENROLLED: Final = "thundercompute.com/Enrolled"
"""The binding condition: the claim's Thunder client is enrolled on the chosen node."""
ENROLLMENT_FAILED: Final = "thundercompute.com/EnrollmentFailed"
"""The binding failure condition: enrolling the claim failed (Thunder refused, or another
step); its reason and message say why."""


def driver_results(claim: Mapping[str, Any], driver: str) -> list[Mapping[str, Any]]:
    """The claim's allocation results of ``driver``; none where the claim's status is not
    shaped as the API server writes it."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    return [
        r
        for r in (results if isinstance(results, list | tuple) else ())
        if isinstance(r, Mapping) and r.get("driver") == driver
    ]


def enrollment_results(claim: Mapping[str, Any], driver: str) -> list[Mapping[str, Any]]:
    """The claim's allocation results of ``driver`` whose binding conditions ask for
    :data:`ENROLLED`."""
    return [
        r
        for r in driver_results(claim, driver)
        if isinstance(r.get("bindingConditions"), list | tuple)
        and ENROLLED in r["bindingConditions"]
    ]

"""Enrollment before binding: the names the operator and the daemon share.

With ``spec.operator.enrollBeforeBinding.enabled`` the operator publishes every device with
``bindsToNode: true`` and the two conditions below; the scheduler then waits in PreBind
until the daemon of the chosen node has enrolled the claim with Thunder and set
:data:`ENROLLED` True in the claim's ``status.devices``, or gives up when it sets
:data:`ENROLLMENT_FAILED` True (and schedules the pod again).
"""

from __future__ import annotations

from typing import Final

ENROLLED: Final = "thundercompute.com/Enrolled"
"""The binding condition: the claim's Thunder client is enrolled on the chosen node."""
ENROLLMENT_FAILED: Final = "thundercompute.com/EnrollmentFailed"
"""The binding failure condition: enrolling the claim failed (Thunder refused, or another
step); its reason and message say why."""

"""What this API server keeps of the optional fields the operator writes, learnt once
per process (`ServerSupport`).

`extendedResourceName` on DeviceClasses (DRAExtendedResource): from existing classes that
carry the field, else from a server-side dry run, else from reading back the first class
written. Once the API server is seen to drop it, classes are planned without it.
Device taints (DRADeviceTaints) are learnt the same way (a listed slice with a taint,
else a dry run of a tainted slice, else the first tainted slice written back); once
dropped, no taint is planned. Binding conditions (DRADeviceBindingConditions, asked for
by enrollment before binding) are learnt the same way; once dropped, devices are
published without them. Each drop is said once, in a Warning event and a log line.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from thunder_dra.controllers.inventory.binding import binding_fields, has_binding_conditions
from thunder_dra.controllers.inventory.classes import selector_expression
from thunder_dra.controllers.inventory.publish import PublishOutcome
from thunder_dra.controllers.inventory.slices import InventoryConfig
from thunder_dra.controllers.inventory.taints import TaintReason, has_taints, taint_body
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.kube import bodies, naming
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.kube.events import EventRecorder, ObjectRef
from thunder_dra.kube.resources import DEVICE_CLASSES, RESOURCE_SLICES

_log = logging.getLogger(__name__)

PROBE_CLASS_NAME: Final = "thunder-extended-resource-check"
PROBE_SLICE_NAME: Final = "thunder-device-taint-check"
PROBE_BINDING_SLICE_NAME: Final = "thunder-device-binding-check"


class ServerSupport:
    """Whether the API server keeps `extendedResourceName`, device taints and binding
    conditions: None until learnt, then kept for the process."""

    def __init__(self, kube: KubeClient, events: EventRecorder, metrics: OperatorMetrics) -> None:
        self._kube = kube
        self._events = events
        self._metrics = metrics
        self.extended_resource_supported: bool | None = None
        self.taints_supported: bool | None = None
        """Whether the API server keeps device taints; learnt once per process."""
        self._taints_report_due = False
        self.binding_supported: bool | None = None
        """Whether the API server keeps binding conditions; learnt once per process."""
        self._binding_report_due = False

    @property
    def taints(self) -> bool:
        """Whether taints are planned: not seen dropped."""
        return self.taints_supported is not False

    async def learn_taints(self, slices: Sequence[Mapping[str, Any]], driver_name: str) -> None:
        """Whether the API server keeps device taints, learnt once per process: from a
        listed slice that holds one, else from a server-side dry run (no write), else from
        the first slice written with one (`check_taints_kept`)."""
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
            self._taints_unsupported()

    def _taints_unsupported(self) -> None:
        self.taints_supported = False
        self._taints_report_due = True

    async def check_taints_kept(self, outcome: PublishOutcome, ref: ObjectRef) -> None:
        """Once per process: the API server dropped the taints written (DRADeviceTaints
        off, as on 1.34 and 1.35). From then on no taint is published or compared."""
        if outcome.taints_dropped and self.taints:
            self._taints_unsupported()
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

    async def learn_binding(self, slices: Sequence[Mapping[str, Any]], driver_name: str) -> None:
        """Whether the API server keeps bindsToNode and binding conditions, learnt once per
        process like taint support (`learn_taints`)."""
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

    async def check_binding_kept(self, outcome: PublishOutcome, ref: ObjectRef) -> None:
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

    async def extended_resource(
        self, config: InventoryConfig, classes: Sequence[Mapping[str, Any]]
    ) -> bool:
        """Whether classes are planned with `extendedResourceName` this pass."""
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

    async def check_extended_resource_kept(
        self, outcome: PublishOutcome, supported: bool, ref: ObjectRef
    ) -> None:
        """The API server dropped the `extendedResourceName` of classes written with it
        (DRAExtendedResource off): from then on classes are planned without it."""
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

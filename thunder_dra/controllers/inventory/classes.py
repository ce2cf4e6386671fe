"""One DeviceClass per GPU model published anywhere (README.md#gpu-types).

The class `<prefix><type label>` (thunder-gpu-a6000) selects this driver's devices
whose `thundercompute.com/gpu_type_label` attribute is the model's DNS label, the
same label slices.py puts on every device of the model. Matching the label rather
than Thunder's spelling keeps CEL free of case folding, works for spellings longer
than an attribute may hold, and makes a class match exactly the pools that share
its name. With a non-empty prefix the class also names the extended resource
`<prefix><type label>` (thundercompute.com/gpu-a6000).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from thunder_dra.controllers.inventory.slices import (
    RESOURCE_API_VERSION,
    DesiredPool,
    InventoryConfig,
)
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.kube import bodies, naming

DEVICE_CLASS_KIND: Final = "DeviceClass"


def selector_expression(driver_name: str, type_label: str) -> str:
    """The CEL selector matching the devices of one model of one driver.

    The scheduler evaluates it on every free device of every pool a node sees. The
    order of the two tests was measured (docs/benchmarks.md, "Scheduler"): the model
    test first gives the same result and no measurable gain, so it stays as it is.
    """
    # json.dumps gives a double-quoted literal with CEL-compatible escapes.
    return (
        f"device.driver == {json.dumps(driver_name)} && "
        f"device.attributes[{json.dumps(naming.ATTRIBUTE_DOMAIN)}].gpu_type_label == "
        f"{json.dumps(type_label)}"
    )


@dataclass(frozen=True, slots=True)
class DesiredDeviceClass:
    name: str
    type_label: str
    model: str
    driver_name: str
    extended_resource_name: str | None
    owner: ThunderClusterRef | None

    @property
    def selector(self) -> str:
        return selector_expression(self.driver_name, self.type_label)

    @property
    def labels(self) -> dict[str, str]:
        return {
            **naming.component_labels(naming.COMPONENT_DEVICE_CLASS),
            naming.LABEL_GPU_TYPE: self.type_label,
        }

    @property
    def annotations(self) -> dict[str, str]:
        return {naming.ANNOTATION_GPU_TYPE: self.model}

    def manifest(self, *, with_extended_resource: bool = True) -> dict[str, Any]:
        """The resource.k8s.io/v1 DeviceClass body.

        `with_extended_resource=False` leaves out extendedResourceName, for API servers
        that drop it (DRAExtendedResource off on 1.34/1.35).
        """
        metadata: dict[str, Any] = {
            "name": self.name,
            "labels": self.labels,
            "annotations": self.annotations,
        }
        if self.owner is not None:
            metadata["ownerReferences"] = [self.owner.owner_reference()]
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": self.selector}}]}
        if self.extended_resource_name is not None and with_extended_resource:
            spec["extendedResourceName"] = self.extended_resource_name
        return {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": DEVICE_CLASS_KIND,
            "metadata": metadata,
            "spec": spec,
        }


def build_device_classes(
    pools: Iterable[DesiredPool], config: InventoryConfig
) -> tuple[DesiredDeviceClass, ...]:
    """One class per model label among `pools`, sorted by name.

    Zones may spell a model differently ("A6000", "a6000"); the class records the
    smallest spelling, so the choice is stable.
    """
    models: dict[str, str] = {}
    for pool in pools:
        known = models.get(pool.type_label)
        models[pool.type_label] = pool.model if known is None else min(known, pool.model)
    return tuple(
        DesiredDeviceClass(
            name=naming.device_class_name(config.device_class_prefix, label),
            type_label=label,
            model=model,
            driver_name=config.driver_name,
            extended_resource_name=naming.extended_resource_name(
                config.extended_resource_prefix, label
            ),
            owner=config.owner,
        )
        for label, model in sorted(models.items())
    )


def is_thunder_device_class(obj: Mapping[str, Any]) -> bool:
    """Whether an API object is a DeviceClass this operator publishes (by its labels)."""
    labels = bodies.labels(obj)
    return (
        labels.get(naming.LABEL_APP_NAME) == naming.APP_NAME
        and labels.get(naming.LABEL_COMPONENT) == naming.COMPONENT_DEVICE_CLASS
    )


def extended_resource_name_dropped(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """Whether the API server silently dropped extendedResourceName from a written class.

    An API server without the DRAExtendedResource gate accepts the field and discards
    it (platform-notes 5); reading the stored object back is the only way to know.
    """
    wanted = bodies.spec(sent).get("extendedResourceName")
    return bool(wanted) and not bodies.spec(stored).get("extendedResourceName")

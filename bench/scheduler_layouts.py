"""The objects the scheduler benchmark publishes: nodes, ResourceSlices, DeviceClasses, pods.

Zone pools come from the operator's own builders (`build_pools`, `build_device_classes`
and their `manifest` methods), so they have exactly the shape the operator publishes.
The node-local layout takes the same manifests and deals each zone pool's devices out
to the zone's nodes: one slice per node and model, `nodeName` instead of the node
selector, pool `<node>/<type>`; same device names, attributes and classes.

`DriverChoices` are the knobs of the driver's own output that the allocator's cost
depends on (device attributes, the class selector, slice size, the slices' node
selector); the defaults are what the operator publishes today. Every choice is applied
the same way to both layouts, so a comparison always has the same devices.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final

from thunder_dra.controllers.inventory.capacity import PoolCapacity, TargetSource
from thunder_dra.controllers.inventory.classes import DesiredDeviceClass, build_device_classes
from thunder_dra.controllers.inventory.slices import DesiredPool, InventoryConfig, build_pools
from thunder_dra.kube import naming

MODELS: Final = ("A6000", "H100", "L4", "A100", "RTX4090", "B200", "L40S", "H200")
GATE: Final = "bench.thundercompute.com/hold"
IMAGE: Final = "registry.invalid/bench/pause:1"

ATTRIBUTE_SETS: Final = ("operator", "seed")
"""operator: gpu_type, gpu_type_label, zone (today). seed: only the seed's gpu_type and
zone, the class selector then matching gpu_type (names the model exactly as Thunder
spells it: only possible while every spelling fits an attribute and zones agree on it)."""

SELECTORS: Final = ("operator", "attribute-first", "driver-first", "attribute-only")
"""operator: the operator's own selector (deviceclasses.selector_expression:
driver == X && attribute == Y). attribute-first: attribute == Y && driver == X (same
result as driver first: CEL's && is false if either side is false, even if the other
side is an error, such as a missing attribute on another driver's device; a device of
another model fails on the first test; measured no faster). driver-first: driver == X
&& attribute == Y, spelled out (today the operator's). attribute-only: the
attribute test alone (measured only: it would match another driver's device that
carries thundercompute.com attributes)."""

NODE_SELECTORS: Final = ("operator", "zone-only")
"""operator: the zone and the daemon's node selector (kubernetes.io/os=linux).
zone-only: the zone alone (measured only; the product keeps the daemon's selector)."""


@dataclass(frozen=True)
class DriverChoices:
    attributes: str = "operator"
    selector: str = "operator"
    slice_size: int = 128
    node_selector: str = "operator"

    def describe(self) -> str:
        parts = [
            f"attributes={self.attributes}",
            f"selector={self.selector}",
            f"slice_size={self.slice_size}",
            f"node_selector={self.node_selector}",
        ]
        return ", ".join(parts)


@dataclass(frozen=True)
class Shape:
    nodes: int
    zones: int
    models: int
    gpus: int
    """GPUs (devices) per zone and model."""

    def zone_name(self, z: int) -> str:
        return f"bench-zone-{z:02d}"

    def node_name(self, n: int) -> str:
        return f"bench-node-{n:04d}"

    def zone_of_node(self, n: int) -> int:
        return n % self.zones

    def nodes_of_zone(self, z: int) -> list[str]:
        return [self.node_name(n) for n in range(self.nodes) if self.zone_of_node(n) == z]

    def model(self, m: int) -> str:
        return MODELS[m]


@dataclass
class Inventory:
    """Everything published for one layout."""

    layout: str
    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    class_names: list[str] = field(default_factory=list)
    extended_resources: list[str] = field(default_factory=list)

    @property
    def devices(self) -> int:
        return sum(len(s["spec"]["devices"]) for s in self.slices)


def capacities(shape: Shape) -> list[PoolCapacity]:
    return [
        PoolCapacity(
            zone_name=shape.zone_name(z),
            model=shape.model(m),
            physical=shape.gpus,
            target=Decimal(1),
            target_source=TargetSource.MODEL,
            live_client_gpus=0,
            published=shape.gpus,
            zone_ids=(f"zone-{z:05d}",),
        )
        for z in range(shape.zones)
        for m in range(shape.models)
    ]


def operator_objects(
    shape: Shape, choices: DriverChoices
) -> tuple[list[DesiredPool], list[DesiredDeviceClass]]:
    config = replace(InventoryConfig(), max_devices_per_slice=choices.slice_size)
    layout = build_pools(capacities(shape), config)
    if layout.skipped:
        raise ValueError(f"pools skipped: {layout.skipped}")
    return list(layout.pools), list(build_device_classes(layout.pools, config))


def _apply_device_choices(device: dict[str, Any], choices: DriverChoices) -> dict[str, Any]:
    if choices.attributes == "seed":
        device = copy.deepcopy(device)
        device["attributes"].pop(naming.ATTRIBUTE_GPU_TYPE_LABEL, None)
    return device


def _apply_slice_choices(manifest: dict[str, Any], choices: DriverChoices) -> dict[str, Any]:
    spec = manifest["spec"]
    spec["devices"] = [_apply_device_choices(d, choices) for d in spec["devices"]]
    if choices.node_selector == "zone-only" and "nodeSelector" in spec:
        for term in spec["nodeSelector"]["nodeSelectorTerms"]:
            term["matchExpressions"] = [
                e for e in term["matchExpressions"] if e["key"] == naming.NODE_LABEL_ZONE
            ]
    return manifest


def _class_manifest(
    desired: DesiredDeviceClass, model: str, choices: DriverChoices
) -> dict[str, Any]:
    manifest = desired.manifest()
    domain = json.dumps(naming.ATTRIBUTE_DOMAIN)
    if choices.attributes == "seed":
        test = f"device.attributes[{domain}].gpu_type == {json.dumps(model)}"
    else:
        test = f"device.attributes[{domain}].gpu_type_label == {json.dumps(desired.type_label)}"
    driver = f"device.driver == {json.dumps(desired.driver_name)}"
    if choices.selector == "operator" and choices.attributes == "operator":
        expression = desired.selector
    elif choices.selector == "driver-first":
        expression = f"{driver} && {test}"
    elif choices.selector in ("operator", "attribute-first"):
        expression = f"{test} && {driver}"
    else:
        expression = test
    manifest["spec"]["selectors"] = [{"cel": {"expression": expression}}]
    return manifest


def zone_inventory(shape: Shape, choices: DriverChoices) -> Inventory:
    pools, classes = operator_objects(shape, choices)
    slices = [_apply_slice_choices(m, choices) for pool in pools for m in pool.manifests(1)]
    return _with_classes(Inventory("zone pools", slices, []), classes, choices)


def node_local_inventory(shape: Shape, choices: DriverChoices) -> Inventory:
    pools, classes = operator_objects(shape, choices)
    zone_index = {shape.zone_name(z): z for z in range(shape.zones)}
    slices: list[dict[str, Any]] = []
    for pool in pools:
        nodes = shape.nodes_of_zone(zone_index[pool.zone_name])
        template = pool.manifest(pool.slices[0], 1)
        for node, devices in zip(nodes, deal(pool.devices, len(nodes)), strict=True):
            if not devices:
                continue
            manifest = copy.deepcopy(template)
            manifest["metadata"]["name"] = f"thunder-{node}-{pool.type_label}"
            spec = manifest["spec"]
            spec.pop("nodeSelector")
            spec["nodeName"] = node
            spec["pool"] = {
                "name": f"{node}/{pool.type_label}",
                "generation": 1,
                "resourceSliceCount": 1,
            }
            spec["devices"] = [pool._device(name, None, {}) for name in devices]
            slices.append(_apply_slice_choices(manifest, choices))
    return _with_classes(Inventory("node-local", slices, []), classes, choices)


def _with_classes(
    inventory: Inventory, classes: list[DesiredDeviceClass], choices: DriverChoices
) -> Inventory:
    for desired in classes:
        inventory.classes.append(_class_manifest(desired, desired.model, choices))
        inventory.class_names.append(desired.name)
        inventory.extended_resources.append(desired.extended_resource_name or "")
    return inventory


def deal(devices: tuple[str, ...], hands: int) -> Iterator[tuple[str, ...]]:
    """Consecutive runs of `devices` for `hands` nodes, sizes differing by at most one."""
    base, extra = divmod(len(devices), hands)
    start = 0
    for hand in range(hands):
        size = base + (1 if hand < extra else 0)
        yield devices[start : start + size]
        start += size


def claim_manifest(name: str, namespace: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 1}}
                ]
            }
        },
    }


def pod_manifest(
    name: str,
    namespace: str,
    *,
    claim: str | None = None,
    extended_resource: str | None = None,
    zone: str | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    spec: dict[str, Any] = {
        "schedulingGates": [{"name": GATE}],
        "containers": [container],
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
    }
    if claim is not None:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    if extended_resource is not None:
        container["resources"] = {
            "requests": {extended_resource: "1"},
            "limits": {extended_resource: "1"},
        }
    if zone is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": naming.NODE_LABEL_ZONE, "operator": "In", "values": [zone]}
                            ]
                        }
                    ]
                }
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }

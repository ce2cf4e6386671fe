"""Reading the published objects and the claims, in a shape that stays small.

A cluster publishing 500 zones x 4 models x 64 GPUs holds 128,000 devices in 2,000
ResourceSlices. As nested dicts they would take a few hundred MiB; the operator's
budget is 200 MiB in all. So each listed slice keeps its metadata and the small spec
fields as they are, and its device list as compressed JSON that is decoded only while
the planner compares it (`LeanSliceSpec` is a read-only mapping, so the planning code
sees an ordinary object). ResourceClaims are reduced to what the operator needs: the
devices allocated from this driver's pools, and the UIDs of claims by name.
"""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from thunder_dra.kube import naming
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES

INVENTORY_SELECTOR = naming.label_selector(
    naming.component_labels(naming.COMPONENT_RESOURCE_INVENTORY)
)
DEVICE_CLASS_SELECTOR = naming.label_selector(
    naming.component_labels(naming.COMPONENT_DEVICE_CLASS)
)


class LeanSliceSpec(Mapping[str, Any]):
    """A ResourceSlice spec whose `devices` are held compressed until read."""

    __slots__ = ("_devices", "_fields")

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self._fields = {key: value for key, value in spec.items() if key != "devices"}
        devices = spec.get("devices")
        self._devices: bytes | None = (
            None
            if devices is None
            else zlib.compress(json.dumps(devices, separators=(",", ":")).encode(), 1)
        )

    def __getitem__(self, key: str) -> Any:
        if key == "devices":
            if self._devices is None:
                raise KeyError(key)
            return json.loads(zlib.decompress(self._devices))
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._fields
        if self._devices is not None:
            yield "devices"

    def __len__(self) -> int:
        return len(self._fields) + (self._devices is not None)

    @property
    def stored_bytes(self) -> int:
        return len(self._devices or b"")


def _without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": metadata}


def lean_slice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A listed ResourceSlice with managedFields dropped and devices compressed."""
    lean = _without_managed_fields(obj)
    lean["spec"] = LeanSliceSpec(obj.get("spec") or {})
    return lean


async def list_inventory_slices(kube: KubeClient) -> list[dict[str, Any]]:
    """The ResourceSlices this operator publishes (by label), lean."""
    slices: list[dict[str, Any]] = []
    async for page in kube.list_pages(
        RESOURCE_SLICES.collection(), label_selector=INVENTORY_SELECTOR
    ):
        slices.extend(lean_slice(obj) for obj in page)
    return slices


async def list_device_classes(kube: KubeClient) -> list[dict[str, Any]]:
    """The DeviceClasses this operator publishes (by label)."""
    classes: list[dict[str, Any]] = []
    async for page in kube.list_pages(
        DEVICE_CLASSES.collection(), label_selector=DEVICE_CLASS_SELECTOR
    ):
        classes.extend(_without_managed_fields(obj) for obj in page)
    return classes


@dataclass(slots=True)
class ClaimIndex:
    """What the operator needs to know about every ResourceClaim."""

    uids: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) -> uid of every claim."""
    allocated: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Pool name -> device names allocated from it to claims, for one driver."""

    def allocated_devices(self) -> dict[str, frozenset[str]]:
        return {pool: frozenset(devices) for pool, devices in self.allocated.items()}


def index_claim(index: ClaimIndex, obj: Mapping[str, Any], driver_name: str) -> None:
    metadata = obj.get("metadata") or {}
    namespace, name, uid = metadata.get("namespace"), metadata.get("name"), metadata.get("uid")
    if isinstance(namespace, str) and isinstance(name, str) and isinstance(uid, str):
        index.uids[(namespace, name)] = uid
    allocation = (obj.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or ():
        if result.get("driver") != driver_name:
            continue
        pool, device = result.get("pool"), result.get("device")
        if isinstance(pool, str) and isinstance(device, str):
            index.allocated[pool].add(device)


async def list_claims(kube: KubeClient, driver_name: str) -> ClaimIndex:
    """Every ResourceClaim in the cluster, reduced to UIDs and this driver's allocations."""
    index = ClaimIndex()
    async for page in kube.list_pages(RESOURCE_CLAIMS.collection()):
        for obj in page:
            index_claim(index, obj, driver_name)
    return index

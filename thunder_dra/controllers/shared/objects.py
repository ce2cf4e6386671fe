"""Reading the published objects and the claims, in a shape that stays small.

A cluster publishing 500 zones x 4 models x 64 GPUs holds 128,000 devices in 2,000
ResourceSlices. As nested dicts they would take a few hundred MiB; the operator's
budget is 200 MiB in all. So each listed slice keeps its metadata and the small spec
fields as they are, and its device list as compressed JSON that is decoded only while
the planner compares it (`LeanSliceSpec` is a read-only mapping, so the planning code
sees an ordinary object), plus the device names, which every pass reads.

The slices are not listed whole every pass: `SliceCache` keeps each slice's lean spec
by its resourceVersion, and a pass lists only the slices' metadata (a
PartialObjectMetadataList, a small fraction of the bytes). A slice whose
resourceVersion the cache holds is the very object the cache saw, since any change
gives it a new one; a slice changed or created by anyone else is read again, one
deleted is absent from the list. So a pass still plans against what the API server
holds, not against what it remembers writing. The cache is filled by a whole list
when it is empty or too much changed, and by the answers to the operator's writes.

ResourceClaims are reduced to what the operator needs: the devices allocated from this
driver's pools, the UIDs of claims by name, and the claims still waiting for an
allocation (`PendingClaim`: the DeviceClasses they ask for and the pod that owns them),
at most `MAX_PENDING` of them, so that a pass can tell their pods why tainted devices
are not allocated to them (`inventory.notices`).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from thunder_dra.kube import bodies, naming
from thunder_dra.kube.client import METADATA_ONLY, KubeClient
from thunder_dra.kube.errors import Gone, NotFound
from thunder_dra.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES

INVENTORY_SELECTOR = naming.label_selector(
    naming.component_labels(naming.COMPONENT_RESOURCE_INVENTORY)
)
DEVICE_CLASS_SELECTOR = naming.label_selector(
    naming.component_labels(naming.COMPONENT_DEVICE_CLASS)
)


REFETCH_LIMIT: Final = 64
"""Changed slices read one by one; more than this and the whole collection is listed."""
REFETCH_CONCURRENCY: Final = 8
SLICE_API_VERSION: Final = "resource.k8s.io/v1"


class LeanSliceSpec(Mapping[str, Any]):
    """A ResourceSlice spec whose `devices` are held compressed until read."""

    __slots__ = ("_devices", "_fields", "_names")

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self._fields = {key: value for key, value in spec.items() if key != "devices"}
        devices = spec.get("devices")
        self._devices: bytes | None = (
            None
            if devices is None
            else zlib.compress(json.dumps(devices, separators=(",", ":")).encode(), 1)
        )
        # Device names are DNS labels: joined by a newline, they are one small string.
        self._names = "\n".join(
            name
            for device in (devices if isinstance(devices, list) else ())
            if isinstance(device, Mapping)
            for name in (device.get("name"),)
            if isinstance(name, str) and "\n" not in name
        )

    @property
    def device_names(self) -> list[str]:
        """The `name` of every device that has a string one, without decoding the rest."""
        return self._names.split("\n") if self._names else []

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
    metadata = {k: v for k, v in bodies.metadata(obj).items() if k != "managedFields"}
    return {**obj, "metadata": metadata}


def lean_slice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A listed ResourceSlice with managedFields dropped and devices compressed."""
    lean = _without_managed_fields(obj)
    lean["spec"] = LeanSliceSpec(bodies.spec(obj))
    return lean


async def list_inventory_slices(kube: KubeClient) -> list[dict[str, Any]]:
    """The ResourceSlices this operator publishes (by label), lean."""
    for attempt in (1, 2):
        slices: list[dict[str, Any]] = []
        try:
            async for page in kube.list_pages(
                RESOURCE_SLICES.collection(), label_selector=INVENTORY_SELECTOR
            ):
                slices.extend(lean_slice(obj) for obj in page)
        except Gone:
            if attempt == 2:
                raise
            continue
        return slices
    raise AssertionError("unreachable")


def _name_and_version(obj: Mapping[str, Any]) -> tuple[str, str]:
    return bodies.name(obj), bodies.resource_version(obj) or ""


class SliceCache:
    """The lean specs of the operator's ResourceSlices, by name and resourceVersion."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[str, LeanSliceSpec]] = {}
        self.full_lists = 0
        """Whole lists made (for tests and figures)."""
        self.refetched = 0
        """Slices read one by one because their resourceVersion was not the cached one."""

    def __len__(self) -> int:
        return len(self._known)

    def remember(self, obj: Mapping[str, Any]) -> None:
        """Keep a slice as the API server stored it (a write's answer, a read)."""
        name, version = _name_and_version(obj)
        spec = bodies.spec(obj)
        if name and version and spec:
            self._known[name] = (version, _lean_spec(spec))

    def forget(self, name: str) -> None:
        self._known.pop(name, None)

    def clear(self) -> None:
        self._known.clear()

    async def slices(self, kube: KubeClient) -> list[dict[str, Any]]:
        """The published slices as `list_inventory_slices` gives them, from a metadata-only
        list and the cache; slices not in the cache at their listed version are read."""
        if not self._known:
            return await self._list_whole(kube)
        try:
            metadata = await _list_metadata(kube)
        except Gone:
            return await self._list_whole(kube)
        stale = [
            name
            for name, version in map(_name_and_version, metadata)
            if self._known.get(name, ("",))[0] != version or not version
        ]
        if len(stale) > REFETCH_LIMIT:
            return await self._list_whole(kube)
        fresh = await self._read(kube, stale)
        listed = {name for name, _ in map(_name_and_version, metadata)}
        for name in [name for name in self._known if name not in listed]:
            del self._known[name]
        slices = []
        for meta in metadata:
            name, version = _name_and_version(meta)
            if name in fresh:
                slices.append(fresh[name])
                continue
            known = self._known.get(name)
            if known is None or known[0] != version:
                continue  # deleted between the list and its read
            slices.append(
                {
                    "apiVersion": SLICE_API_VERSION,
                    "kind": "ResourceSlice",
                    "metadata": _without_managed_fields(meta)["metadata"],
                    "spec": known[1],
                }
            )
        return slices

    async def _list_whole(self, kube: KubeClient) -> list[dict[str, Any]]:
        self.full_lists += 1
        slices = await list_inventory_slices(kube)
        self._known = {}
        for obj in slices:
            name, version = _name_and_version(obj)
            if name and version and isinstance(obj["spec"], LeanSliceSpec):
                self._known[name] = (version, obj["spec"])
        return slices

    async def _read(self, kube: KubeClient, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        gate = asyncio.Semaphore(REFETCH_CONCURRENCY)
        found: dict[str, dict[str, Any]] = {}

        async def read(name: str) -> None:
            async with gate:
                try:
                    obj = await kube.get(RESOURCE_SLICES.item(name))
                except NotFound:
                    self._known.pop(name, None)
                    return
            lean = lean_slice(obj)
            found[name] = lean
            self.refetched += 1
            _, version = _name_and_version(obj)
            if version and isinstance(lean["spec"], LeanSliceSpec):
                self._known[name] = (version, lean["spec"])

        await asyncio.gather(*(read(name) for name in names))
        return found


def _lean_spec(spec: Mapping[str, Any]) -> LeanSliceSpec:
    return spec if isinstance(spec, LeanSliceSpec) else LeanSliceSpec(spec)


async def _list_metadata(kube: KubeClient) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    async for page in kube.list_pages(
        RESOURCE_SLICES.collection(),
        label_selector=INVENTORY_SELECTOR,
        accept=METADATA_ONLY,
        limit=500,
    ):
        items.extend(page)
    return items


async def list_device_classes(kube: KubeClient) -> list[dict[str, Any]]:
    """The DeviceClasses this operator publishes (by label)."""
    classes: list[dict[str, Any]] = []
    async for page in kube.list_pages(
        DEVICE_CLASSES.collection(), label_selector=DEVICE_CLASS_SELECTOR
    ):
        classes.extend(_without_managed_fields(obj) for obj in page)
    return classes


MAX_PENDING: Final = 500
"""Unallocated claims a pass keeps (namespace and name order of the listing beyond it
is the API server's); a cluster with more waiting claims has bigger problems to tell."""
MAX_CLASSES_PER_CLAIM: Final = 32
"""DeviceClass names kept per claim: the API's limit of requests times subrequests is far
above what a Thunder claim asks, and the rest would only be read to be dropped."""


@dataclass(frozen=True, slots=True)
class PendingClaim:
    """A ResourceClaim with no allocation yet, as far as the notices need it."""

    namespace: str
    name: str
    uid: str
    classes: frozenset[str]
    """The DeviceClasses its requests ask for (exactly, and each firstAvailable entry)."""
    pod: tuple[str, str] | None = None
    """(name, uid) of the pod that controls it (a claim made from a pod's template)."""


def requested_classes(obj: object) -> frozenset[str]:
    found: set[str] = set()
    for request in bodies.claim_requests(obj):
        exactly = request.get("exactly")
        names = [exactly.get("deviceClassName")] if isinstance(exactly, Mapping) else []
        first = request.get("firstAvailable")
        if isinstance(first, list):
            names += [s.get("deviceClassName") for s in first if isinstance(s, Mapping)]
        found.update(n for n in names if isinstance(n, str) and n)
        if len(found) >= MAX_CLASSES_PER_CLAIM:
            break
    return frozenset(sorted(found)[:MAX_CLASSES_PER_CLAIM])


def _controlling_pod(obj: object) -> tuple[str, str] | None:
    for ref in bodies.owner_references(obj):
        if ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1" and ref.get("controller"):
            name, uid = ref.get("name"), ref.get("uid")
            if isinstance(name, str) and name and isinstance(uid, str) and uid:
                return (name, uid)
    return None


@dataclass(slots=True)
class ClaimIndex:
    """What the operator needs to know about every ResourceClaim."""

    uids: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) -> uid of every claim."""
    allocated: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Pool name -> device names allocated from it to claims, for one driver."""
    pending: list[PendingClaim] = field(default_factory=list)
    """Claims not allocated yet and not being deleted, at most `MAX_PENDING`."""

    def allocated_devices(self) -> dict[str, frozenset[str]]:
        return {pool: frozenset(devices) for pool, devices in self.allocated.items()}


def index_claim(index: ClaimIndex, obj: Mapping[str, Any], driver_name: str) -> None:
    namespace, name, uid = bodies.namespace(obj), bodies.name(obj), bodies.uid(obj)
    if namespace and name and uid:
        index.uids[(namespace, name)] = uid
    for result in bodies.allocation_results(obj):
        if result.get("driver") != driver_name:
            continue
        pool, device = result.get("pool"), result.get("device")
        if isinstance(pool, str) and isinstance(device, str):
            index.allocated[pool].add(device)
    if bodies.allocation(obj) or bodies.metadata(obj).get("deletionTimestamp"):
        return
    if namespace and name and uid and len(index.pending) < MAX_PENDING:
        classes = requested_classes(obj)
        if classes:
            index.pending.append(PendingClaim(namespace, name, uid, classes, _controlling_pod(obj)))


async def list_claims(kube: KubeClient, driver_name: str) -> ClaimIndex:
    """Every ResourceClaim in the cluster, reduced to UIDs and this driver's allocations."""
    index = ClaimIndex()
    async for page in kube.list_pages(RESOURCE_CLAIMS.collection()):
        for obj in page:
            index_claim(index, obj, driver_name)
    return index

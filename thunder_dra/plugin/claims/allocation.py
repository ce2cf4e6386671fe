"""From a ResourceClaim's allocation to what Thunder needs: zone, GPU model (as Thunder
spells it) and count, plus who consumes the claim.

The allocation names devices by driver, pool and device only. Pools are named
``<zone label>/<type label>`` (normalised DNS labels), so Thunder's own spelling of the
zone and the model cannot be read back from the name (thunder-api.md 7.5). The daemon
reads it from the pool's ResourceSlices, as the operator publishes them
(``thunder_dra.controllers.inventory.slices``): the slice annotations
``thundercompute.com/thunder-zone`` and ``thundercompute.com/thunder-gpu-type`` carry the
exact spellings (the device attributes ``thundercompute.com/zone`` and
``thundercompute.com/gpu_type`` are the fallback). Slices are selected by driver and
model label, then by pool name and its newest generation; answers are cached briefly,
since a pool name keeps its meaning for as long as the pool exists.

A Thunder client is enrolled for one zone and one model, so a claim whose devices of this
driver come from two pools is refused with a clear error rather than half-served. So is
a claim allocated with admin access (``adminAccess``): a Thunder GPU has no
monitoring-only side, and a full client for it would make the zone serve more clients
than its pool publishes (the ``no-admin-access`` admission policy refuses such claims
earlier, where it is installed).

The zone's Thunder ID is resolved by display name (thunder-api.md 2.1: the smallest ID
among duplicates) and cached for a few seconds. Both lookups are single-flight:
concurrent claims that miss the cache share one request (one zone list for every zone
name, one slice list per pool), so a kubelet call with hundreds of claims lists zones
once, not once per claim.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from thunder_dra.kube import bodies, naming
from thunder_dra.kube.admissionpolicy import ADMIN_ACCESS_REASON, ADMIN_ACCESS_UNSUPPORTED
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.files.cdi import qualified_device_id
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import PreparedDevice
from thunder_dra.thunder import ThunderClient, ThunderError

ZONE_ID_TTL = 30.0
VIRT_LAUNCHER_LABEL = ("kubevirt.io", "virt-launcher")
VIRT_LAUNCHER_PREFIX = "virt-launcher-"
"""KubeVirt names every virt-launcher pod ``virt-launcher-<VMI name>-<suffix>`` (its
``generateName``): a pod named otherwise is never a VM's, and is not read to find out."""
VM_NAME_LABELS = ("vm.kubevirt.io/name", "kubevirt.io/domain")
# Keys a claim may pass in an opaque device config for this driver.
_OPAQUE_KEYS = frozenset({"apiVersion", "kind", "ldPreload"})


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class SingleFlight(Generic[_K, _V]):
    """Concurrent callers asking for the same key share one call and its outcome.

    The call runs as its own task, so a caller that is cancelled (a kubelet giving up)
    never cancels it for the others; the key is free again as soon as it finishes.
    """

    def __init__(self) -> None:
        self._inflight: dict[_K, asyncio.Task[_V]] = {}
        self.calls = 0  # calls actually made (for tests and the curious)

    async def run(self, key: _K, call: Callable[[], Awaitable[_V]]) -> _V:
        task = self._inflight.get(key)
        if task is None:

            async def invoke() -> _V:
                return await call()

            task = asyncio.create_task(invoke())
            self.calls += 1
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(task)

    def _done(self, key: _K, done: asyncio.Task[_V]) -> None:
        if self._inflight.get(key) is done:
            del self._inflight[key]
        if not done.cancelled():
            done.exception()  # retrieved here, whoever awaited it


@dataclass(frozen=True)
class ClaimAllocation:
    """What a ResourceClaim says about its devices of this driver, read at the edge."""

    uid: str
    pool: str
    devices: tuple[PreparedDevice, ...]  # without CDI IDs: see devices_for
    reserved_pods: tuple[str, ...]
    preload: bool = True

    def devices_for(self, *, vm: bool) -> tuple[PreparedDevice, ...]:
        """The kubelet's answer: a pod's devices carry the claim's CDI ID, a VM's none."""
        if vm:
            return self.devices
        cdi_ids = (qualified_device_id(self.uid),)
        return tuple(d.model_copy(update={"cdi_device_ids": cdi_ids}) for d in self.devices)


@dataclass(frozen=True)
class PoolIdentity:
    zone_name: str
    gpu_type: str  # exactly as Thunder spells it


def _base_request(name: str) -> str:
    # A prioritized-list allocation names "<request>/<subrequest>"; containers refer to
    # the request itself.
    return name.split("/", 1)[0]


def _device(result: Mapping[str, Any]) -> PreparedDevice:
    request = _base_request(str(result.get("request", "")))
    return PreparedDevice(
        pool_name=str(result["pool"]),
        device_name=str(result["device"]),
        request_names=(request,) if request else (),
    )


def _preload(config: list[Mapping[str, Any]], driver: str) -> bool:
    preload = True
    for entry in config:
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        parameters = opaque.get("parameters")
        if parameters is None:
            continue
        if not isinstance(parameters, dict):
            raise ClaimError(f"opaque parameters for {driver} must be an object")
        unknown = sorted(set(parameters) - _OPAQUE_KEYS)
        if unknown:
            raise ClaimError(
                f"unknown opaque parameter(s) {unknown} for {driver}; supported: ldPreload"
            )
        value = parameters.get("ldPreload", True)
        if not isinstance(value, bool):
            raise ClaimError("opaque parameter ldPreload must be true or false")
        preload = preload and value
    return preload


def parse_claim(claim: Mapping[str, Any], uid: str, driver: str) -> ClaimAllocation:
    """The part of a ResourceClaim this driver prepares; raises :class:`ClaimError`."""
    if bodies.uid(claim) != uid:
        raise ClaimError(
            f"has UID {bodies.uid(claim) or None}, the kubelet asked for {uid} "
            "(the claim was deleted and re-created)"
        )
    if not bodies.allocation(claim):
        raise ClaimError("not allocated (status.allocation is empty)")
    ours = [r for r in bodies.allocation_results(claim) if r.get("driver") == driver]
    if not ours:
        raise ClaimError(f"no device of driver {driver} is allocated")
    admin = sorted(
        {_base_request(str(r.get("request", ""))) for r in ours if r.get("adminAccess") is True}
    )
    if admin:
        raise ClaimError(
            f"{ADMIN_ACCESS_UNSUPPORTED} (request {', '.join(admin)} allocated with adminAccess): "
            f"{ADMIN_ACCESS_REASON}"
        )
    allocated = tuple(_device(r) for r in ours)
    pools = sorted({d.pool_name for d in allocated})
    if len(pools) != 1:
        raise ClaimError(
            f"devices come from {len(pools)} pools ({', '.join(pools)}); "
            "a Thunder client serves one zone and one GPU model, so request one model per claim",
            ErrorReason.POOL,
        )
    reserved = tuple(str(r["name"]) for r in reserved_pods(claim))
    return ClaimAllocation(
        uid=uid,
        pool=pools[0],
        devices=allocated,
        reserved_pods=reserved,
        preload=_preload(bodies.allocation_config(claim), driver),
    )


def reserved_pods(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The claim's ``status.reservedFor`` entries that name a core pod, in order (the
    first is the consumer prepare takes)."""
    return [
        r
        for r in bodies.reserved_for(claim)
        if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("name")
    ]


def may_be_virt_launcher(pod_name: str) -> bool:
    return pod_name.startswith(VIRT_LAUNCHER_PREFIX)


def is_virt_launcher(pod: Mapping[str, Any]) -> bool:
    """Labelled as KubeVirt labels virt-launcher pods (the caller reads only pods named as
    it names them, :func:`may_be_virt_launcher`)."""
    labels = bodies.labels(pod)
    key, value = VIRT_LAUNCHER_LABEL
    return bool(labels.get(key) == value)


def vm_name(pod: Mapping[str, Any]) -> str:
    labels = bodies.labels(pod)
    for key in VM_NAME_LABELS:
        if labels.get(key):
            return str(labels[key])
    return bodies.name(pod)


def _newest(slices: Sequence[Mapping[str, Any]], pool: str) -> list[Mapping[str, Any]]:
    ours = [s for s in slices if bodies.pool_name(s) == pool]
    if not ours:
        return []
    newest = max(bodies.pool_generation(s) for s in ours)
    return [s for s in ours if bodies.pool_generation(s) == newest]


def identity_from_slices(slices: Sequence[Mapping[str, Any]], pool: str) -> PoolIdentity | None:
    """Zone and model spellings of ``pool`` from its newest slices, or None."""
    for piece in _newest(slices, pool):
        zone: str | None = bodies.slice_zone(piece)
        model = bodies.annotation(piece, naming.ANNOTATION_GPU_TYPE)
        for device in bodies.devices(piece):
            attributes = device.get("attributes") or {}
            zone = zone or (attributes.get(naming.ATTRIBUTE_ZONE) or {}).get("string")
            model = model or (attributes.get(naming.ATTRIBUTE_GPU_TYPE) or {}).get("string")
            break
        if zone and model:
            return PoolIdentity(zone_name=str(zone), gpu_type=str(model))
    return None


class PoolResolver:
    """Pool name to :class:`PoolIdentity`, read from ResourceSlices and cached for ``ttl``."""

    def __init__(
        self,
        kube: KubeClient,
        driver: str,
        *,
        ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._driver = driver
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[str, tuple[float, PoolIdentity]] = {}
        self._flight: SingleFlight[str, PoolIdentity] = SingleFlight()

    async def resolve(self, pool: str) -> PoolIdentity:
        cached = self._cache.get(pool)
        if cached is not None and self._clock() - cached[0] < self._ttl:
            return cached[1]
        return await self._flight.run(pool, lambda: self._lookup(pool))

    async def _lookup(self, pool: str) -> PoolIdentity:
        zone_label, sep, type_label = pool.partition("/")
        if not sep or not zone_label or not type_label or "/" in type_label:
            raise ClaimError(
                f"pool {pool!r} is not <zone>/<model>: not published by this driver",
                ErrorReason.POOL,
            )
        selector = naming.label_selector(
            {
                **naming.component_labels(naming.COMPONENT_RESOURCE_INVENTORY),
                naming.LABEL_GPU_TYPE: type_label,
            }
        )
        try:
            slices = await self._kube.list_slices(driver=self._driver, label_selector=selector)
        except KubeError as err:
            raise ClaimError(
                f"reading the slices of pool {pool}: {err}", ErrorReason.KUBERNETES
            ) from None
        identity = identity_from_slices(slices, pool)
        if identity is None:
            raise ClaimError(
                f"pool {pool} has no ResourceSlice naming its Thunder zone and GPU model "
                "(was the model removed from inventory?)",
                ErrorReason.POOL,
            )
        self._cache[pool] = (self._clock(), identity)
        return identity


class ZoneIds:
    """Zone display name to ID (thunder-api.md 2.1, smallest ID wins), cached briefly; one zone list
    answers every name, and concurrent misses share it."""

    def __init__(self, thunder: ThunderClient, ttl: float = ZONE_ID_TTL) -> None:
        self._thunder = thunder
        self._ttl = ttl
        self._cache: dict[str, tuple[float, str]] = {}
        self._flight: SingleFlight[str, dict[str, str]] = SingleFlight()

    async def resolve(self, zone_name: str) -> str:
        cached = self._cache.get(zone_name)
        if cached is not None and time.monotonic() - cached[0] < self._ttl:
            return cached[1]
        zone_id = (await self._flight.run("zones", self._list)).get(zone_name)
        if zone_id is None:
            raise ClaimError(f"Thunder has no zone named {zone_name!r}", ErrorReason.THUNDER_ZONE)
        return zone_id

    async def _list(self) -> dict[str, str]:
        try:
            zones = await self._thunder.list_zones()
        except ThunderError as err:
            raise ClaimError(
                f"Thunder zone lookup failed: {err}", ErrorReason.THUNDER_ZONE
            ) from None
        ids: dict[str, str] = {}
        # smallest_zone_id's rule (thunder-api.md 2.1), for every name in one pass
        for zone in zones:
            known = ids.get(zone.display_name)
            if known is None or zone.zone_id < known:
                ids[zone.display_name] = zone.zone_id
        now = time.monotonic()
        self._cache.update((name, (now, zone_id)) for name, zone_id in ids.items())
        return ids

    def forget(self, zone_name: str) -> None:
        self._cache.pop(zone_name, None)

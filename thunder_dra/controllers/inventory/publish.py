"""Apply the ResourceSlice and DeviceClass writes of one inventory pass.

The plan is the pure `plan` module's, taken step by step (`plan_steps`): a whole plan
for a first publish holds every slice body at once (128,000 devices as dicts for the
benchmark's inventory), far beyond the operator's memory budget, while a batch holds a
few thousand. The steps come in this order:

1. DeviceClass creates and updates (a class exists before its devices);
2. ResourceSlice creates, updates and replaces, batch by batch;
3. ResourceSlice deletes (the batches' own, then those of pools no longer desired);
4. DeviceClass deletes (a class outlives its devices).

Writes within a step run concurrently (bounded). A 409 (the object changed since it
was listed, or appeared meanwhile) is not an error: the pass reports a conflict and the
next pass, made right away, plans against fresh objects. Every DeviceClass written is
checked for a silently dropped `extendedResourceName` (DRAExtendedResource off), every
slice written with device taints for taints dropped (DRADeviceTaints off), and with
binding conditions for those dropped (DRADeviceBindingConditions off).

What the API server stores for each slice written is kept in the publisher's
`SliceCache` (`shared.objects`), so the next pass need not list the slices whole. A pool found
unchanged is remembered by a digest of its desired state and the resourceVersions of its
slices; while both stay the same, later passes skip comparing its devices: the same
objects against the same desired state give the same (empty) plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from thunder_dra.controllers.inventory.binding import binding_dropped, has_binding_conditions
from thunder_dra.controllers.inventory.classes import (
    DesiredDeviceClass,
    extended_resource_name_dropped,
)
from thunder_dra.controllers.inventory.plan import (
    Action,
    Create,
    Delete,
    PoolKey,
    Replace,
    Update,
    group_by_pool,
    plan_outside_batches,
    plan_steps,
)
from thunder_dra.controllers.inventory.slices import DesiredPool
from thunder_dra.controllers.inventory.taints import has_taints, taints_dropped
from thunder_dra.controllers.shared.objects import SliceCache
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import Conflict, KubeError, NotFound
from thunder_dra.kube.resources import DEVICE_CLASSES, RESOURCE_SLICES

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class PublishOutcome:
    """What one publish did."""

    writes: int = 0
    conflicts: int = 0
    errors: list[str] = field(default_factory=list)
    added_pools: list[str] = field(default_factory=list)
    resized_pools: list[tuple[str, int, int]] = field(default_factory=list)
    removed_pools: list[str] = field(default_factory=list)
    kept_pools: list[str] = field(default_factory=list)
    added_classes: list[str] = field(default_factory=list)
    updated_classes: list[str] = field(default_factory=list)
    removed_classes: list[str] = field(default_factory=list)
    extended_resource_dropped: bool = False
    taints_dropped: bool = False
    """A slice written with device taints was stored without them."""
    taints_kept: bool = False
    """A slice written with device taints was stored with them."""
    binding_dropped: bool = False
    """A slice written with binding conditions was stored without them."""
    binding_kept: bool = False
    """A slice written with binding conditions was stored with them."""

    @property
    def changed(self) -> bool:
        return self.writes > 0


class Publisher:
    """Applies planned actions against the API server."""

    def __init__(self, kube: KubeClient, concurrency: int) -> None:
        self._kube = kube
        self._gate = asyncio.Semaphore(concurrency)
        self.cache = SliceCache()
        """The published slices as last seen; passes list them through it."""
        self._unchanged: dict[str, PoolKey] = {}

    async def publish(
        self,
        pools: Sequence[DesiredPool],
        classes: Sequence[DesiredDeviceClass],
        existing_slices: Sequence[Mapping[str, Any]],
        existing_classes: Sequence[Mapping[str, Any]],
        current_devices: Mapping[str, Collection[str]],
        *,
        inventory_available: bool = True,
        unavailable_zones: Collection[str] = (),
        keep_pools: Collection[str] = (),
        extended_resource_supported: bool = True,
    ) -> PublishOutcome:
        """Bring the published objects to `pools` and `classes`.

        Pools in `keep_pools` (held by the shrink guard) and those of `unavailable_zones`
        are left exactly as listed, with the classes they use.
        """
        outcome = PublishOutcome()
        by_pool = group_by_pool(existing_slices)
        outside = await asyncio.to_thread(
            plan_outside_batches,
            pools,
            classes,
            by_pool,
            existing_classes,
            inventory_available=inventory_available,
            unavailable_zones=unavailable_zones,
            extended_resource_supported=extended_resource_supported,
            keep_pools=keep_pools,
        )
        outcome.kept_pools = sorted(outside.kept_pools)
        for pool in pools:
            before = len(current_devices.get(pool.name, ()))
            if pool.name not in by_pool:
                outcome.added_pools.append(pool.name)
            elif before != len(pool.devices):
                outcome.resized_pools.append((pool.name, before, len(pool.devices)))
        desired = {pool.name for pool in pools}
        outcome.removed_pools = sorted(
            name for name in by_pool if name not in desired and name not in outside.kept_pools
        )
        class_writes = [a for a in outside.class_actions if not isinstance(a, Delete)]
        class_deletes = [a for a in outside.class_actions if isinstance(a, Delete)]
        outcome.added_classes = [a.name for a in class_writes if isinstance(a, Create)]
        outcome.updated_classes = [a.name for a in class_writes if not isinstance(a, Create)]
        outcome.removed_classes = [a.name for a in class_deletes]

        # Planning a batch is pure CPU work (comparing every device of its pools); it runs
        # in a worker thread so probes, metrics and watches stay served meanwhile.
        steps = plan_steps(pools, outside, by_pool, unchanged=self._unchanged)
        while (step := await asyncio.to_thread(next, steps, None)) is not None:
            await self._apply_all(step[1], outcome)
        return outcome

    async def _apply_all(self, actions: Sequence[Action], outcome: PublishOutcome) -> None:
        if actions:
            await asyncio.gather(*(self._gated(self._apply(a, outcome)) for a in actions))

    async def _gated(self, work: Awaitable[None]) -> None:
        async with self._gate:
            await work

    async def _delete(self, path: str, resource_version: str | None) -> None:
        """Delete the listed version; one already gone is as good."""
        with contextlib.suppress(NotFound):
            await self._kube.delete(path, resource_version=resource_version)

    async def _apply(self, action: Action, outcome: PublishOutcome) -> None:
        path = RESOURCE_SLICES if action.kind == "ResourceSlice" else DEVICE_CLASSES
        try:
            if isinstance(action, Create):
                stored = await self._kube.create(path.collection(), action.body)
                outcome.writes += 1
                self._stored(action, stored, outcome)
            elif isinstance(action, Update):
                stored = await self._kube.replace(path.item(action.name), action.body)
                outcome.writes += 1
                self._stored(action, stored, outcome)
            elif isinstance(action, Replace):
                self.cache.forget(action.name)
                await self._delete(path.item(action.name), action.resource_version)
                outcome.writes += 1
                stored = await self._kube.create(path.collection(), action.body)
                outcome.writes += 1
                self._stored(action, stored, outcome)
            else:
                if action.kind == "ResourceSlice":
                    self.cache.forget(action.name)
                await self._delete(path.item(action.name), action.resource_version)
                outcome.writes += 1
        except KubeError as exc:
            if isinstance(exc, Conflict) or (
                isinstance(exc, NotFound) and isinstance(action, Update)
            ):
                outcome.conflicts += 1
                _log.info(
                    "object changed while publishing; the next pass replans",
                    extra={"kind": action.kind, "object": action.name, "error": exc.message},
                )
                return
            outcome.errors.append(f"{_verb(action)} {action.kind} {action.name}: {exc}")
            _log.error(
                "write failed",
                extra={"kind": action.kind, "object": action.name, "error": str(exc)},
            )

    def _stored(
        self, action: Create | Update | Replace, stored: Any, outcome: PublishOutcome
    ) -> None:
        """What the API server answered a write with: cached for a slice, checked for a
        class."""
        if not isinstance(stored, Mapping):
            return
        if action.kind == "ResourceSlice":
            self.cache.remember(stored)
            if has_taints(action.body):
                if taints_dropped(action.body, stored):
                    outcome.taints_dropped = True
                else:
                    outcome.taints_kept = True
            if has_binding_conditions(action.body):
                if binding_dropped(action.body, stored):
                    outcome.binding_dropped = True
                else:
                    outcome.binding_kept = True
        elif extended_resource_name_dropped(action.body, stored):
            outcome.extended_resource_dropped = True


def _verb(action: Action) -> str:
    names: dict[type[Any], str] = {
        Create: "create",
        Update: "update",
        Replace: "replace",
        Delete: "delete",
    }
    return names[type(action)]

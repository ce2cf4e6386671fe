"""Decide the writes that bring published objects to the desired state, and no others.

An operator restart or a pass where nothing changed must make zero writes, so an
existing object is compared with the desired one only on what this operator owns:

- metadata: the label and annotation keys it sets, and its owner reference; labels,
  annotations, finalizers and owners added by others are left alone (and kept on
  update);
- spec: the ResourceSlice fields `driver`, `pool`, `nodeName`, `nodeSelector`,
  `allNodes`, `perDeviceNodeSelection`, `sharedCounters`, `devices`; the
  DeviceClass fields `selectors`, `config`, `extendedResourceName`. Fields outside
  these (new API fields an API server may default) are ignored, so a newer server
  never causes a write per pass;
- null, "", false, [] and {} count as absent on both sides, because the API server
  omits or fills in empty values (e.g. `matchFields: []`), which mean the same.

Server-set metadata (resourceVersion, uid, creationTimestamp, managedFields,
generation) is never compared. A device taint's `timeAdded` is set by the API server:
the desired body carries the stored value of the same taint on the same device
(taints.py), so it compares equal; a new taint is sent without one.

Pools: when every slice of a pool matches, nothing is written and the pool keeps its
generation. When any differs, the pool's generation goes up by one (from the highest
existing) and every slice of the pool is written with it, since consumers only use
slices of a pool's newest generation. A slice whose driver differs (immutable) or that
carries a nodeName is replaced. Pools and classes missing from the desired state are
deleted, except when the caller says inventory is unavailable (nothing is deleted),
names zones it could not read, or names pools to keep as they are (their pools, and
the classes they use, are kept).

One planner: `plan_outside_batches` decides the classes and the pools no longer
desired, and `plan_steps` the desired pools' slices in batches of at most
`BATCH_DEVICES` devices, in apply order. The publisher takes the steps one at a time, so
a pass never holds every slice body at once.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from thunder_dra.controllers.inventory.classes import DesiredDeviceClass, is_thunder_device_class
from thunder_dra.controllers.inventory.slices import DesiredPool, is_inventory_slice
from thunder_dra.controllers.inventory.taints import time_added_index
from thunder_dra.controllers.shared.ownership import update_body
from thunder_dra.kube import bodies, naming

SLICE_SPEC_KEYS: Final = (
    "driver",
    "pool",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "perDeviceNodeSelection",
    "sharedCounters",
    "devices",
)
CLASS_SPEC_KEYS: Final = ("selectors", "config", "extendedResourceName")
FIRST_GENERATION: Final = 1

Kind = Literal["ResourceSlice", "DeviceClass"]


@dataclass(frozen=True, slots=True)
class Create:
    kind: Kind
    name: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Update:
    """Replace (PUT) with `body`, which carries the existing resourceVersion."""

    kind: Kind
    name: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Replace:
    """Delete the existing object (an immutable field changed), then create `body`."""

    kind: Kind
    name: str
    resource_version: str | None
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Delete:
    kind: Kind
    name: str
    resource_version: str | None


Action = Create | Update | Replace | Delete


@dataclass(frozen=True, slots=True)
class SlicePlan:
    actions: tuple[Action, ...]
    generations: Mapping[str, int]
    """Generation of every desired pool after the plan is applied."""
    changed_pools: frozenset[str]
    kept_pools: frozenset[str] = frozenset()
    """Existing pools left untouched because their zone could not be read."""


def prune(value: Any) -> Any:
    """`value` with null, "", false, [] and {} removed from every mapping, recursively."""
    if isinstance(value, Mapping):
        pruned = {key: prune(item) for key, item in value.items()}
        return {key: item for key, item in pruned.items() if not _is_empty(item)}
    if isinstance(value, list | tuple):
        return [prune(item) for item in value]
    return value


def _is_empty(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, str | list | dict) and not value)


def same_when_pruned(a: Any, b: Any) -> bool:
    """Whether `prune(a) == prune(b)`, without building either pruned copy.

    Equal parts compare at C speed and are not walked, so a slice whose devices came back
    with a few defaulted empty fields costs a look at those devices' keys, not a pruned
    copy of every device on both sides. Values compare as Python compares them (False == 0):
    a field of the API's bodies is a boolean on both sides or a number on both sides."""
    if a == b:
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in a.keys() | b.keys():
            x, y = a.get(key), b.get(key)
            if not same_when_pruned(x, y) and not (_is_empty(prune(x)) and _is_empty(prune(y))):
                return False
        return True
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(map(same_when_pruned, a, b))
    return False


def owned_view(
    obj: Mapping[str, Any], desired: Mapping[str, Any], spec_keys: Sequence[str]
) -> dict[str, Any]:
    """The parts of `obj` that the operator owns, shaped by the `desired` body."""
    have_labels, have_annotations = bodies.labels(obj), bodies.annotations(obj)
    owner_uids = {ref.get("uid") for ref in bodies.owner_references(desired)}
    spec = bodies.spec(obj)
    view: dict[str, Any] = prune(
        {
            "labels": {key: have_labels.get(key) for key in bodies.labels(desired)},
            "annotations": {key: have_annotations.get(key) for key in bodies.annotations(desired)},
            "owners": [
                {k: ref.get(k) for k in ("apiVersion", "kind", "name", "uid", "controller")}
                for ref in bodies.owner_references(obj)
                if ref.get("uid") in owner_uids
            ],
            "spec": {key: spec.get(key) for key in spec_keys},
        }
    )
    return view


def matches(
    existing: Mapping[str, Any], desired: Mapping[str, Any], spec_keys: Sequence[str]
) -> bool:
    """Whether `existing` already has everything of `desired` that the operator owns."""
    have, want = bodies.spec(existing), bodies.spec(desired)
    # The spec fields compare as `owned_view` would prune them, without pruning every
    # device of the slice (most of a pass at 100,000+ devices); only the (small) metadata
    # view is normalised.
    return same_when_pruned(
        {key: have.get(key) for key in spec_keys}, {key: want.get(key) for key in spec_keys}
    ) and owned_view(existing, desired, ()) == owned_view(desired, desired, ())


def _needs_replace(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    return bodies.driver(existing) != bodies.driver(desired) or bool(
        bodies.spec(existing).get("nodeName")
    )


def _pool_actions(
    pool: DesiredPool, existing: Sequence[Mapping[str, Any]]
) -> tuple[int, list[Action]]:
    by_name = {bodies.name(obj): obj for obj in existing}
    current = max((bodies.pool_generation(obj) for obj in existing), default=0)
    # The taints' stored timeAdded, carried into the desired bodies (taints.py); only
    # pools with tainted devices pay for reading their published devices.
    time_added = (
        time_added_index(d for obj in existing for d in bodies.devices(obj))
        if pool.taints or pool.refused
        else {}
    )
    unchanged = len(by_name) == len(pool.slices) and all(
        piece.name in by_name
        and bodies.pool_generation(by_name[piece.name]) == current
        and matches(
            by_name[piece.name],
            pool.manifest(piece, current, time_added),
            SLICE_SPEC_KEYS,
        )
        for piece in pool.slices
    )
    if unchanged and existing:
        return current, []
    generation = max(current + 1, FIRST_GENERATION)
    actions: list[Action] = []
    for piece in pool.slices:
        body = pool.manifest(piece, generation, time_added)
        old = by_name.pop(piece.name, None)
        if old is None:
            actions.append(Create("ResourceSlice", piece.name, body))
        elif _needs_replace(old, body):
            actions.append(Replace("ResourceSlice", piece.name, bodies.resource_version(old), body))
        else:
            actions.append(Update("ResourceSlice", piece.name, update_body(old, body)))
    for name, old in sorted(by_name.items()):
        actions.append(Delete("ResourceSlice", name, bodies.resource_version(old)))
    return generation, actions


def plan_resource_slices(
    desired: Iterable[DesiredPool],
    existing: Iterable[Mapping[str, Any]],
    *,
    inventory_available: bool = True,
    unavailable_zones: Collection[str] = (),
    keep_pools: Collection[str] = (),
) -> SlicePlan:
    """The slice writes for `desired` given the listed ResourceSlices `existing`."""
    by_pool: defaultdict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for obj in existing:
        if is_inventory_slice(obj):
            by_pool[bodies.pool_name(obj)].append(obj)
    actions: list[Action] = []
    generations: dict[str, int] = {}
    changed: set[str] = set()
    for pool in desired:
        generation, pool_actions = _pool_actions(pool, by_pool.pop(pool.name, []))
        generations[pool.name] = generation
        if pool_actions:
            changed.add(pool.name)
            actions += pool_actions
    kept: set[str] = set()
    for pool_name, objs in sorted(by_pool.items()):
        if (
            not inventory_available
            or pool_name in keep_pools
            or any(bodies.slice_zone(o) in unavailable_zones for o in objs)
        ):
            kept.add(pool_name)
            continue
        changed.add(pool_name)
        for obj in sorted(objs, key=bodies.name):
            actions.append(Delete("ResourceSlice", bodies.name(obj), bodies.resource_version(obj)))
    return SlicePlan(tuple(actions), generations, frozenset(changed), frozenset(kept))


def plan_device_classes(
    desired: Iterable[DesiredDeviceClass],
    existing: Iterable[Mapping[str, Any]],
    *,
    inventory_available: bool = True,
    keep_type_labels: Collection[str] = (),
    extended_resource_supported: bool = True,
) -> tuple[Action, ...]:
    """The DeviceClass writes for `desired` given the listed DeviceClasses `existing`.

    With `extended_resource_supported=False` (the API server drops the field) classes
    are written and compared without extendedResourceName, so they do not churn.
    """
    by_name = {bodies.name(o): o for o in existing if is_thunder_device_class(o)}
    actions: list[Action] = []
    for wanted in desired:
        body = wanted.manifest(with_extended_resource=extended_resource_supported)
        old = by_name.pop(wanted.name, None)
        if old is None:
            actions.append(Create("DeviceClass", wanted.name, body))
        elif not matches(old, body, CLASS_SPEC_KEYS):
            actions.append(Update("DeviceClass", wanted.name, update_body(old, body)))
    for name, old in sorted(by_name.items()):
        label = bodies.label(old, naming.LABEL_GPU_TYPE)
        if inventory_available and label not in keep_type_labels:
            actions.append(Delete("DeviceClass", name, bodies.resource_version(old)))
    return tuple(actions)


BATCH_DEVICES: Final = 4096
"""Devices planned (and held as request bodies) at a time."""


def batches(
    pools: Sequence[DesiredPool], budget: int = BATCH_DEVICES
) -> Iterator[list[DesiredPool]]:
    """Consecutive runs of pools with at most `budget` devices (a bigger pool alone)."""
    batch: list[DesiredPool] = []
    held = 0
    for pool in pools:
        size = len(pool.devices)
        if batch and held + size > budget:
            yield batch
            batch, held = [], 0
        batch.append(pool)
        held += size
    if batch:
        yield batch


@dataclass(frozen=True, slots=True)
class ClassPlan:
    """The DeviceClass actions and the ResourceSlice deletes of pools no longer desired."""

    class_actions: tuple[Action, ...]
    retired_slice_actions: tuple[Action, ...]
    kept_pools: frozenset[str]
    retired_pools: frozenset[str] = frozenset()
    """Existing pools no longer desired whose slices are deleted."""


def plan_outside_batches(
    pools: Sequence[DesiredPool],
    classes: Sequence[DesiredDeviceClass],
    existing_by_pool: Mapping[str, Sequence[Mapping[str, Any]]],
    existing_classes: Sequence[Mapping[str, Any]],
    *,
    inventory_available: bool,
    unavailable_zones: Collection[str],
    extended_resource_supported: bool,
    keep_pools: Collection[str] = (),
) -> ClassPlan:
    """Everything a pass decides besides the desired pools' own slices: the DeviceClass
    actions, and the fate of listed pools no longer desired (deleted, or kept with the
    classes they use when their zone could not be read or the guard holds them)."""
    desired = {pool.name for pool in pools}
    retired = [
        obj for name, objs in existing_by_pool.items() if name not in desired for obj in objs
    ]
    retired_plan = plan_resource_slices(
        [],
        retired,
        inventory_available=inventory_available,
        unavailable_zones=unavailable_zones,
        keep_pools=keep_pools,
    )
    kept_labels = {
        label
        for obj in retired
        if bodies.pool_name(obj) in retired_plan.kept_pools
        for label in (bodies.label(obj, naming.LABEL_GPU_TYPE),)
        if label
    }
    class_actions = plan_device_classes(
        classes,
        existing_classes,
        inventory_available=inventory_available,
        keep_type_labels=kept_labels,
        extended_resource_supported=extended_resource_supported,
    )
    return ClassPlan(
        class_actions,
        retired_plan.actions,
        retired_plan.kept_pools,
        retired_plan.changed_pools - retired_plan.kept_pools,
    )


def group_by_pool(
    existing_slices: Sequence[Mapping[str, Any]],
) -> dict[str, list[Mapping[str, Any]]]:
    grouped: defaultdict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for obj in existing_slices:
        grouped[bodies.pool_name(obj)].append(obj)
    return dict(grouped)


PoolKey = tuple[bytes, tuple[tuple[str, str], ...]]
"""A pool's desired-state digest and its slices' (name, resourceVersion) pairs."""


def pool_key(pool: DesiredPool, existing: Sequence[Mapping[str, Any]]) -> PoolKey | None:
    """What a pool's plan depends on; None when a slice lacks a name or resourceVersion."""
    versions = []
    for obj in existing:
        name, version = bodies.name(obj), bodies.resource_version(obj)
        if not name or version is None:
            return None
        versions.append((name, version))
    digest = hashlib.blake2b(repr(pool).encode(), digest_size=16).digest()
    return digest, tuple(sorted(versions))


def slice_actions_in_batches(
    pools: Sequence[DesiredPool],
    existing_by_pool: Mapping[str, Sequence[Mapping[str, Any]]],
    budget: int = BATCH_DEVICES,
    unchanged: dict[str, PoolKey] | None = None,
    changed: set[str] | None = None,
) -> Iterator[tuple[list[Action], list[Action]]]:
    """(writes, deletes) of the desired pools' own slices, a batch at a time.

    With `unchanged` (pool name -> key of the pool when last found unchanged), a pool
    with the same key is not compared again, and every pool found unchanged is put
    there; the mapping is left holding only the desired pools. With `changed`, the names
    of the pools that get writes are added to it.
    """
    seen: dict[str, PoolKey] = {}
    for batch in batches(pools, budget):
        keys: dict[str, PoolKey | None] = {}
        todo = []
        for pool in batch:
            key = (
                pool_key(pool, existing_by_pool.get(pool.name, ()))
                if unchanged is not None
                else None
            )
            keys[pool.name] = key
            if key is not None and unchanged is not None and unchanged.get(pool.name) == key:
                seen[pool.name] = key
            else:
                todo.append(pool)
        existing = [obj for pool in todo for obj in existing_by_pool.get(pool.name, ())]
        plan = plan_resource_slices(todo, existing)
        if changed is not None:
            changed.update(plan.changed_pools)
        for pool in todo:
            key = keys[pool.name]
            if key is not None and pool.name not in plan.changed_pools:
                seen[pool.name] = key
        writes: list[Action] = [a for a in plan.actions if not isinstance(a, Delete)]
        deletes: list[Action] = [a for a in plan.actions if isinstance(a, Delete)]
        yield writes, deletes
    if unchanged is not None:
        unchanged.clear()
        unchanged.update(seen)


Step = tuple[str, list[Action]]
"""A group of writes that may run concurrently: (phase, actions)."""


def plan_steps(
    pools: Sequence[DesiredPool],
    outside: ClassPlan,
    existing_by_pool: Mapping[str, Sequence[Mapping[str, Any]]],
    budget: int = BATCH_DEVICES,
    unchanged: dict[str, PoolKey] | None = None,
    changed: set[str] | None = None,
) -> Iterator[Step]:
    """The plan as steps in apply order, made lazily batch by batch.

    Phases: class-writes (a class exists before its devices), slice-writes (one step per
    batch), slice-deletes, class-deletes (a class outlives its devices).
    """
    yield "class-writes", [a for a in outside.class_actions if not isinstance(a, Delete)]
    deferred: list[Action] = []
    for writes, deletes in slice_actions_in_batches(
        pools, existing_by_pool, budget, unchanged, changed
    ):
        yield "slice-writes", writes
        deferred.extend(deletes)
    yield "slice-deletes", [*deferred, *outside.retired_slice_actions]
    yield "class-deletes", [a for a in outside.class_actions if isinstance(a, Delete)]

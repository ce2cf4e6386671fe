"""The ResourceSlices that publish the pools (docs/operator.md#inventory-passes).

One pool per zone display name and GPU model, named `<zone label>/<type label>`,
one device `<type label>-<n>` per published GPU, split into slices of at most 64
devices. The v1 limit is 128, but only 64 for a slice that holds any tainted device
(taints.py), and Thunder taints devices whenever it stops backing them. With 128 a
taint would force the pool to be laid out again, into twice the slices, at the moment
Thunder fails, and back when it recovers; at 64 a taint coming or going changes only
the devices' `taints`, never which slice holds which device. Operators that published
128 per slice lay their pools out again once, on their first pass after the upgrade
(one new generation per pool of more than 64 devices; no device is withdrawn).

Node selection: one node-selector term that requires the node's
`topology.kubernetes.io/zone` to be the zone's display name AND every label of the
daemon DaemonSet's own nodeSelector. The daemon's pods run exactly where that
selector matches (it tolerates every taint by default), so a pod can only be
scheduled where a kubelet plugin can prepare its claim, with no extra node labels
for anyone to write or clean up. Zones whose display name is not a valid label value
cannot be carried by any node, so they are skipped and reported.

Devices carry `thundercompute.com/gpu_type` (Thunder's spelling, omitted if it
exceeds the 64-character attribute limit), `thundercompute.com/gpu_type_label` (the
DNS label DeviceClass selectors match, so they never depend on case rules in CEL)
and `thundercompute.com/zone`. With enrollment before binding on, every device also
carries `bindsToNode` and the enrollment binding conditions, and a device whose
enrollment Thunder refused carries the cool-down taint beside its other taints
(binding.py).

Device indices are stable: the devices currently published keep their names;
growing fills the lowest unused indices; shrinking removes the highest indices not
allocated to a claim, so an allocated device is never withdrawn (a pool may then
stay above its target until those claims end). Generations are the diff's concern.

Limits (`spec.operator.limits`): a pool publishes at most `max_devices_per_pool`
devices, at most `max_pools` pools are published and at most `max_devices` devices in
all. What is over a limit is clamped and reported in `InventoryLayout.clamps`. Pools
are served in a fixed order: pools with allocated devices first, then those already
published, then by name. The total is shared in two rounds: first each pool keeps what
it publishes now, then what is left goes to growth. So a pool never loses devices to one
served before it, and a repeated answer clamps the same way from its second pass on.
Allocated devices are published whatever the limits (they are already in use), so the
totals can only exceed a limit by devices that claims hold.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any, Final

from thunder_dra.api import syntax
from thunder_dra.api.thundercluster import PoolStatus, ThunderClusterSpec
from thunder_dra.controllers.inventory.binding import binding_fields, refused_taint_body
from thunder_dra.controllers.inventory.capacity import PoolCapacity, format_target
from thunder_dra.controllers.inventory.taints import (
    EFFECT_NO_EXECUTE,
    MAX_DEVICES_PER_TAINTED_SLICE,
    DeviceTaints,
    TimeAddedIndex,
    carry_time_added,
    taint_body,
)
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.kube import bodies, naming

MAX_DEVICES_PER_SLICE: Final = MAX_DEVICES_PER_TAINTED_SLICE
RESOURCE_API_VERSION: Final = "resource.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class InventoryConfig:
    """The ThunderCluster settings that shape published objects."""

    driver_name: str = naming.DRIVER_NAME
    device_class_prefix: str = "thunder-gpu-"
    extended_resource_prefix: str = f"{naming.DRIVER_NAME}/gpu-"
    daemon_node_selector: Mapping[str, str] = field(
        default_factory=lambda: {"kubernetes.io/os": "linux"}
    )
    owner: ThunderClusterRef | None = None
    max_devices_per_slice: int = MAX_DEVICES_PER_SLICE
    max_gpus_per_host: int | None = None
    max_devices_per_pool: int | None = None
    max_pools: int | None = None
    max_devices: int | None = None
    no_execute_after: timedelta | None = None
    """How old a device's NoSchedule taint gets before NoExecute is added (None: never)."""
    enroll_before_binding: bool = False
    """Devices carry bindsToNode and the enrollment binding conditions (binding.py)."""
    enrollment_cooldown: timedelta = timedelta(minutes=2)
    """How long a device whose enrollment Thunder refused stays tainted (binding.py)."""

    @classmethod
    def from_spec(
        cls, spec: ThunderClusterSpec, owner: ThunderClusterRef | None = None
    ) -> InventoryConfig:
        limits = spec.operator.limits
        no_execute_after = spec.operator.inventory_protection.no_execute_after
        binding = spec.operator.enroll_before_binding
        return cls(
            driver_name=spec.operator.driver_name,
            device_class_prefix=spec.operator.device_class_prefix,
            extended_resource_prefix=spec.operator.extended_resource_prefix,
            daemon_node_selector=dict(spec.daemon.node_selector),
            owner=owner,
            max_gpus_per_host=limits.max_gpus_per_host,
            max_devices_per_pool=limits.max_devices_per_pool,
            max_pools=limits.max_pools,
            max_devices=limits.max_devices,
            no_execute_after=None if no_execute_after is None else no_execute_after.to_timedelta(),
            enroll_before_binding=binding.enabled,
            enrollment_cooldown=binding.cooldown.to_timedelta(),
        )


@dataclass(frozen=True, slots=True)
class DesiredSlice:
    name: str
    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DesiredPool:
    """Everything published for one pool, short of the generation."""

    name: str
    zone_name: str
    zone_label: str
    model: str
    type_label: str
    target: Decimal
    physical: int
    live_client_gpus: int
    driver_name: str
    node_selector: tuple[tuple[str, str], ...]
    owner: ThunderClusterRef | None
    slices: tuple[DesiredSlice, ...]
    backed: int = 0
    """How many of the devices Thunder backs (its answer for the pool, before limits)."""
    taints: DeviceTaints = ()
    """(device, reason) of the devices tainted as not backed (taints.py)."""
    no_execute: tuple[str, ...] = ()
    """Tainted devices that also carry the taint with effect NoExecute (taints.py)."""
    binding: bool = False
    """Devices carry bindsToNode and the enrollment binding conditions (binding.py)."""
    refused: DeviceTaints = ()
    """(device, value) of the devices cooling down after a refused enrollment (binding.py)."""

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(name for piece in self.slices for name in piece.devices)

    def status(self) -> PoolStatus:
        """The pool's figures for ThunderCluster status; `published` counts devices kept
        for allocated claims too."""
        return PoolStatus(
            zone=self.zone_name,
            model=self.model,
            pool=self.name,
            physical=self.physical,
            target=format_target(self.target),
            published=len(self.devices),
            live_clients=self.live_client_gpus,
        )

    @property
    def labels(self) -> dict[str, str]:
        return {
            **naming.component_labels(naming.COMPONENT_RESOURCE_INVENTORY),
            naming.LABEL_OVERSUBSCRIPTION: format_target(self.target),
            naming.LABEL_GPU_TYPE: self.type_label,
            naming.LABEL_ZONE: self.zone_name,
        }

    @property
    def annotations(self) -> dict[str, str]:
        return {naming.ANNOTATION_GPU_TYPE: self.model, naming.ANNOTATION_ZONE: self.zone_name}

    def _device(
        self,
        name: str,
        reason: str | None,
        time_added: TimeAddedIndex,
        evict: bool = False,
        refused: str | None = None,
    ) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        if len(self.model) <= naming.ATTRIBUTE_STRING_MAX:
            attributes[naming.ATTRIBUTE_GPU_TYPE] = {"string": self.model}
        attributes[naming.ATTRIBUTE_GPU_TYPE_LABEL] = {"string": self.type_label}
        attributes[naming.ATTRIBUTE_ZONE] = {"string": self.zone_name}
        device: dict[str, Any] = {"name": name, "attributes": attributes}
        if self.binding:
            device.update(binding_fields())
        taints = []
        if reason is not None:
            taints.append(taint_body(reason))
            if evict:
                taints.append(taint_body(reason, effect=EFFECT_NO_EXECUTE))
        if refused is not None:
            taints.append(refused_taint_body(refused))
        if taints:
            device["taints"] = [carry_time_added(name, t, time_added) for t in taints]
        return device

    def _node_selector(self) -> dict[str, Any]:
        expressions = [
            {"key": naming.NODE_LABEL_ZONE, "operator": "In", "values": [self.zone_name]}
        ]
        expressions += [
            {"key": key, "operator": "In", "values": [value]} for key, value in self.node_selector
        ]
        return {"nodeSelectorTerms": [{"matchExpressions": expressions}]}

    def manifest(
        self, piece: DesiredSlice, generation: int, time_added: TimeAddedIndex | None = None
    ) -> dict[str, Any]:
        """The resource.k8s.io/v1 ResourceSlice body of one slice of this pool.

        `time_added` holds the stored timeAdded of taints already published."""
        reasons = dict(self.taints)
        refused = dict(self.refused)
        evict = frozenset(self.no_execute)
        index = time_added or {}
        metadata: dict[str, Any] = {
            "name": piece.name,
            "labels": self.labels,
            "annotations": self.annotations,
        }
        if self.owner is not None:
            metadata["ownerReferences"] = [self.owner.owner_reference()]
        return {
            "apiVersion": RESOURCE_API_VERSION,
            "kind": "ResourceSlice",
            "metadata": metadata,
            "spec": {
                "driver": self.driver_name,
                "pool": {
                    "name": self.name,
                    "generation": generation,
                    "resourceSliceCount": len(self.slices),
                },
                "nodeSelector": self._node_selector(),
                "devices": [
                    self._device(name, reasons.get(name), index, name in evict, refused.get(name))
                    for name in piece.devices
                ],
            },
        }

    def manifests(
        self, generation: int, time_added: TimeAddedIndex | None = None
    ) -> list[dict[str, Any]]:
        return [self.manifest(piece, generation, time_added) for piece in self.slices]


@dataclass(frozen=True, slots=True)
class SkippedPool:
    zone_name: str
    model: str
    reason: str


@dataclass(frozen=True, slots=True)
class InventoryLayout:
    """The pools to publish, and the capacities that could not be published."""

    pools: tuple[DesiredPool, ...]
    skipped: tuple[SkippedPool, ...] = ()
    clamps: tuple[str, ...] = ()
    """What a limit cut, one line per limit, naming the limit, the pools and the figures."""


def stable_device_names(
    type_label: str, count: int, current: Collection[str], allocated: Collection[str] = ()
) -> tuple[str, ...]:
    """`count` device names for a pool that currently publishes `current`.

    Current devices keep their names; growing adds the lowest unused indices;
    shrinking drops the highest indices that are not in `allocated`. Names in
    `current` that this pool's model would not produce are dropped. Every name in
    `allocated` that this pool's model produces is kept, published or not, so the
    result can be longer than `count`.
    """
    indices = {i for i in (naming.device_index(type_label, n) for n in current) if i is not None}
    pinned = {i for i in (naming.device_index(type_label, n) for n in allocated) if i is not None}
    indices |= pinned
    chosen = set(indices)
    if count >= len(indices):
        candidate = 0
        while len(chosen) < count:
            if candidate not in chosen:
                chosen.add(candidate)
            candidate += 1
    else:
        removable = sorted(indices - pinned, reverse=True)
        chosen.difference_update(removable[: len(indices) - count])
    return tuple(naming.device_name(type_label, i) for i in sorted(chosen))


def split_devices(devices: tuple[str, ...], per_slice: int) -> list[tuple[str, ...]]:
    """Consecutive chunks of at most `per_slice` devices, in order."""
    if per_slice < 1:
        raise ValueError(f"per_slice must be at least 1, got {per_slice}")
    return [devices[i : i + per_slice] for i in range(0, len(devices), per_slice)]


def is_inventory_slice(obj: Mapping[str, Any]) -> bool:
    """Whether an API object is a ResourceSlice this operator publishes (by its labels)."""
    labels = bodies.labels(obj)
    return (
        labels.get(naming.LABEL_APP_NAME) == naming.APP_NAME
        and labels.get(naming.LABEL_COMPONENT) == naming.COMPONENT_RESOURCE_INVENTORY
    )


def published_devices(existing_slices: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Pool name -> device names of its newest generation, from listed ResourceSlices."""
    newest: dict[str, int] = {}
    devices: dict[str, set[str]] = {}
    for obj in existing_slices:
        if not is_inventory_slice(obj):
            continue
        name, generation = bodies.pool_name(obj), bodies.pool_generation(obj)
        if not name:
            continue
        if generation > newest.get(name, -1):
            newest[name], devices[name] = generation, set()
        if generation == newest[name]:
            devices[name].update(bodies.device_names(obj))
    return {name: frozenset(names) for name, names in devices.items()}


@dataclass(slots=True)
class _Chosen:
    """A pool that passed the pool limit, and the devices the total limit grants it."""

    name: str
    capacity: PoolCapacity
    type_label: str
    count: int
    """What the pool asks for, within the per-pool limit."""
    current: Collection[str]
    pinned: Collection[str]
    granted: int = 0
    pinned_count: int = field(init=False)
    """The allocated devices this pool's model produces: published whatever the count."""

    def __post_init__(self) -> None:
        self.pinned_count = _own_names(self.type_label, self.pinned)

    def cost(self, count: int) -> int:
        """The devices `count` publishes (see `stable_device_names`)."""
        return max(count, self.pinned_count)


def _own_names(type_label: str, names: Collection[str]) -> int:
    """How many of `names` this pool's model produces (the others are dropped)."""
    return sum(1 for n in names if naming.device_index(type_label, n) is not None)


def _share_the_total(pools: Sequence[_Chosen], max_devices: int | None) -> None:
    """Grant each pool its count within `max_devices`, in the pools' order, in two rounds.

    First every pool keeps what it publishes now (up to its count), then what is left
    goes to growth. A pool's own devices are never handed to a pool served before it, so
    a layout is its own fixed point: the same answer against what the last pass
    published grants the same counts, wherever the order puts pools published since.
    """
    if max_devices is None or sum(pool.cost(pool.count) for pool in pools) <= max_devices:
        for pool in pools:
            pool.granted = pool.count
        return
    left = max_devices
    for pool in pools:
        pool.granted = min(pool.count, _own_names(pool.type_label, pool.current), left)
        left = max(left - pool.cost(pool.granted), 0)
    for pool in pools:
        paid = pool.cost(pool.granted)
        grown = min(pool.count, paid + left)
        if grown > pool.granted:
            left = max(left - (pool.cost(grown) - paid), 0)
            pool.granted = grown


def _publishable(
    capacities: Sequence[PoolCapacity],
) -> tuple[list[PoolCapacity], list[SkippedPool]]:
    """The capacities whose zone name a node label can carry, and the others, skipped."""
    skipped: list[SkippedPool] = []
    publishable = []
    for capacity in capacities:
        if capacity.zone_name == "" or not syntax.is_label_value(capacity.zone_name):
            skipped.append(
                SkippedPool(
                    capacity.zone_name,
                    capacity.model,
                    "zone name is not a valid label value, so no node can carry it in "
                    f"{naming.NODE_LABEL_ZONE}",
                )
            )
        else:
            publishable.append(capacity)
    return publishable, skipped


def _choose(
    named: Sequence[tuple[str, PoolCapacity]],
    type_labels: Mapping[str, str],
    config: InventoryConfig,
    current_devices: Mapping[str, Collection[str]],
    allocated_devices: Mapping[str, Collection[str]],
    skip_pools: Collection[str],
    clamps: _Clamps,
) -> list[_Chosen]:
    """Each pool's count under the pool-count and per-pool limits, in serving order."""
    chosen: list[_Chosen] = []
    publishing = 0
    for name, capacity in named:
        if name in skip_pools:
            continue
        pinned = allocated_devices.get(name, ())
        if config.max_pools is not None and publishing >= config.max_pools and not pinned:
            clamps.pools_dropped.append(name)
            continue
        count = capacity.published
        if config.max_devices_per_pool is not None and count > config.max_devices_per_pool:
            clamps.per_pool.append(f"{name} {count}->{config.max_devices_per_pool}")
            count = config.max_devices_per_pool
        if capacity.clamped_hosts:
            clamps.hosts.append(f"{name} ({capacity.clamped_hosts})")
        type_label = type_labels[capacity.model_key]
        current = current_devices.get(name, ())
        chosen.append(_Chosen(name, capacity, type_label, count, current, pinned))
        publishing += 1 if count or pinned else 0
    return chosen


def _desired_pool(
    chosen: _Chosen, zone_label: str, config: InventoryConfig, devices: tuple[str, ...]
) -> DesiredPool:
    capacity = chosen.capacity
    return DesiredPool(
        name=chosen.name,
        zone_name=capacity.zone_name,
        zone_label=zone_label,
        model=capacity.model,
        type_label=chosen.type_label,
        target=capacity.target,
        physical=capacity.physical,
        live_client_gpus=capacity.live_client_gpus,
        driver_name=config.driver_name,
        node_selector=tuple(sorted(config.daemon_node_selector.items())),
        owner=config.owner,
        slices=_slices(zone_label, chosen.type_label, devices, config),
        backed=capacity.published,
        binding=config.enroll_before_binding,
    )


def build_pools(
    capacities: Iterable[PoolCapacity],
    config: InventoryConfig,
    *,
    current_devices: Mapping[str, Collection[str]] | None = None,
    allocated_devices: Mapping[str, Collection[str]] | None = None,
    skip_pools: Collection[str] = (),
    zone_names: Collection[str] = (),
) -> InventoryLayout:
    """The pools to publish for `capacities`.

    `current_devices` (from `published_devices`) and `allocated_devices` (device
    names allocated to ResourceClaims, per pool name) keep indices stable. Pools named
    in `skip_pools` are left out (names are assigned as if they were not), for pools
    kept as they are whose devices the caller took out of the limits.

    Zone labels are assigned over the zones of `capacities` and `zone_names`: pass every
    zone Thunder listed, those whose hosts could not be read and those with no capacity
    too, so that two display names with one label (`us-east`, `US-East`) keep their
    labels, and their pools their names, while one of them cannot be read or is empty.
    """
    current_devices = current_devices or {}
    allocated_devices = allocated_devices or {}
    capacities = list(capacities)
    publishable, skipped = _publishable(capacities)
    named_zones = {c.zone_name for c in publishable}
    named_zones.update(z for z in zone_names if z and syntax.is_label_value(z))
    zone_labels = naming.assign_labels(named_zones)
    type_labels = naming.assign_labels(c.model_key for c in capacities)
    named = [
        (naming.pool_name(zone_labels[c.zone_name], type_labels[c.model_key]), c)
        for c in publishable
    ]
    # The order pools are served in when a limit cuts: see the module docstring.
    named.sort(
        key=lambda item: (
            not allocated_devices.get(item[0]),
            item[0] not in current_devices,
            item[0],
        )
    )
    clamps = _Clamps()
    chosen = _choose(
        named, type_labels, config, current_devices, allocated_devices, skip_pools, clamps
    )
    _share_the_total(chosen, config.max_devices)
    pools: list[DesiredPool] = []
    for c in chosen:
        if c.granted < c.count:
            clamps.total.append(f"{c.name} {c.count}->{c.granted}")
        devices = stable_device_names(c.type_label, c.granted, c.current, c.pinned)
        if devices:
            pools.append(_desired_pool(c, zone_labels[c.capacity.zone_name], config, devices))
    pools.sort(key=lambda pool: pool.name)
    return InventoryLayout(pools=tuple(pools), skipped=tuple(skipped), clamps=clamps.lines(config))


def _slices(
    zone_label: str, type_label: str, devices: tuple[str, ...], config: InventoryConfig
) -> tuple[DesiredSlice, ...]:
    chunks = split_devices(devices, config.max_devices_per_slice)
    return tuple(
        DesiredSlice(naming.slice_name(zone_label, type_label, k), chunk)
        for k, chunk in enumerate(chunks)
    )


CLAMP_NAMES_SHOWN: Final = 10


def _shown(items: list[str]) -> str:
    more = len(items) - CLAMP_NAMES_SHOWN
    shown = ", ".join(items[:CLAMP_NAMES_SHOWN])
    return f"{shown} and {more} more" if more > 0 else shown


@dataclass(slots=True)
class _Clamps:
    hosts: list[str] = field(default_factory=list)
    per_pool: list[str] = field(default_factory=list)
    pools_dropped: list[str] = field(default_factory=list)
    total: list[str] = field(default_factory=list)

    def lines(self, config: InventoryConfig) -> tuple[str, ...]:
        lines = []
        if self.hosts:
            lines.append(
                f"hosts reporting more than maxGPUsPerHost={config.max_gpus_per_host} GPUs "
                f"counted at {config.max_gpus_per_host}, per pool: {_shown(self.hosts)}"
            )
        if self.per_pool:
            lines.append(
                f"{len(self.per_pool)} pools clamped to maxDevicesPerPool="
                f"{config.max_devices_per_pool}: {_shown(self.per_pool)}"
            )
        if self.pools_dropped:
            lines.append(
                f"{len(self.pools_dropped)} pools not published, above maxPools="
                f"{config.max_pools}: {_shown(self.pools_dropped)}"
            )
        if self.total:
            lines.append(
                f"{len(self.total)} pools clamped to stay within maxDevices="
                f"{config.max_devices}: {_shown(self.total)}"
            )
        return tuple(lines)


def retained_pool(
    name: str,
    sample: Mapping[str, Any],
    devices: Collection[str],
    config: InventoryConfig,
) -> DesiredPool | None:
    """A pool Thunder no longer reports, kept for the `devices` claims hold.

    Its zone, model and target come from `sample`, one of its published slices (the
    pool's name is `<zone label>/<type label>`); None when nothing can be kept.
    """
    zone_label, _, type_label = name.partition("/")
    if not type_label or not is_inventory_slice(sample):
        return None
    zone_name = bodies.slice_zone(sample)
    model = bodies.annotation(sample, naming.ANNOTATION_GPU_TYPE) or type_label
    if not zone_name:
        return None
    names = stable_device_names(type_label, 0, (), devices)
    if not names:
        return None
    try:
        target = Decimal(bodies.label(sample, naming.LABEL_OVERSUBSCRIPTION) or "1")
    except ArithmeticError:
        target = Decimal(1)
    if not target.is_finite() or target <= 0:
        target = Decimal(1)
    return DesiredPool(
        name=name,
        zone_name=zone_name,
        zone_label=zone_label,
        model=model,
        type_label=type_label,
        target=target,
        physical=0,
        live_client_gpus=0,
        driver_name=config.driver_name,
        node_selector=tuple(sorted(config.daemon_node_selector.items())),
        owner=config.owner,
        slices=_slices(zone_label, type_label, names, config),
        binding=config.enroll_before_binding,
    )


def sample_slices(existing_slices: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Pool name -> one of its published slices (the first listed)."""
    samples: dict[str, Mapping[str, Any]] = {}
    for obj in existing_slices:
        if not is_inventory_slice(obj):
            continue
        pool = bodies.pool_name(obj)
        if pool:
            samples.setdefault(pool, obj)
    return samples

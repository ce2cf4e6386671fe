"""How many devices each zone publishes per GPU model (docs/operator.md#inventory-passes).

Per Thunder zone and model (models compared ignoring case, thunder-api.md 7.5):

- physical: GPUs of healthy, uncordoned hosts (thunder-api.md 2.3);
- live clients: GPUs of clients not decommissioned (thunder-api.md 2.4); a client whose type or
  count is unknown cannot be attributed to a model and is not counted;
- target (thunder-api.md 2.5): the model's item if > 0, else the zone default if > 0, else 1; a
  failed read means 1 for every model; non-numeric, NaN or infinite values are
  malformed and fall through like unset ones; targets above `MAX_TARGET` are
  clamped, so a typo cannot publish millions of devices;
- published = max(floor(physical x target), live client GPUs).

Vendor numbers are bounded: a host counts at most `max_gpus_per_host` GPUs (the rest
is clamped and the pool says how many hosts were), and a client's GPUs count at most
as much as one host may have, so a host or client reporting millions of GPUs cannot
make the arithmetic below, or the pools built from it, grow without bound.

Arithmetic is decimal: a float target is read as the shortest decimal that prints
as it (`repr`), i.e. what the API sent, so 3 x 1.1 = 3.3 -> 3 and 10 x 0.3 = 3.0 -> 3,
where binary floats would give 3.3000000000000003 and 2.9999999999999996.

Zones are matched by display name in Kubernetes, and display names are not unique
(thunder-api.md 2.1): figures are computed per Thunder zone and then added up per display name.
The pool's target is that of its smallest zone ID (the zone the name resolves to).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, ROUND_FLOOR, Decimal, InvalidOperation
from enum import StrEnum
from typing import Final

from thunder_dra.kube.naming import gpu_type_key

HEALTHY_HOST_STATUSES: Final = frozenset({"active", "online", "ready", "healthy", ""})
MAX_TARGET: Final = Decimal(64)
ONE: Final = Decimal(1)
TARGET_LABEL_STEP: Final = Decimal("0.000001")


class TargetSource(StrEnum):
    """Where a pool's oversubscription target came from."""

    MODEL = "model"
    ZONE_DEFAULT = "zone-default"
    UNSET = "unset"
    """Neither a model nor a default target was set (or they were malformed): 1."""
    READ_FAILED = "read-failed"
    """The targets could not be read: 1."""


@dataclass(frozen=True, slots=True)
class HostInventory:
    """One Thunder host (GPU server) of a zone."""

    gpu_type: str
    gpu_count: int
    status: str = ""
    cordoned: bool = False

    @property
    def adds_capacity(self) -> bool:
        return (
            not self.cordoned
            and self.gpu_count > 0
            and self.gpu_type != ""
            and self.status.strip().lower() in HEALTHY_HOST_STATUSES
        )


@dataclass(frozen=True, slots=True)
class ClientInventory:
    """One Thunder client of a zone; `decommissioned` once revoked."""

    gpu_type: str | None
    gpu_count: int | None
    decommissioned: bool = False


TargetValue = float | int | str | Decimal | None


@dataclass(frozen=True, slots=True)
class OversubscriptionTargets:
    """A zone's targets as Thunder reported them (thunder-api.md 2.5); keys as Thunder spells."""

    per_model: Mapping[str, TargetValue] = field(default_factory=dict)
    default: TargetValue = None
    read_failed: bool = False


@dataclass(frozen=True, slots=True)
class ZoneInventory:
    """What Thunder reported for one zone ID."""

    zone_id: str
    zone_name: str
    hosts: Sequence[HostInventory] = ()
    clients: Sequence[ClientInventory] = ()
    targets: OversubscriptionTargets = field(default_factory=OversubscriptionTargets)


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """Figures of one zone display name and model, ready to publish."""

    zone_name: str
    model: str
    """The model as Thunder spells it (the smallest spelling seen, so it is stable)."""
    physical: int
    target: Decimal
    target_source: TargetSource
    live_client_gpus: int
    published: int
    zone_ids: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    clamped_hosts: int = 0
    """Hosts (and clients) whose GPU count was above `max_gpus_per_host` and was clamped."""

    @property
    def model_key(self) -> str:
        return gpu_type_key(self.model)


def parse_target(value: TargetValue) -> Decimal | None:
    """A usable target (> 0, finite) as a Decimal, or None when unset or malformed."""
    if value is None or isinstance(value, bool):
        return None
    try:
        if isinstance(value, float):
            if not math.isfinite(value):
                return None
            number = Decimal(repr(value))
        else:
            number = Decimal(value)
    except (InvalidOperation, ValueError):
        return None
    if not number.is_finite() or number <= 0:
        return None
    return number


def resolve_target(
    targets: OversubscriptionTargets, model: str
) -> tuple[Decimal, TargetSource, tuple[str, ...]]:
    """The target for `model` by the rules of 2.5, where it came from, and warnings."""
    if targets.read_failed:
        return ONE, TargetSource.READ_FAILED, ()
    warnings: list[str] = []
    key = gpu_type_key(model)
    # Sorted, so two items differing only in case resolve the same way every pass.
    for spelling in sorted(targets.per_model):
        if gpu_type_key(spelling) != key:
            continue
        raw = targets.per_model[spelling]
        parsed = parse_target(raw)
        if parsed is not None:
            return _clamped(parsed, TargetSource.MODEL, warnings)
        if raw is not None:
            warnings.append(f"target {raw!r} for {spelling} is not a positive number")
    parsed = parse_target(targets.default)
    if parsed is not None:
        return _clamped(parsed, TargetSource.ZONE_DEFAULT, warnings)
    if targets.default is not None:
        warnings.append(f"default target {targets.default!r} is not a positive number")
    return ONE, TargetSource.UNSET, tuple(warnings)


def _clamped(
    target: Decimal, source: TargetSource, warnings: list[str]
) -> tuple[Decimal, TargetSource, tuple[str, ...]]:
    if target > MAX_TARGET:
        warnings.append(f"target {target} is above {MAX_TARGET}; using {MAX_TARGET}")
        target = MAX_TARGET
    return target, source, tuple(warnings)


def published_count(physical: int, target: Decimal, live_client_gpus: int) -> int:
    """max(floor(physical x target), live client GPUs)."""
    scaled = (Decimal(physical) * target).to_integral_value(rounding=ROUND_FLOOR)
    return max(int(scaled), live_client_gpus)


def format_target(target: Decimal) -> str:
    """A target as a label value: "1", "1.5", "0.25" (no exponent, no trailing zeros).

    At most 6 decimals are shown (cut, never rounded up), so any target fits in a
    63-character label value.
    """
    shown = target.quantize(TARGET_LABEL_STEP, rounding=ROUND_DOWN).normalize()
    return format(shown, "f")


@dataclass(slots=True)
class _ZoneModel:
    spellings: set[str] = field(default_factory=set)
    physical: int = 0
    live: int = 0
    clamped: int = 0


def _bounded(count: int, limit: int | None, entry: _ZoneModel) -> int:
    if limit is not None and count > limit:
        entry.clamped += 1
        return limit
    return count


def _zone_figures(zone: ZoneInventory, max_gpus_per_host: int | None) -> dict[str, _ZoneModel]:
    figures: defaultdict[str, _ZoneModel] = defaultdict(_ZoneModel)
    for host in zone.hosts:
        if host.adds_capacity:
            entry = figures[gpu_type_key(host.gpu_type)]
            entry.spellings.add(host.gpu_type)
            entry.physical += _bounded(host.gpu_count, max_gpus_per_host, entry)
    for client in zone.clients:
        if client.decommissioned or not client.gpu_type or not client.gpu_count:
            continue
        if client.gpu_count > 0:
            entry = figures[gpu_type_key(client.gpu_type)]
            # A client holds GPUs of one host: the host cap bounds it too.
            entry.live += _bounded(client.gpu_count, max_gpus_per_host, entry)
            if not entry.physical:
                entry.spellings.add(client.gpu_type)
    return figures


@dataclass(slots=True)
class _PoolSum:
    host_spellings: set[str] = field(default_factory=set)
    client_spellings: set[str] = field(default_factory=set)
    physical: int = 0
    live: int = 0
    published: int = 0
    clamped: int = 0
    zones: list[tuple[str, Decimal, TargetSource, tuple[str, ...]]] = field(default_factory=list)


def compute_capacity(
    zones: Iterable[ZoneInventory], *, max_gpus_per_host: int | None = None
) -> list[PoolCapacity]:
    """Figures per (zone display name, model), sorted by zone name then model.

    With `max_gpus_per_host`, a host or client reporting more GPUs counts that many.
    """
    sums: defaultdict[tuple[str, str], _PoolSum] = defaultdict(_PoolSum)
    for zone in zones:
        for key, figures in _zone_figures(zone, max_gpus_per_host).items():
            if figures.physical == 0 and figures.live == 0:
                continue
            entry = sums[(zone.zone_name, key)]
            spellings = figures.spellings
            (entry.host_spellings if figures.physical else entry.client_spellings).update(spellings)
            target, source, warnings = resolve_target(zone.targets, min(spellings))
            entry.physical += figures.physical
            entry.live += figures.live
            entry.clamped += figures.clamped
            entry.published += published_count(figures.physical, target, figures.live)
            entry.zones.append((zone.zone_id, target, source, warnings))
    result = []
    for (zone_name, _), entry in sorted(sums.items()):
        entry.zones.sort(key=lambda item: item[0])
        _, target, source, _ = entry.zones[0]
        result.append(
            PoolCapacity(
                zone_name=zone_name,
                model=min(entry.host_spellings or entry.client_spellings),
                physical=entry.physical,
                target=target,
                target_source=source,
                live_client_gpus=entry.live,
                published=entry.published,
                zone_ids=tuple(zone_id for zone_id, *_ in entry.zones),
                warnings=tuple(w for *_, warnings in entry.zones for w in warnings),
                clamped_hosts=entry.clamped,
            )
        )
    return result

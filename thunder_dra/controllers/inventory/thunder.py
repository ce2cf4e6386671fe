"""One read of Thunder inventory for an inventory pass (thunder-api.md 2.1, 2.3, 2.4, 2.5).

Zones are listed first; then hosts, clients and oversubscription targets of every zone
are read concurrently, never more than `concurrency` requests at a time. What may fail
and what it means:

- the zone list: nothing is known, so nothing published may be changed or removed;
- hosts or clients of a zone: that zone's display name is unavailable (all zone IDs
  sharing the name, since their figures are added up), so its pools are kept as they
  are rather than shrunk from a partial read;
- targets of a zone: the zone counts at 1x and a warning is logged (thunder-api.md 2.5).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from opentelemetry import trace

from thunder_dra.controllers.inventory.capacity import (
    ClientInventory,
    HostInventory,
    OversubscriptionTargets,
    ZoneInventory,
)
from thunder_dra.thunder import OversubscriptionTargets as WireTargets
from thunder_dra.thunder import ThunderClient, ThunderError, Zone

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ZoneFailure:
    zone_id: str
    zone_name: str
    error: str


@dataclass(slots=True)
class ThunderInventory:
    """The result of one read; `error` set means the zone list itself failed."""

    zones: list[ZoneInventory] = field(default_factory=list)
    error: str | None = None
    error_kind: str = ""
    """The failure's class (Unauthorized, ServerError, ThunderTransportError, ...)."""
    unavailable: list[ZoneFailure] = field(default_factory=list)
    """Zones whose hosts or clients could not be read."""
    target_failures: list[ZoneFailure] = field(default_factory=list)
    reads: int = 0
    """Thunder requests made (each counted once, whatever its retries)."""
    listed_zone_names: frozenset[str] = frozenset()
    """Display names of every zone the zone list returned, readable or not."""

    @property
    def available(self) -> bool:
        return self.error is None

    @property
    def unavailable_zone_names(self) -> frozenset[str]:
        return frozenset(failure.zone_name for failure in self.unavailable)


def convert_targets(wire: WireTargets) -> OversubscriptionTargets:
    per_model = {item.gpu_type: item.target for item in wire.targets if item.gpu_type is not None}
    return OversubscriptionTargets(per_model=per_model, default=wire.default)


async def read_inventory(client: ThunderClient, concurrency: int) -> ThunderInventory:
    """Read every zone's hosts, clients and targets, at most `concurrency` at a time."""
    result = ThunderInventory()
    with _tracer.start_as_current_span("thunder.read_inventory") as span:
        result.reads += 1
        try:
            zones = await client.list_zones()
        except ThunderError as exc:
            result.error, result.error_kind = str(exc), type(exc).__name__
            span.set_attribute("thunder.error", result.error_kind)
            return result
        span.set_attribute("thunder.zones", len(zones))
        result.listed_zone_names = frozenset(zone.display_name for zone in zones)
        gate = _Gate(concurrency, result)
        read = await asyncio.gather(*(_read_zone(zone, client, gate) for zone in zones))
        failed_names: set[str] = set()
        for zone, (inventory, failure, target_failure) in zip(zones, read, strict=True):
            if failure is not None:
                result.unavailable.append(failure)
                failed_names.add(zone.display_name)
            if target_failure is not None:
                result.target_failures.append(target_failure)
            if inventory is not None:
                result.zones.append(inventory)
        # A display name is published as the sum of its zone IDs: one failed ID makes
        # the whole name unknown.
        result.zones = [z for z in result.zones if z.zone_name not in failed_names]
        span.set_attribute("thunder.unavailable_zones", len(result.unavailable))
    return result


class _Gate:
    """At most `limit` Thunder requests in flight; counts them."""

    def __init__(self, limit: int, result: ThunderInventory) -> None:
        self._semaphore = asyncio.Semaphore(limit)
        self._result = result

    async def run(self, call: Callable[[], Awaitable[_T]]) -> _T:
        async with self._semaphore:
            self._result.reads += 1
            return await call()


async def _read_zone(
    zone: Zone,
    client: ThunderClient,
    gate: _Gate,
) -> tuple[ZoneInventory | None, ZoneFailure | None, ZoneFailure | None]:
    zone_id, zone_name = zone.zone_id, zone.display_name

    async def targets() -> OversubscriptionTargets:
        try:
            wire = await gate.run(lambda: client.get_oversubscription_targets(zone_id))
        except ThunderError as exc:
            _log.warning(
                "oversubscription targets unreadable, publishing the zone at 1x",
                extra={"zone": zone_name, "zone_id": zone_id, "error": str(exc)},
            )
            raise
        return convert_targets(wire)

    hosts_read = gate.run(lambda: client.list_hosts(zone_id))
    clients_read = gate.run(lambda: client.list_clients(zone_id))
    hosts, clients, zone_targets = await asyncio.gather(
        hosts_read, clients_read, targets(), return_exceptions=True
    )
    for outcome in (hosts, clients, zone_targets):
        if isinstance(outcome, BaseException) and not isinstance(outcome, ThunderError):
            raise outcome
    if isinstance(hosts, BaseException) or isinstance(clients, BaseException):
        error = hosts if isinstance(hosts, BaseException) else clients
        _log.warning(
            "zone inventory unreadable, keeping its published pools",
            extra={"zone": zone_name, "zone_id": zone_id, "error": str(error)},
        )
        return None, ZoneFailure(zone_id, zone_name, str(error)), None
    target_failure = None
    if isinstance(zone_targets, BaseException):
        target_failure = ZoneFailure(zone_id, zone_name, str(zone_targets))
        zone_targets = OversubscriptionTargets(read_failed=True)
    inventory = ZoneInventory(
        zone_id=zone_id,
        zone_name=zone_name,
        hosts=tuple(
            HostInventory(
                gpu_type=host.gpu_type,
                gpu_count=host.gpu_count,
                status=host.status,
                cordoned=host.cordoned,
            )
            for host in hosts
        ),
        clients=tuple(
            ClientInventory(
                gpu_type=record.gpu_type,
                gpu_count=record.gpu_count,
                decommissioned=not record.live,
            )
            for record in clients
        ),
        targets=zone_targets,
    )
    return inventory, None, target_failure

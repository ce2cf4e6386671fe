"""Device health for the kubelet: what Thunder says of every device prepared on this node.

The kubelet watches a plugin's ``DRAResourceHealth`` service (``NodeWatchResources``) and
writes what it hears into ``containerStatuses[].allocatedResourcesStatus`` of the pods
that use each device. Each answer is the plugin's whole device list; a device the kubelet
does not hear of again within its timeout (30 s unless the device says otherwise) reads
Unknown.

One :class:`HealthMonitor` per daemon takes a snapshot every :data:`HEALTH_INTERVAL`
seconds and every watcher gets that same snapshot, so Thunder is read once per zone per
interval however many claims and watchers there are:

- the checkpoint's prepared claims are taken first, then each of their zones is read,
  all zones side by side: its client list (``GET /api/v1/clients``) and its host list
  (``GET /api/v1/hosts``), both within :data:`READ_TIMEOUT` seconds in all (the
  client's own retries included);
- nothing is read when nothing is prepared;
- a device is Healthy while its claim's Thunder client is listed and live and its zone
  has an online host; Unhealthy, with a message, when the client is revoked
  (``decommissionedAt`` set) or missing from the list, or no host of the zone is online;
  Unknown, with the error, while the zone cannot be read (an error answer, a malformed
  one, a timeout).

Answers are parsed by the Thunder client's models (unknown fields ignored, wrong shapes
refused, at most 10 MiB) and messages are cut to the kubelet's 1024 characters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from prometheus_client import Gauge

from thunder_dra.plugin.state.checkpoint import ClaimState, PreparedClaim
from thunder_dra.thunder import ThunderError
from thunder_dra.thunder.models import ClientRecord, Host

log = logging.getLogger(__name__)

# Seconds between snapshots: well within the kubelet's 30 s, so a device stays reported.
HEALTH_INTERVAL = 10.0
# How long one snapshot's Thunder reads may take in all, retries included.
READ_TIMEOUT = 8.0
# Sent with every device: the kubelet's own default, three snapshots' worth.
HEALTH_TIMEOUT_SECONDS = 30
# The kubelet keeps at most this many characters of a message.
MAX_MESSAGE = 1024


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class DeviceHealth:
    """One prepared device as the kubelet hears of it."""

    pool_name: str
    device_name: str
    health: Health
    message: str = ""
    claim_uid: str = ""


@dataclass(frozen=True)
class HealthSnapshot:
    """Every prepared device's health at ``taken_at`` (Unix seconds); ``serial`` counts up."""

    devices: tuple[DeviceHealth, ...]
    taken_at: int
    serial: int

    def counts(self) -> dict[Health, int]:
        found = dict.fromkeys(Health, 0)
        for device in self.devices:
            found[device.health] += 1
        return found


class HealthReader(Protocol):
    """The Thunder reads a snapshot needs (:class:`thunder_dra.thunder.ThunderClient`)."""

    async def list_clients(self, zone_id: str | None = None) -> list[ClientRecord]: ...

    async def list_hosts(self, zone_id: str | None = None) -> list[Host]: ...


@dataclass(frozen=True)
class ZoneView:
    """What one read of a zone said: its clients by ID and its online hosts, or the error
    that kept it from being read."""

    clients: Mapping[str, ClientRecord] = field(default_factory=dict)
    online_hosts: int = 0
    error: str | None = None

    @classmethod
    def of(cls, clients: Iterable[ClientRecord], hosts: Iterable[Host]) -> ZoneView:
        by_id: dict[str, ClientRecord] = {}
        for client in clients:
            # A revocation sticks: of two records with one ID, the revoked one counts.
            if client.client_id not in by_id or not client.live:
                by_id[client.client_id] = client
        return cls(clients=by_id, online_hosts=sum(1 for h in hosts if h.healthy))


def _bounded(message: str) -> str:
    message = " ".join(message.split())
    if len(message) <= MAX_MESSAGE:
        return message
    return message[: MAX_MESSAGE - 3] + "..."


def claim_health(claim: PreparedClaim, view: ZoneView) -> tuple[Health, str]:
    """The health of ``claim``'s devices, with the message the pod's status shows."""
    zone = claim.zone_name
    if view.error is not None:
        return Health.UNKNOWN, _bounded(f"Thunder cannot be read for zone {zone}: {view.error}")
    problems = []
    client_id = claim.client_id
    if client_id:
        record = view.clients.get(client_id)
        if record is None:
            problems.append(
                f"Thunder client {client_id} is no longer in zone {zone}'s client list"
                " (revoked or removed outside the driver)"
            )
        elif record.decommissioned_at is not None:
            problems.append(
                f"Thunder client {client_id} was revoked"
                f" (decommissioned at {record.decommissioned_at.isoformat()})"
            )
    if view.online_hosts == 0:
        problems.append(f"zone {zone} has no online Thunder host")
    if problems:
        return Health.UNHEALTHY, _bounded("; ".join(problems))
    if client_id:
        return Health.HEALTHY, _bounded(f"Thunder client {client_id} is live in zone {zone}")
    # A VM's guest exchanges its own token: only the zone can be checked here.
    return Health.HEALTHY, _bounded(f"zone {zone} has an online Thunder host")


def device_health(
    claims: Iterable[PreparedClaim], views: Mapping[str, ZoneView]
) -> tuple[DeviceHealth, ...]:
    """Every device of ``claims``, sorted by pool and name; each claim judged by its zone's
    view (a zone without one reads Unknown)."""
    found: dict[tuple[str, str], DeviceHealth] = {}
    for claim in claims:
        view = views.get(claim.zone_id, ZoneView(error="not read yet"))
        health, message = claim_health(claim, view)
        for device in claim.devices:
            key = (device.pool_name, device.device_name)
            found.setdefault(
                key,
                DeviceHealth(
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    health=health,
                    message=message,
                    claim_uid=claim.uid,
                ),
            )
    return tuple(found[key] for key in sorted(found))


class HealthMonitor:
    """Takes a snapshot every ``interval`` seconds (:meth:`run`) and streams it to every
    watcher (:meth:`watch`): the newest one at once, then each new one."""

    def __init__(
        self,
        claims: Callable[[], Iterable[PreparedClaim]],
        thunder: HealthReader,
        *,
        interval: float = HEALTH_INTERVAL,
        read_timeout: float = READ_TIMEOUT,
        gauge: Gauge | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < read_timeout <= interval:
            raise ValueError("the read timeout must be positive and at most the interval")
        self._claims = claims
        self._thunder = thunder
        self.interval = interval
        self._read_timeout = read_timeout
        self._gauge = gauge
        self._clock = clock
        self._snapshot: HealthSnapshot | None = None
        self._published = asyncio.Event()
        self._closed = False
        self._last: dict[tuple[str, str], Health] = {}

    @property
    def snapshot(self) -> HealthSnapshot | None:
        return self._snapshot

    async def refresh(self) -> HealthSnapshot:
        """Read Thunder once per zone of the prepared claims and publish a new snapshot."""
        claims = [c for c in self._claims() if c.state is ClaimState.PREPARED and c.devices]
        zone_ids = sorted({c.zone_id for c in claims})
        # Zones are read side by side, so a snapshot takes one read timeout at most.
        read = await asyncio.gather(*(self._read_zone(zone_id) for zone_id in zone_ids))
        views = dict(zip(zone_ids, read, strict=True))
        previous = self._snapshot
        snapshot = HealthSnapshot(
            devices=device_health(claims, views),
            taken_at=int(self._clock()),
            serial=(previous.serial if previous else 0) + 1,
        )
        self._publish(snapshot)
        return snapshot

    async def _read_zone(self, zone_id: str) -> ZoneView:
        try:
            async with asyncio.timeout(self._read_timeout):
                clients = await self._thunder.list_clients(zone_id)
                hosts = await self._thunder.list_hosts(zone_id)
        except TimeoutError:
            return ZoneView(error=f"no answer within {self._read_timeout:g} s")
        except ThunderError as err:
            return ZoneView(error=str(err))
        except Exception as err:
            # Not Thunder's answer but this code's failure: still Unknown, and logged.
            log.exception("reading a zone's health failed", extra={"zone_id": zone_id})
            return ZoneView(error=f"internal error ({type(err).__name__})")
        return ZoneView.of(clients, hosts)

    def _publish(self, snapshot: HealthSnapshot) -> None:
        current = {(d.pool_name, d.device_name): d for d in snapshot.devices}
        for key, device in current.items():
            if self._last.get(key) is not device.health:
                level = logging.INFO if device.health is Health.HEALTHY else logging.WARNING
                log.log(
                    level,
                    "device health changed",
                    extra={
                        "pool": device.pool_name,
                        "device": device.device_name,
                        "claim_uid": device.claim_uid,
                        "health": device.health.value,
                        "detail": device.message,
                    },
                )
        self._last = {key: device.health for key, device in current.items()}
        if self._gauge is not None:
            for health, count in snapshot.counts().items():
                self._gauge.labels(health.value).set(count)
        self._snapshot = snapshot
        published, self._published = self._published, asyncio.Event()
        published.set()

    async def run(self) -> None:
        """Snapshots forever, one every ``interval`` seconds from the start of the last."""
        while not self._closed:
            started = time.monotonic()
            try:
                await self.refresh()
            except Exception:
                # A bug in the snapshot must not end health reporting for good.
                log.exception("device health snapshot failed")
            await asyncio.sleep(max(0.0, started + self.interval - time.monotonic()))

    async def watch(self) -> AsyncIterator[HealthSnapshot]:
        """The newest snapshot (once there is one), then every new one, until :meth:`close`.

        A slow watcher skips to the newest: nothing queues up behind it."""
        seen = 0
        while not self._closed:
            snapshot = self._snapshot
            if snapshot is not None and snapshot.serial != seen:
                seen = snapshot.serial
                yield snapshot
                continue
            await self._published.wait()

    def close(self) -> None:
        """End every watch (their streams finish cleanly) and the snapshot loop."""
        self._closed = True
        self._published.set()

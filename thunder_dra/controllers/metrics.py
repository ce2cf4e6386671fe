"""The operator's Prometheus metrics (served on `/metrics` with the Thunder client's own).

Pool gauges carry the pool name, zone and model; a pool that is removed has its
series removed too, so a dashboard never shows a retired pool as still published.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from thunder_dra.api.thundercluster import PoolStatus

_PASS_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_POOL_LABELS: Final = ("pool", "zone", "model")


class OperatorMetrics:
    """Every metric family of the operator, in one registry."""

    def __init__(self, registry: CollectorRegistry, *, process: bool = True) -> None:
        self.registry = registry
        if process:
            # process_resident_memory_bytes and friends, as the default registry has them.
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                registry.register(collector)
        self.reconcile_duration = Histogram(
            "thunder_operator_reconcile_duration_seconds",
            "Duration of one reconcile, by kind: cycle (DaemonSet, inventory and status), "
            "inventory (the inventory pass alone), daemonset, reaper.",
            ["kind"],
            buckets=_PASS_BUCKETS,
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "thunder_operator_reconcile_errors",
            "Reconciles that failed, by kind and reason.",
            ["kind", "reason"],
            registry=registry,
        )
        self.loop_errors = Counter(
            "thunder_operator_loop_errors",
            "Passes of a background loop (inventory, reaper) that raised, by loop and error "
            "type; the loop retries with jittered exponential backoff.",
            ["loop", "error"],
            registry=registry,
        )
        self.pass_starts = Counter(
            "thunder_operator_inventory_pass_starts",
            "Inventory passes started.",
            registry=registry,
        )
        self.passes = Counter(
            "thunder_operator_inventory_passes",
            "Inventory passes finished, by result (synced, unchanged, thunder_unavailable, "
            "partial, conflict, failed, invalid_spec, secret_unavailable, not_primary).",
            ["result"],
            registry=registry,
        )
        self.kubernetes_writes = Counter(
            "thunder_operator_kubernetes_writes",
            "Kubernetes writes made by the operator, by resource and verb.",
            ["resource", "verb"],
            registry=registry,
        )
        self.thunder_reachable = Gauge(
            "thunder_operator_thunder_reachable",
            "1 when the last inventory pass read every zone, else 0.",
            registry=registry,
        )
        self.extended_resource_supported = Gauge(
            "thunder_operator_extended_resource_supported",
            "1 when the API server keeps DeviceClass extendedResourceName, 0 when it drops it.",
            registry=registry,
        )
        self.pools = Gauge("thunder_operator_pools", "Pools published.", registry=registry)
        self.published_devices = Gauge(
            "thunder_operator_pool_published_devices",
            "Devices published in a pool.",
            _POOL_LABELS,
            registry=registry,
        )
        self.physical_gpus = Gauge(
            "thunder_operator_pool_physical_gpus",
            "GPUs on healthy, uncordoned hosts of a pool.",
            _POOL_LABELS,
            registry=registry,
        )
        self.target = Gauge(
            "thunder_operator_pool_oversubscription_target",
            "Oversubscription target applied to a pool.",
            _POOL_LABELS,
            registry=registry,
        )
        self.live_client_gpus = Gauge(
            "thunder_operator_pool_live_client_gpus",
            "GPUs held by live Thunder clients in a pool.",
            _POOL_LABELS,
            registry=registry,
        )
        self.clients = Gauge(
            "thunder_operator_clients",
            "Client resources, by phase.",
            ["phase"],
            registry=registry,
        )
        self.orphaned_clients = Gauge(
            "thunder_operator_orphaned_clients",
            "Client resources whose ResourceClaim is gone, waiting out the grace period.",
            registry=registry,
        )
        self.clients_reaped = Counter(
            "thunder_operator_clients_reaped",
            "Orphaned Client resources whose enrollment was revoked, by result.",
            ["result"],
            registry=registry,
        )
        self.reaper_passes = Counter(
            "thunder_operator_reaper_passes",
            "Client reaper passes finished.",
            registry=registry,
        )
        self._pool_series: set[tuple[str, str, str]] = set()

    def set_pools(self, pools: Iterable[PoolStatus]) -> None:
        """Replace the per-pool series with `pools`."""
        seen: set[tuple[str, str, str]] = set()
        for pool in pools:
            labels = (pool.pool, pool.zone, pool.model)
            seen.add(labels)
            self.published_devices.labels(*labels).set(pool.published)
            self.physical_gpus.labels(*labels).set(pool.physical)
            self.target.labels(*labels).set(float(pool.target))
            self.live_client_gpus.labels(*labels).set(pool.live_clients)
        for labels in self._pool_series - seen:
            for family in (
                self.published_devices,
                self.physical_gpus,
                self.target,
                self.live_client_gpus,
            ):
                family.remove(*labels)
        self._pool_series = seen
        self.pools.set(len(seen))

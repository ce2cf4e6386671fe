"""The operator's Prometheus metrics (served on `/metrics` with the Thunder client's own).

Names follow the scheme of `thunder_dra.process.metrics`: `thunder_dra_operator_*`.
Pool gauges carry the pool name, zone and model; a pool that is removed has its
series removed too, so a dashboard never shows a retired pool as still published.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry

from thunder_dra.api.thundercluster import PoolStatus
from thunder_dra.process.metrics import Metrics

_PASS_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_POOL_LABELS: Final = ("pool", "zone", "model")


# The results the Client reaper counts with (`clients_reaped`).
REAPED_RESULTS: Final = ("revoked", "failed", "unverified")


class OperatorMetrics:
    """Every metric family of the operator, in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        family = Metrics(registry, "operator")
        self.reconcile_duration = family.histogram(
            "reconcile_duration",
            "Duration of one reconcile, by kind: cycle (DaemonSet, inventory and status), "
            "inventory (the inventory pass alone), daemonset, reaper.",
            ["kind"],
            buckets=_PASS_BUCKETS,
        )
        self.reconcile_errors = family.counter(
            "reconcile_errors",
            "Reconciles that failed, by kind and reason.",
            ["kind", "reason"],
        )
        self.loop_errors = family.counter(
            "loop_errors",
            "Passes of a background loop (inventory, reaper) that raised, by loop and error "
            "type; the loop retries with jittered exponential backoff.",
            ["loop", "error"],
        )
        self.pass_starts = family.counter(
            "inventory_pass_starts",
            "Inventory passes started.",
        )
        self.passes = family.counter(
            "inventory_passes",
            "Inventory passes finished, by result (synced, unchanged, thunder_unavailable, "
            "partial, conflict, failed, invalid_spec, secret_unavailable, not_primary).",
            ["result"],
        )
        self.kubernetes_writes = family.counter(
            "kubernetes_writes",
            "Kubernetes writes made by the operator, by resource and verb.",
            ["resource", "verb"],
        )
        self.thunder_reachable = family.gauge(
            "thunder_reachable",
            "1 when the last inventory pass read every zone, else 0.",
        )
        self.pools_held = family.gauge(
            "inventory_pools_held",
            "Published pools the last inventory pass held back as they were, because Thunder's "
            "shrinking answer for them is suspect until it repeats (spec.operator."
            "inventoryProtection).",
        )
        self.inventory_clamped = family.gauge(
            "inventory_clamped",
            "1 when the last inventory pass cut what Thunder reported to the ThunderCluster's "
            "limits (spec.operator.limits: pools, devices, GPUs per host), else 0.",
        )
        self.extended_resource_supported = family.gauge(
            "extended_resource_supported",
            "1 when the API server keeps DeviceClass extendedResourceName, 0 when it drops it.",
        )
        self.pools = family.gauge(
            "pools",
            "Pools published.",
        )
        self.published_devices = family.gauge(
            "pool_published_devices",
            "Devices published in a pool.",
            _POOL_LABELS,
        )
        self.physical_gpus = family.gauge(
            "pool_physical_gpus",
            "GPUs on healthy, uncordoned hosts of a pool.",
            _POOL_LABELS,
        )
        self.target = family.gauge(
            "pool_oversubscription_target",
            "Oversubscription target applied to a pool.",
            _POOL_LABELS,
        )
        self.live_client_gpus = family.gauge(
            "pool_live_client_gpus",
            "GPUs held by live Thunder clients in a pool.",
            _POOL_LABELS,
        )
        self.clients = family.gauge(
            "clients",
            "Client resources, by phase.",
            ["phase"],
        )
        self.orphaned_clients = family.gauge(
            "orphaned_clients",
            "Client resources whose ResourceClaim is gone, waiting out the grace period.",
        )
        self.clients_reaped = family.counter(
            "clients_reaped",
            "Orphaned Client resources whose enrollment was revoked, by result.",
            ["result"],
        )
        self.reaper_passes = family.counter(
            "reaper_passes",
            "Client reaper passes finished.",
        )
        self._pool_series: set[tuple[str, str, str]] = set()
        # The reaper's results are a fixed set: each series exists at 0 from the start, so
        # a rate or a panel over them has data before the first orphan.
        for result in REAPED_RESULTS:
            self.clients_reaped.labels(result)

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

"""The reconcile loops of one ThunderCluster, run by a kopf daemon while this replica leads.

Every `spec.operator.reconcileInterval`, and at once when the ThunderCluster's spec
changes (its generation), its `thundercompute.com/reconcile-requested` annotation
changes or a claim's refused enrollment starts a device's cool-down (and again when
that cool-down ends), one cycle runs: the daemon DaemonSet, then the inventory pass,
then the status. A second loop reaps orphaned Clients, waking on Client events and on
its own timer.

The operator cancels them when this replica stops leading (`leader`), and kopf stops
the daemon when the ThunderCluster goes or the process stops; both loops stop with it.
Passes never raise: failures become conditions, events and metrics, and the loop goes
on.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from opentelemetry import trace
from pydantic import ValidationError

from thunder_dra.api.client import ClientPhase
from thunder_dra.api.constants import API_VERSION, DOMAIN, THUNDER_CLUSTER_KIND
from thunder_dra.api.thundercluster import ThunderCluster, ThunderClusterStatus
from thunder_dra.backoff import backoff_delay
from thunder_dra.controllers.inventory.reconciler import InventoryReconciler, InventoryResult
from thunder_dra.controllers.process.options import OperatorOptions
from thunder_dra.controllers.reaper import Reaper
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.controllers.shared.objects import list_claims
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.shared.status import (
    ConditionState,
    Observation,
    build_status,
    status_patch,
    utcnow,
)
from thunder_dra.controllers.shared.thunderapi import ThunderClients, TokenUnavailable, read_token
from thunder_dra.controllers.workload import daemonset
from thunder_dra.kube import bodies
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.kube.events import EventRecorder, ObjectRef
from thunder_dra.kube.provenance import ProvenanceKey
from thunder_dra.kube.resources import CLIENTS, THUNDER_CLUSTERS

RECONCILE_ANNOTATION: Final = f"{DOMAIN}/reconcile-requested"
"""Changing this annotation's value asks for an immediate pass, e.g. `kubectl annotate
thundercluster <name> thundercompute.com/reconcile-requested=$(date +%s) --overwrite`."""
RETRY_DELAY: Final = 1.0
INVALID_SPEC_RETRY: Final = 60.0
REAPER_MAX_INTERVAL: Final = 30.0
REAPER_MIN_INTERVAL: Final = 0.5
BACKOFF_BASE: Final = 1.0
BACKOFF_MAX: Final = 60.0
COOLDOWN_MARGIN: Final = 0.2
"""Seconds a pass waits past a cool-down's end, so the pass finds it ended."""

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer(__name__)

StopWaiter = Callable[[], Awaitable[object]]


@dataclass(slots=True)
class Services:
    """Process-wide parts every ThunderCluster loop uses."""

    options: OperatorOptions
    kube: KubeClient
    metrics: OperatorMetrics
    events: EventRecorder
    inventory: InventoryReconciler
    reaper: Reaper
    thunder_clients: ThunderClients


def plain(body: Mapping[str, Any], *, with_status: bool = True) -> dict[str, Any]:
    """A detached deep copy of a kopf body view; without its status if so asked (the
    loop reads the stored status once, and a status listing thousands of pools is most
    of the body)."""
    return copy.deepcopy(
        {key: value for key, value in body.items() if with_status or key != "status"}
    )


def fingerprint(body: Mapping[str, Any]) -> tuple[Any, Any]:
    return bodies.generation(body), bodies.annotation(body, RECONCILE_ANNOTATION)


def spec_errors(exc: ValidationError) -> str:
    """Every validation error as `<field path>: <message>`, e.g. spec.operator.limits..."""
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or '<object>'}: {error['msg']}"
        for error in exc.errors()
    )


async def _wait(event: asyncio.Event, stopped: StopWaiter, seconds: float) -> None:
    """Until `event` is set, the loop is stopped, or `seconds` pass."""
    waiters = {
        asyncio.ensure_future(event.wait()),
        asyncio.ensure_future(stopped()),
    }
    try:
        await asyncio.wait(waiters, timeout=max(seconds, 0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class ClusterLoop:
    """The loops of one ThunderCluster object."""

    def __init__(self, services: Services, uid: str, name: str) -> None:
        self.services = services
        self.uid = uid
        self.name = name
        self.trigger = asyncio.Event()
        self.reaper_trigger = asyncio.Event()
        self._status: ThunderClusterStatus | None = None
        self._status_loaded = False
        self._seen: tuple[Any, Any] | None = None
        self._cluster: ThunderCluster | None = None
        self._last_valid: ThunderCluster | None = None
        """The newest spec that validated: served while a newer one does not."""
        self._inventory_failures = 0
        self._reaper_failures = 0

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(API_VERSION, THUNDER_CLUSTER_KIND, self.name, self.uid)

    def observe(self, body: Mapping[str, Any]) -> None:
        """A watch event of the ThunderCluster: wake the loop if it asked for a pass."""
        seen = fingerprint(body)
        if self._seen is not None and seen != self._seen:
            self.trigger.set()
        self._seen = seen

    async def run(
        self, body: Mapping[str, Any], stopped: StopWaiter, is_stopped: Callable[[], bool]
    ) -> None:
        self._seen = fingerprint(body)
        reaper = asyncio.create_task(self._reaper_loop(body, stopped, is_stopped))
        try:
            while not is_stopped():
                self.trigger.clear()
                delay = await self.cycle(plain(body, with_status=not self._status_loaded))
                await _wait(self.trigger, stopped, delay)
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper

    # -- one reconcile ---------------------------------------------------------------

    async def cycle(self, raw: dict[str, Any]) -> float:
        """One DaemonSet + inventory + status cycle; returns seconds until the next."""
        metrics = self.services.metrics
        metrics.pass_starts.inc()
        started = time.monotonic()
        result = "failed"
        with _tracer.start_as_current_span(
            "thunder.reconcile", attributes={"thunder.cluster": self.name}
        ):
            try:
                result, delay = await self._cycle(raw)
                self._inventory_failures = 0
            except KubeError as exc:
                # The API server is unreachable or refused a read: nothing to report it on.
                self._inventory_failures += 1
                delay = backoff_delay(self._inventory_failures, base=BACKOFF_BASE, cap=BACKOFF_MAX)
                _log.warning(
                    "reconcile failed, retrying",
                    extra={"cluster": self.name, "error": str(exc), "retry_in": round(delay, 1)},
                )
                metrics.reconcile_errors.labels("inventory", exc.reason or "KubeError").inc()
                metrics.loop_errors.labels("inventory", type(exc).__name__).inc()
            except Exception as exc:
                # A bug or an unexpected API answer: report it and keep the loop alive.
                self._inventory_failures += 1
                delay = backoff_delay(self._inventory_failures, base=BACKOFF_BASE, cap=BACKOFF_MAX)
                _log.exception(
                    "reconcile failed, retrying",
                    extra={"cluster": self.name, "retry_in": round(delay, 1)},
                )
                metrics.reconcile_errors.labels("inventory", type(exc).__name__).inc()
                metrics.loop_errors.labels("inventory", type(exc).__name__).inc()
            finally:
                metrics.passes.labels(result).inc()
                metrics.reconcile_duration.labels("cycle").observe(time.monotonic() - started)
        return delay

    async def _cycle(self, raw: dict[str, Any]) -> tuple[str, float]:
        if not self._status_loaded:
            self._status = _stored_status(raw)
            self._status_loaded = True
        generation = bodies.generation(raw)
        try:
            cluster = ThunderCluster.model_validate(raw)
        except ValidationError as exc:
            # Written while the webhook was down, or by a client that skipped it: the last
            # valid spec keeps being served, and status says which field is wrong.
            message = spec_errors(exc)
            last = self._last_valid
            if last is None:
                message = f"the spec is invalid and no valid one was seen yet: {message}"
                await self.services.events.post(self.ref, "Warning", "InvalidSpec", message)
                invalid = ConditionState(False, "InvalidSpec", message)
                await self._write_status(
                    Observation(
                        generation,
                        invalid,
                        invalid,
                        invalid,
                        None,
                        synced=False,
                        spec_valid=invalid,
                    )
                )
                return "invalid_spec", INVALID_SPEC_RETRY
            message = (
                f"generation {generation} is invalid, serving generation "
                f"{last.metadata.generation}: {message}"
            )
            _log.warning(message, extra={"cluster": self.name, "reason": "InvalidSpec"})
            await self.services.events.post(self.ref, "Warning", "InvalidSpec", message)
            spec_valid = ConditionState(False, "InvalidSpec", message)
            return await self._serve(last, last.metadata.generation, spec_valid)
        self._last_valid = cluster
        return await self._serve(
            cluster, generation, ConditionState(True, "Valid", "the spec is valid")
        )

    async def _serve(
        self, cluster: ThunderCluster, generation: int | None, spec_valid: ConditionState
    ) -> tuple[str, float]:
        """One DaemonSet, inventory and status cycle with `cluster`'s spec."""
        interval = cluster.spec.operator.reconcile_interval.total_seconds()
        other = await self._primary_elsewhere()
        # The reaper works only for the ThunderCluster in use: two would race on Clients.
        self._cluster = cluster if other is None else None
        if other is not None:
            message = f'ThunderCluster "{other}" is the one this cluster uses; this one is ignored'
            duplicate = ConditionState(False, "DuplicateThunderCluster", message)
            await self._write_status(
                Observation(
                    generation,
                    duplicate,
                    duplicate,
                    duplicate,
                    None,
                    synced=False,
                    spec_valid=spec_valid,
                )
            )
            return "not_primary", interval
        daemon_state = await self._reconcile_daemonset(cluster)
        previous_pools = list(self._status.pools) if self._status else []
        started = time.monotonic()
        inventory = await self.services.inventory.run(cluster, self.ref, previous_pools)
        self.services.metrics.reconcile_duration.labels("inventory").observe(
            time.monotonic() - started
        )
        await self._write_status(
            Observation(
                generation,
                inventory.thunder,
                inventory.inventory,
                daemon_state,
                inventory.pools,
                synced=inventory.synced,
                suspect=inventory.suspect,
                spec_valid=spec_valid,
            )
        )
        if inventory.pools is not None and inventory.result != "thunder_unavailable":
            self.services.metrics.set_pools(inventory.pools)
        self._log_pass(inventory)
        if inventory.retry_soon:
            return inventory.result, RETRY_DELAY
        if inventory.wake_in is not None:
            # A refused enrollment's cool-down ends: its taint goes on that pass.
            return inventory.result, min(interval, inventory.wake_in + COOLDOWN_MARGIN)
        return inventory.result, interval

    def _log_pass(self, inventory: InventoryResult) -> None:
        _log.info(
            "inventory pass done",
            extra={
                "cluster": self.name,
                "result": inventory.result,
                "writes": inventory.writes,
                "pools": len(inventory.pools) if inventory.pools is not None else None,
            },
        )

    async def _primary_elsewhere(self) -> str | None:
        """With no --cluster-name, the oldest ThunderCluster is the one; others are reported."""
        if self.services.options.cluster_name:
            return None
        clusters = await self.services.kube.list_all(THUNDER_CLUSTERS.collection())
        if len(clusters) < 2:
            return None
        oldest = min(
            clusters,
            key=lambda c: (bodies.creation_timestamp(c), bodies.name(c)),
        )
        name = bodies.name(oldest)
        return None if name == self.name else name

    async def _reconcile_daemonset(self, cluster: ThunderCluster) -> ConditionState:
        """Both node roles' DaemonSets (`workload.daemonset`), and DaemonReady from them."""
        services = self.services
        options = services.options
        started = time.monotonic()
        rendered = daemonset.render_all(
            cluster.spec,
            options.namespace,
            ThunderClusterRef(cluster.metadata.name, cluster.metadata.uid or ""),
            options.daemon_service_account,
            tracing=options.daemon_tracing,
        )
        try:
            done = await daemonset.reconcile_daemonsets(services.kube, rendered)
        except KubeError as exc:
            services.metrics.reconcile_errors.labels("daemonset", exc.reason or "error").inc()
            await services.events.post(self.ref, "Warning", "DaemonSetFailed", str(exc))
            return ConditionState(False, "DaemonSetFailed", str(exc))
        finally:
            services.metrics.reconcile_duration.labels("daemonset").observe(
                time.monotonic() - started
            )
        written = False
        for role, _, action in done:
            if action == "unchanged":
                continue
            written = written or action != "deferred"
            name = daemonset.daemonset_name(role)
            message = f"DaemonSet {options.namespace}/{name} {action}"
            if action == "deferred":
                message += " until every consumer daemon pod is ready"
            _log.info(message, extra={"cluster": self.name})
            await services.events.post(
                self.ref, "Normal", f"DaemonSet{action.capitalize()}", message
            )
        if written and cluster.spec.thunder.secret_namespace != options.namespace:
            await services.events.post(
                self.ref,
                "Warning",
                "SecretNotInDaemonNamespace",
                f"spec.thunder.secretNamespace is {cluster.spec.thunder.secret_namespace} but "
                f"the daemon runs in {options.namespace}; its pods can only read a Secret "
                f"{cluster.spec.thunder.secret_name} in {options.namespace}",
            )
        state = daemonset.readiness_of_roles({role: stored for role, stored, _ in done})
        return ConditionState(state.ready, state.reason, state.message)

    async def _write_status(self, observation: Observation) -> None:
        now = utcnow()
        new = build_status(self._status, observation, now)
        patch = status_patch(self._status, new, synced=observation.synced, now=now)
        if patch is None:
            return
        try:
            await self.services.kube.merge_patch(
                THUNDER_CLUSTERS.item(self.name, subresource="status"),
                {"status": patch.to_json_dict()},
            )
        except KubeError as exc:
            _log.warning("status update failed", extra={"cluster": self.name, "error": str(exc)})
            return
        self._status = patch

    # -- the Client reaper ---------------------------------------------------------------

    async def _reaper_loop(
        self, body: Mapping[str, Any], stopped: StopWaiter, is_stopped: Callable[[], bool]
    ) -> None:
        while not is_stopped():
            self.reaper_trigger.clear()
            try:
                delay = await self.reap_once()
                self._reaper_failures = 0
            except Exception as exc:
                # Whatever the API server or Thunder did (timeouts, resets, 5xx, a body
                # of the wrong shape), the reaper must live on: orphans still cost money.
                self._reaper_failures += 1
                delay = backoff_delay(
                    self._reaper_failures, base=BACKOFF_BASE, cap=REAPER_MAX_INTERVAL
                )
                reason = exc.reason if isinstance(exc, KubeError) else ""
                self.services.metrics.reconcile_errors.labels(
                    "reaper", reason or type(exc).__name__
                ).inc()
                self.services.metrics.loop_errors.labels("reaper", type(exc).__name__).inc()
                _log.warning(
                    "client reaper pass failed, retrying",
                    exc_info=not isinstance(exc, KubeError),
                    extra={"error": str(exc), "retry_in": round(delay, 1)},
                )
            await _wait(self.reaper_trigger, stopped, delay)
            # Client events come in bursts (our own status patches among them).
            await _wait(asyncio.Event(), stopped, REAPER_MIN_INTERVAL)

    def _grace(self) -> timedelta:
        override = self.services.options.orphan_grace_period_override
        if override is not None:
            return override
        if self._cluster is None:
            return ThunderCluster().spec.operator.orphan_grace_period.to_timedelta()
        return self._cluster.spec.operator.orphan_grace_period.to_timedelta()

    async def reap_once(self) -> float:
        services = self.services
        grace = self._grace()
        interval = min(max(grace.total_seconds() / 4, 1.0), REAPER_MAX_INTERVAL)
        cluster = self._cluster
        if cluster is None:
            return 1.0
        started = time.monotonic()
        try:
            thunder = None
            key = None
            try:
                token = await read_token(services.kube, cluster.spec.thunder)
                thunder = await services.thunder_clients.get(cluster.spec.thunder.api_url, token)
                key = ProvenanceKey(token)
            except TokenUnavailable as exc:
                _log.debug("reaper cannot revoke without the token", extra={"error": str(exc)})
            clients, claims = await asyncio.gather(
                services.kube.list_all(CLIENTS.collection()),
                list_claims(services.kube, cluster.spec.operator.driver_name),
            )
            outcome = await services.reaper.run_pass(clients, claims, grace, thunder, key)
        finally:
            services.metrics.reconcile_duration.labels("reaper").observe(time.monotonic() - started)
        services.metrics.reaper_passes.inc()
        services.metrics.orphaned_clients.set(outcome.orphaned)
        phases: Mapping[str, int] = outcome.phases or {}
        for phase in ClientPhase:
            services.metrics.clients.labels(phase.value).set(phases.get(phase.value, 0))
        if outcome.next_check is not None:
            interval = min(interval, max(outcome.next_check.total_seconds(), REAPER_MIN_INTERVAL))
        return interval


def _stored_status(raw: Mapping[str, Any]) -> ThunderClusterStatus | None:
    status = bodies.status(raw)
    if not status:
        return None
    try:
        return ThunderClusterStatus.model_validate(status)
    except ValidationError:
        return None

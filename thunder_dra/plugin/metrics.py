"""The daemon's Prometheus metrics, all in one registry served at ``/metrics``.

Names follow the scheme of ``thunder_dra.process.metrics``: ``thunder_dra_daemon_*``.
Labels are bounded: results, error reasons and states come from fixed sets, never from
claim names, UIDs or error texts. The Thunder client's own families
(``thunder_dra_thunder_api_requests_total``,
``thunder_dra_thunder_api_request_duration_seconds``,
``thunder_dra_thunder_api_retries_total``) are registered in the same registry.
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry

from thunder_dra.process.metrics import Metrics, process_registry
from thunder_dra.thunder import metrics_for

_CLAIM_BUCKETS = (0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 45)


class EnrollmentState(StrEnum):
    NOT_SERVING = "not-serving"
    PENDING = "pending"
    ENROLLING = "enrolling"
    ENROLLED = "enrolled"
    FAILED = "failed"


class ErrorReason(StrEnum):
    """Why a prepare or unprepare of one claim failed (the ``reason`` label)."""

    CLAIM = "claim"  # the ResourceClaim is missing, unallocated or malformed
    POOL = "pool"  # the allocated pool cannot be mapped to a zone and GPU model
    KUBERNETES = "kubernetes"
    THUNDER_ZONE = "thunder-zone"
    THUNDER_MINT = "thunder-mint"
    THUNDER_EXCHANGE = "thunder-exchange"
    THUNDER_REVOKE = "thunder-revoke"
    LIBTHUNDER = "libthunder"
    FILESYSTEM = "filesystem"
    INTERNAL = "internal"


# The fixed label values of the counters below. Each of their series exists at 0 from the
# start, so a rate, an alert or a dashboard panel over them has data before the first
# event; tests/unit/plugin/test_plugin_metrics_initialized.py checks that every value
# the daemon counts with is here.
RESULTS = ("success", "error")
OPERATIONS = ("prepare", "unprepare", "journal-sweep")
RESTART_RESULTS = ("success", "failure")
ROLLBACK_OUTCOMES = ("committed", "rolled-back", "unrevocable", "nothing-minted")
LOOPS = ("node-enrollment",)
HEALTH_STATES = ("healthy", "unhealthy", "unknown")  # kubelet.health.Health


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else process_registry()
        family = Metrics(self.registry, "daemon")
        self.prepares = family.counter(
            "prepare_claims",
            "Claims handled by NodePrepareResources, by result.",
            ["result"],
        )
        self.unprepares = family.counter(
            "unprepare_claims",
            "Claims handled by NodeUnprepareResources, by result.",
            ["result"],
        )
        self.prepare_seconds = family.histogram(
            "prepare_duration",
            "Time to prepare one claim (from the gRPC call to its answer).",
            buckets=_CLAIM_BUCKETS,
        )
        self.unprepare_seconds = family.histogram(
            "unprepare_duration",
            "Time to unprepare one claim.",
            buckets=_CLAIM_BUCKETS,
        )
        self.errors = family.counter(
            "errors",
            "Failed claim operations by operation and reason.",
            ["operation", "reason"],
        )
        self.prepared_claims = family.gauge(
            "prepared_claims",
            "Claims prepared on this node (checkpoint entries).",
        )
        self.lock_wait = family.histogram(
            "serialize_lock_wait",
            "Time a kubelet call waited for the node's serialize lock.",
            buckets=(0.001, 0.01, 0.1, 1, 10, 45),
        )
        self.registered = family.gauge(
            "kubelet_registered",
            "1 once the kubelet accepted this plugin's registration.",
        )
        self.serving_node = family.gauge(
            "serving_node",
            "1 on a GPU-serving node (label thundercompute.com/node=true), else 0.",
        )
        self.enrollment_state = family.gauge(
            "enrollment_state",
            "Node enrollment with Thunder: 1 for the current state.",
            ["state"],
        )
        self.enrollment_attempts = family.counter(
            "enrollment_attempts",
            "Node enrollment attempts (server token minted, installer run), by result.",
            ["result"],
        )
        self.thunderd_healthy = family.gauge(
            "thunderd_healthy",
            "1 when `thunder status --json` reports thunderd healthy (serving nodes).",
        )
        self.thunderd_restarts = family.counter(
            "thunderd_restarts",
            "`thunder up` runs to restore an unhealthy thunderd, by result.",
            ["result"],
        )
        self.rollbacks = family.counter(
            "journal_rollbacks",
            "Open mint-journal entries resolved, by outcome.",
            ["outcome"],
        )
        self.loop_errors = family.counter(
            "loop_errors",
            "Failed passes of a background loop (retried with backoff), by loop"
            " (node-enrollment: enrollment and the thunderd watch; journal-sweep).",
            ["loop"],
        )
        self.device_health = family.gauge(
            "device_health",
            "Devices prepared on this node by the health last reported to the kubelet"
            " (healthy, unhealthy, unknown).",
            ["health"],
        )
        self.thunder = metrics_for(self.registry)
        self.set_enrollment(EnrollmentState.PENDING)
        self._initialize_series()

    def _initialize_series(self) -> None:
        for result in RESULTS:
            self.prepares.labels(result)
            self.unprepares.labels(result)
        for operation in OPERATIONS:
            for reason in ErrorReason:
                self.errors.labels(operation, reason.value)
        for result in RESTART_RESULTS:
            self.thunderd_restarts.labels(result)
        for outcome in ROLLBACK_OUTCOMES:
            self.rollbacks.labels(outcome)
        for loop in LOOPS:
            self.loop_errors.labels(loop)
        for health in HEALTH_STATES:
            self.device_health.labels(health)

    def set_enrollment(self, state: EnrollmentState) -> None:
        for each in EnrollmentState:
            self.enrollment_state.labels(each.value).set(1 if each is state else 0)

"""The daemon's Prometheus metrics, all in one registry served at ``/metrics``.

Labels are bounded: results, error reasons and states come from fixed sets, never from
claim names, UIDs or error texts. The Thunder client's own families
(``thunder_api_requests_total``, ``thunder_api_request_duration_seconds``,
``thunder_api_retries_total``) are registered in the same registry.
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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


class DaemonMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.prepares = Counter(
            "thunder_dra_daemon_prepare_claims",
            "Claims handled by NodePrepareResources, by result.",
            ["result"],
            registry=r,
        )
        self.unprepares = Counter(
            "thunder_dra_daemon_unprepare_claims",
            "Claims handled by NodeUnprepareResources, by result.",
            ["result"],
            registry=r,
        )
        self.prepare_seconds = Histogram(
            "thunder_dra_daemon_prepare_duration_seconds",
            "Time to prepare one claim (from the gRPC call to its answer).",
            buckets=_CLAIM_BUCKETS,
            registry=r,
        )
        self.unprepare_seconds = Histogram(
            "thunder_dra_daemon_unprepare_duration_seconds",
            "Time to unprepare one claim.",
            buckets=_CLAIM_BUCKETS,
            registry=r,
        )
        self.errors = Counter(
            "thunder_dra_daemon_errors",
            "Failed claim operations by operation and reason.",
            ["operation", "reason"],
            registry=r,
        )
        self.prepared_claims = Gauge(
            "thunder_dra_daemon_prepared_claims",
            "Claims prepared on this node (checkpoint entries).",
            registry=r,
        )
        self.lock_wait = Histogram(
            "thunder_dra_daemon_serialize_lock_wait_seconds",
            "Time a kubelet call waited for the node's serialize lock.",
            buckets=(0.001, 0.01, 0.1, 1, 10, 45),
            registry=r,
        )
        self.registered = Gauge(
            "thunder_dra_daemon_kubelet_registered",
            "1 once the kubelet accepted this plugin's registration.",
            registry=r,
        )
        self.serving_node = Gauge(
            "thunder_dra_daemon_serving_node",
            "1 on a GPU-serving node (label thundercompute.com/node=true), else 0.",
            registry=r,
        )
        self.enrollment_state = Gauge(
            "thunder_dra_daemon_enrollment_state",
            "Node enrollment with Thunder: 1 for the current state.",
            ["state"],
            registry=r,
        )
        self.enrollment_attempts = Counter(
            "thunder_dra_daemon_enrollment_attempts",
            "Node enrollment attempts (server token minted, installer run), by result.",
            ["result"],
            registry=r,
        )
        self.thunderd_healthy = Gauge(
            "thunder_dra_daemon_thunderd_healthy",
            "1 when `thunder status --json` reports thunderd healthy (serving nodes).",
            registry=r,
        )
        self.thunderd_restarts = Counter(
            "thunder_dra_daemon_thunderd_restarts",
            "`thunder up` runs to restore an unhealthy thunderd, by result.",
            ["result"],
            registry=r,
        )
        self.rollbacks = Counter(
            "thunder_dra_daemon_journal_rollbacks",
            "Open mint-journal entries resolved, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.loop_errors = Counter(
            "thunder_dra_daemon_loop_errors",
            "Failed passes of a background loop (retried with backoff), by loop"
            " (node-enrollment: enrollment and the thunderd watch; journal-sweep).",
            ["loop"],
            registry=r,
        )
        self.thunder = metrics_for(r)
        self.set_enrollment(EnrollmentState.PENDING)

    def set_enrollment(self, state: EnrollmentState) -> None:
        for each in EnrollmentState:
            self.enrollment_state.labels(each.value).set(1 if each is state else 0)

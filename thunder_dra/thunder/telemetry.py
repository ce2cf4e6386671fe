"""Prometheus metrics and OpenTelemetry spans for Thunder API requests.

Labels and attributes carry the endpoint *template* (``/api/v1/clients/{clientId}/revoke``),
never a concrete path, an ID or a credential, so cardinality stays bounded and nothing
secret reaches a scrape or a trace backend.
"""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from thunder_dra.spans import step_span
from thunder_dra.version import __version__

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

# Status label of a request that got no HTTP answer at all.
TRANSPORT_ERROR_STATUS = "transport_error"


class ThunderMetrics:
    """The client's metric families, registered once per registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "thunder_dra_thunder_api_requests",
            "Thunder API requests by method, endpoint template and status "
            "(HTTP code, or transport_error).",
            ["method", "endpoint", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "thunder_dra_thunder_api_request_duration_seconds",
            "Thunder API request latency, including reading the body.",
            ["method", "endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "thunder_dra_thunder_api_retries",
            "Thunder API attempts repeated after a retryable failure.",
            ["method", "endpoint", "reason"],
            registry=registry,
        )


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, ThunderMetrics] = (
    weakref.WeakKeyDictionary()
)


def metrics_for(registry: CollectorRegistry | None = None) -> ThunderMetrics:
    """The metric families in ``registry`` (default: the process-wide one), made on first use.

    Several clients sharing a registry share the families instead of failing to register
    duplicates.
    """
    target = REGISTRY if registry is None else registry
    found = _BY_REGISTRY.get(target)
    if found is None:
        found = ThunderMetrics(target)
        _BY_REGISTRY[target] = found
    return found


def tracer_for(provider: TracerProvider | None = None) -> Tracer:
    """The client's tracer from ``provider`` (default: the global provider)."""
    return trace.get_tracer("thunder_dra.thunder", __version__, tracer_provider=provider)


def request_span(
    tracer: Tracer, method: str, endpoint: str, attempt: int
) -> AbstractContextManager[Span]:
    """A client span for one HTTP attempt (:func:`thunder_dra.spans.step_span`: none of its
    own inside a span that is not recorded); the caller sets the status code attribute."""
    return step_span(
        tracer,
        f"{method} {endpoint}",
        kind=SpanKind.CLIENT,
        attributes={
            "http.request.method": method,
            "url.template": endpoint,
            "thunder.endpoint": endpoint,
            "thunder.attempt": attempt,
        },
        record_exception=False,
        set_status_on_exception=False,
    )


def mark_span_status(span: Span, status: int | None, problem: str | None = None) -> None:
    """Record the HTTP status (None: no answer) and mark failures as errors."""
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if problem is not None:
        span.set_status(Status(StatusCode.ERROR, problem))

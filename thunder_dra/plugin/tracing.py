"""OpenTelemetry for the daemon: spans always made, exported only when configured.

The standard variables decide: ``OTEL_SDK_DISABLED=true`` turns tracing off,
``OTEL_TRACES_EXPORTER=console`` prints finished spans to stderr, ``otlp`` uses the OTLP
HTTP exporter when its package is installed (``opentelemetry-exporter-otlp-proto-http``;
not a dependency of this project), anything else exports nothing. ``OTEL_SERVICE_NAME``
and ``OTEL_RESOURCE_ATTRIBUTES`` are honoured by the SDK.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

log = logging.getLogger(__name__)


def make_tracer_provider() -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "thunder-dra-daemon"}))
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    elif exporter == "otlp":
        try:
            module = importlib.import_module(
                "opentelemetry.exporter.otlp.proto.http.trace_exporter"
            )
        except ImportError:
            log.warning(
                "OTEL_TRACES_EXPORTER=otlp but the OTLP exporter package is not installed; "
                "spans are not exported"
            )
        else:
            provider.add_span_processor(BatchSpanProcessor(module.OTLPSpanExporter()))
    return provider

"""OpenTelemetry tracing of reconciles and Thunder calls, off unless configured.

The standard variables decide: with `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER`
unset or `none`, the global tracer provider stays the API's no-op one and spans cost
nothing. `OTEL_TRACES_EXPORTER=console` prints spans to stderr (for debugging);
`otlp` uses the OTLP exporter if the `opentelemetry-exporter-otlp` package is
installed (it is not a dependency of this project: install it into the image to
export to a collector) and otherwise logs that tracing stays off. The exporter reads
its own `OTEL_EXPORTER_OTLP_*` variables; `OTEL_SERVICE_NAME` names the service
(default `thunder-operator`).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

from thunder_dra.version import __version__

_log = logging.getLogger(__name__)


def _otlp_exporter(protocol: str) -> SpanExporter | None:
    module = (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"
        if protocol == "grpc"
        else "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    )
    try:
        exporter_class = importlib.import_module(module).OTLPSpanExporter
    except ImportError:
        return None
    exporter: SpanExporter = exporter_class()
    return exporter


def configure_tracing(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Install a tracer provider if the environment asks for export; return it."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    kind = env.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    exporter: SpanExporter | None
    if kind in ("", "none"):
        return None
    if kind == "console":
        exporter = ConsoleSpanExporter()
    elif kind == "otlp":
        exporter = _otlp_exporter(env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
        if exporter is None:
            _log.warning(
                "OTEL_TRACES_EXPORTER=otlp but opentelemetry-exporter-otlp is not installed; "
                "tracing stays off"
            )
            return None
    else:
        _log.warning("unknown OTEL_TRACES_EXPORTER, tracing stays off", extra={"exporter": kind})
        return None
    resource = Resource.create(
        {
            "service.name": env.get("OTEL_SERVICE_NAME", "thunder-operator"),
            "service.version": __version__,
        }
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider

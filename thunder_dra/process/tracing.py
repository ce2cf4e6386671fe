"""OpenTelemetry tracing for both processes, configured by the standard `OTEL_*` variables.

The spans of a kubelet call, a claim and a reconcile cycle are always made (so log lines
carry `trace_id` and `span_id`); spans leave the process only when an exporter is
configured. Without one (and without `OTEL_TRACES_SAMPLER`), spans are not recorded: each
still has its trace and span IDs, but its attributes, events and timings, which nobody
would read, cost nothing, and the steps beneath such a span get no span of their own
(:mod:`thunder_dra.spans`).

- `OTEL_TRACES_EXPORTER`: `none` (the default), `console` (finished spans on stderr),
  `otlp`, or a comma-separated list of these. `otlp` sends OTLP/HTTP with protobuf
  bodies, or OTLP/gRPC when `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` (or
  `OTEL_EXPORTER_OTLP_PROTOCOL`) is `grpc`; both exporters
  (`opentelemetry-exporter-otlp-proto-http` and `-proto-grpc`) are dependencies of the
  package, so every install and image has them. The exporter reads its own
  `OTEL_EXPORTER_OTLP_*` variables (endpoint, headers, timeout, compression,
  `insecure`). An unknown protocol is logged as a warning and nothing goes over OTLP.
- `OTEL_SERVICE_NAME`, or `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, names the
  service; the default is the process's own (`thunder-operator`, `thunder-dra-daemon`).
  `OTEL_RESOURCE_ATTRIBUTES` adds attributes; `service.version` defaults to the
  package version.
- `OTEL_TRACES_SAMPLER` (and `_ARG`) and `OTEL_SDK_DISABLED=true` act as the SDK has them.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from thunder_dra.version import __version__

OPERATOR_SERVICE: Final = "thunder-operator"
DAEMON_SERVICE: Final = "thunder-dra-daemon"

_OTLP_MODULES: Final = {
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
}

_log = logging.getLogger(__name__)


def service_resource(default_service_name: str) -> Resource:
    """The resource of this process: the `OTEL_*` variables first, then the defaults."""
    # Resource.create lets explicit attributes win over the environment; pass only
    # what the environment leaves unset.
    from_environment = OTELResourceDetector().detect().attributes
    defaults = {SERVICE_NAME: default_service_name, SERVICE_VERSION: __version__}
    return Resource.create({k: v for k, v in defaults.items() if not from_environment.get(k)})


def _otlp_exporter() -> SpanExporter | None:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    module = _OTLP_MODULES.get(protocol)
    if module is None:
        _log.warning(
            "unknown OTLP protocol, spans are not exported over OTLP",
            extra={"protocol": protocol, "known": sorted(_OTLP_MODULES)},
        )
        return None
    try:
        exporter_class = importlib.import_module(module).OTLPSpanExporter
    except ImportError:
        _log.warning(
            "OTEL_TRACES_EXPORTER=otlp but the OTLP exporter package, a dependency, is "
            "missing from this install; spans are not exported over OTLP",
            extra={"module": module},
        )
        return None
    exporter: SpanExporter = exporter_class()
    return exporter


def _exporters() -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    names = os.environ.get("OTEL_TRACES_EXPORTER", "none").lower().split(",")
    for name in (each.strip() for each in names):
        if name in ("", "none"):
            continue
        if name == "console":
            exporters.append(ConsoleSpanExporter(out=sys.stderr))
        elif name == "otlp":
            otlp = _otlp_exporter()
            if otlp is not None:
                exporters.append(otlp)
        else:
            _log.warning(
                "unknown OTEL_TRACES_EXPORTER entry, ignored",
                extra={"exporter": name, "known": ["console", "none", "otlp"]},
            )
    return exporters


def configure_tracing(default_service_name: str, *, install_global: bool = True) -> TracerProvider:
    """The process's tracer provider, from the environment; also the global one by default.

    The caller shuts it down on exit (that flushes spans still waiting for export).
    """
    exporters = _exporters()
    sampler = None if exporters or os.environ.get("OTEL_TRACES_SAMPLER") else ALWAYS_OFF
    provider = TracerProvider(resource=service_resource(default_service_name), sampler=sampler)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if install_global:
        trace.set_tracer_provider(provider)
    return provider

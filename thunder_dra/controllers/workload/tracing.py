"""The operator's own OpenTelemetry settings, handed on to the daemon pods it renders.

Tracing is configured once, for the operator's Deployment (the chart's `operator.otel`
values, or `OTEL_*` variables in its environment); the daemon DaemonSet the operator
renders carries the same settings, so the daemon pods export where the operator does.
What is handed on, and what is not:

- passed as values: the exporter, endpoint, protocol, timeout, compression and
  `insecure` settings of OTLP (also their `_TRACES_` forms), the resource attributes,
  the sampler and its argument, the propagators, `OTEL_SDK_DISABLED` and the metrics and
  logs exporters;
- `OTEL_SERVICE_NAME` is the daemon's own (`thunder-dra-daemon`), never the operator's;
- OTLP headers can carry credentials (an `Authorization` or API-key header), so they are
  never copied as a value: only when the operator is told the Secret holding them
  (`--otel-headers-secret`) does the DaemonSet get `OTEL_EXPORTER_OTLP_HEADERS` from that
  Secret through a `secretKeyRef`;
- certificate and key file paths name files in the operator's container, not in the
  daemon's, so they are not handed on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from thunder_dra.process.tracing import DAEMON_SERVICE

HANDED_ON: Final = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_LOGS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_PROPAGATORS",
)
"""The operator's variables the daemon pods get with the same value, in this order."""

SERVICE_NAME_ENV: Final = "OTEL_SERVICE_NAME"
HEADERS_ENV: Final = "OTEL_EXPORTER_OTLP_HEADERS"
DEFAULT_HEADERS_KEY: Final = "headers"


@dataclass(frozen=True, slots=True)
class SecretKey:
    """One key of a Secret in the operator's (and the daemon's) namespace."""

    name: str
    key: str = DEFAULT_HEADERS_KEY


@dataclass(frozen=True, slots=True)
class DaemonTracing:
    """The tracing settings the daemon pods get."""

    settings: tuple[tuple[str, str], ...] = ()
    """(name, value) of the operator's variables in `HANDED_ON` that are set."""
    headers_secret: SecretKey | None = None
    """Where the OTLP headers are, if they are to be sent."""
    service_name: str = DAEMON_SERVICE

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str], headers_secret: SecretKey | None = None
    ) -> DaemonTracing:
        settings = tuple((name, environ[name]) for name in HANDED_ON if environ.get(name))
        return cls(settings=settings, headers_secret=headers_secret)

    def env(self, *, overridden: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
        """The container's `env` entries; a name in `overridden` (set by the user for the
        daemon, e.g. in `daemon.extraEnv`) is left to that setting."""
        entries: list[dict[str, Any]] = [{"name": SERVICE_NAME_ENV, "value": self.service_name}]
        entries += ({"name": name, "value": value} for name, value in self.settings)
        if self.headers_secret is not None:
            ref = {"name": self.headers_secret.name, "key": self.headers_secret.key}
            entries.append({"name": HEADERS_ENV, "valueFrom": {"secretKeyRef": ref}})
        return [entry for entry in entries if entry["name"] not in overridden]


NO_TRACING: Final = DaemonTracing()
"""Nothing handed on: the daemon pods get only their own `OTEL_SERVICE_NAME`."""

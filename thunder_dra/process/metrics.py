"""One metric naming scheme and one registry helper for both processes.

Every family is named `thunder_dra_<component>_<name>[_<unit>]`:

- `<component>` is `operator`, `daemon`, or `thunder_api` (the Thunder client, in both);
- `<name>` says what is counted or measured, in snake case;
- `<unit>` is a base unit (`seconds`, `bytes`) when there is one; counters get `_total`
  from the Prometheus client on exposition.

`Metrics(registry, component)` builds families under that scheme, so no module spells
a prefix itself. `process_registry()` is the registry a process serves on `/metrics`:
its own families plus `process_*` and `python_*` (RSS, CPU, GC), as the Prometheus
client's default registry has them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

PREFIX: Final = "thunder_dra"
COMPONENTS: Final = ("operator", "daemon", "thunder_api")
UNITS: Final = ("seconds", "bytes")
# What a family name must look like (before the client adds `_total`, `_bucket`...).
NAME_PATTERN: Final = re.compile(
    rf"^{PREFIX}_({'|'.join(COMPONENTS)})_[a-z][a-z0-9]*(_[a-z0-9]+)*$"
)
_PART: Final = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


def metric_name(component: str, name: str, unit: str | None = None) -> str:
    """`thunder_dra_<component>_<name>[_<unit>]`, checked."""
    if component not in COMPONENTS:
        raise ValueError(f"metric component {component!r} is not one of {', '.join(COMPONENTS)}")
    if not _PART.match(name):
        raise ValueError(f"metric name {name!r} is not snake case")
    if name.endswith("_total"):
        raise ValueError(f"metric name {name!r}: counters get _total on exposition")
    if unit is not None and unit not in UNITS:
        raise ValueError(f"metric unit {unit!r} is not one of {', '.join(UNITS)}")
    parts = [PREFIX, component, name] + ([unit] if unit else [])
    return "_".join(parts)


class Metrics:
    """Builds the families of one component in one registry, under the naming scheme."""

    def __init__(self, registry: CollectorRegistry, component: str) -> None:
        metric_name(component, "check")
        self.registry = registry
        self.component = component

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(
            metric_name(self.component, name),
            documentation,
            list(labels),
            registry=self.registry,
        )

    def gauge(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        unit: str | None = None,
    ) -> Gauge:
        return Gauge(
            metric_name(self.component, name, unit),
            documentation,
            list(labels),
            registry=self.registry,
        )

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        unit: str = "seconds",
    ) -> Histogram:
        return Histogram(
            metric_name(self.component, name, unit),
            documentation,
            list(labels),
            buckets=tuple(buckets),
            registry=self.registry,
        )


def process_registry(*, process: bool = True) -> CollectorRegistry:
    """A fresh registry, with the `process_*` and `python_*` collectors unless `process=False`."""
    registry = CollectorRegistry()
    if process:
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in the Prometheus text format, and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def family_names(registry: CollectorRegistry) -> list[str]:
    """The names of the families in `registry` (without `_total` and friends)."""
    return sorted({family.name for family in registry.collect()})

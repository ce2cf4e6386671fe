"""One metric naming scheme: every family both processes serve follows it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram

import thunder_dra
from thunder_dra.controllers.shared.metrics import OperatorMetrics
from thunder_dra.plugin.metrics import DaemonMetrics
from thunder_dra.process.metrics import (
    NAME_PATTERN,
    Metrics,
    exposition,
    family_names,
    metric_name,
    process_registry,
)
from thunder_dra.thunder import metrics_for


def served_by_the_operator() -> CollectorRegistry:
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    metrics_for(registry)
    return registry


def served_by_the_daemon() -> CollectorRegistry:
    return DaemonMetrics(CollectorRegistry()).registry


@pytest.mark.parametrize("served", [served_by_the_operator, served_by_the_daemon])
def test_every_family_follows_the_scheme(served: Callable[[], CollectorRegistry]) -> None:
    registry = served()
    names = family_names(registry)
    assert names
    assert [name for name in names if not NAME_PATTERN.match(name)] == []
    for family in registry.collect():
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name


# A family made straight from the Prometheus client, wherever it is defined.
_FAMILY_CALL = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"([^\"]+)\"")


def test_families_defined_anywhere_in_the_package_follow_the_scheme() -> None:
    package = Path(thunder_dra.__file__).parent
    found = {
        (path.relative_to(package).as_posix(), match.group(2))
        for path in package.rglob("*.py")
        for match in _FAMILY_CALL.finditer(path.read_text())
    }
    assert ("thunder/telemetry.py", "thunder_dra_thunder_api_requests") in found
    assert [(where, name) for where, name in found if not NAME_PATTERN.match(name)] == []


def test_each_process_keeps_to_its_component() -> None:
    operator = {n for n in family_names(served_by_the_operator()) if "_thunder_api_" not in n}
    daemon = {n for n in family_names(served_by_the_daemon()) if "_thunder_api_" not in n}
    assert all(name.startswith("thunder_dra_operator_") for name in operator)
    assert all(name.startswith("thunder_dra_daemon_") for name in daemon)


def test_names_are_built_and_checked() -> None:
    assert metric_name("daemon", "prepare_duration", "seconds") == (
        "thunder_dra_daemon_prepare_duration_seconds"
    )
    assert metric_name("operator", "pools") == "thunder_dra_operator_pools"
    with pytest.raises(ValueError, match="'webhook' is not one of operator, daemon"):
        metric_name("webhook", "calls")
    with pytest.raises(ValueError, match="'Prepare-Claims' is not snake case"):
        metric_name("daemon", "Prepare-Claims")
    with pytest.raises(ValueError, match="counters get _total"):
        metric_name("daemon", "prepares_total")
    with pytest.raises(ValueError, match="unit 'ms' is not one of seconds, bytes"):
        metric_name("daemon", "latency", "ms")


def test_the_factory_names_families_and_exposes_them() -> None:
    registry = process_registry()
    family = Metrics(registry, "operator")
    family.counter("leader_changes", "Leadership changes.").inc()
    lag = family.histogram("lease_renew", "Renew time.", buckets=(0.1, 1.0))
    assert isinstance(lag, Histogram)
    family.gauge("cache_size", "Cache size.", unit="bytes").set(3)
    body, content_type = exposition(registry)
    text = body.decode()
    assert "thunder_dra_operator_leader_changes_total 1.0" in text
    assert "thunder_dra_operator_lease_renew_seconds_bucket" in text
    assert "thunder_dra_operator_cache_size_bytes 3.0" in text
    assert "process_resident_memory_bytes" in text
    assert content_type.startswith("text/plain")
    assert (
        "process_resident_memory_bytes"
        not in exposition(process_registry(process=False))[0].decode()
    )

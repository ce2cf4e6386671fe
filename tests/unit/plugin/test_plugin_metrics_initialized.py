"""The daemon's labelled counters exist at 0 from the start, for every value it counts with.

A labelled counter is only exposed once a label value is used; until then a rate, an
alert or a dashboard panel over it has no data, which reads as "not scraped" rather than
"nothing failed". `DaemonMetrics` creates every series of its fixed label sets at start.
These tests check that the sets hold every value the daemon's code counts with: the
enums, the module constants, and each literal passed to `.labels(...)` in the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import CollectorRegistry

from thunder_dra.plugin import metrics
from thunder_dra.plugin.claims.recovery import SWEEP_OPERATION
from thunder_dra.plugin.claims.rollback import Outcome
from thunder_dra.plugin.metrics import DaemonMetrics, ErrorReason
from thunder_dra.plugin.node.enrollment import LOOP_NAME

PLUGIN = Path(metrics.__file__).parent
# The attribute each family has on DaemonMetrics, and the allowed values of its labels.
FIXED: dict[str, list[tuple[str, ...]]] = {
    "prepares": [metrics.RESULTS],
    "unprepares": [metrics.RESULTS],
    "errors": [metrics.OPERATIONS, tuple(r.value for r in ErrorReason)],
    "thunderd_restarts": [metrics.RESTART_RESULTS],
    "rollbacks": [metrics.ROLLBACK_OUTCOMES],
    "loop_errors": [metrics.LOOPS],
}


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == name
    }


def test_every_series_of_the_fixed_label_sets_is_exposed_at_zero() -> None:
    registry = CollectorRegistry()
    DaemonMetrics(registry)
    errors = _samples(registry, "thunder_dra_daemon_errors_total")
    assert len(errors) == len(metrics.OPERATIONS) * len(ErrorReason)
    assert set(errors.values()) == {0.0}
    prepares = _samples(registry, "thunder_dra_daemon_prepare_claims_total")
    assert prepares == {(("result", "error"),): 0.0, (("result", "success"),): 0.0}
    rollbacks = _samples(registry, "thunder_dra_daemon_journal_rollbacks_total")
    assert {dict(k)["outcome"] for k in rollbacks} == set(metrics.ROLLBACK_OUTCOMES)
    loops = _samples(registry, "thunder_dra_daemon_loop_errors_total")
    assert loops == {(("loop", "node-enrollment"),): 0.0}


def test_the_named_values_the_daemon_counts_with_are_in_the_sets() -> None:
    assert {o.value for o in Outcome} == set(metrics.ROLLBACK_OUTCOMES)
    assert SWEEP_OPERATION in metrics.OPERATIONS
    assert LOOP_NAME in metrics.LOOPS


def _literal_label_calls() -> list[tuple[str, int, str, list[str]]]:
    """(file, line, family attribute, literal label values) of each `.labels(...)` call
    on a DaemonMetrics family in the package."""
    found = []
    for path in sorted(PLUGIN.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "labels" or not isinstance(node.func.value, ast.Attribute):
                continue
            family = node.func.value.attr
            if family not in FIXED:
                continue
            values = [
                a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else ""
                for a in node.args
            ]
            found.append((path.name, node.lineno, family, values))
    return found


def test_every_literal_label_value_in_the_package_is_in_its_set() -> None:
    calls = _literal_label_calls()
    assert any(family == "errors" for _, _, family, _ in calls), "the scan found nothing"
    for file, line, family, values in calls:
        for value, allowed in zip(values, FIXED[family], strict=False):
            if value:  # a literal; variables are the enums checked above
                assert value in allowed, f"{file}:{line} counts {family} with {value!r}"

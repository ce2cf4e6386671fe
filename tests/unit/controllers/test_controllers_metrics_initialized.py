"""The operator's Client reaper counter exists at 0 from the start, for every result.

`clients_reaped` is counted with a fixed set of results; `OperatorMetrics` creates each
series at start so that a rate or a dashboard panel over it has data before the first
orphan. The reaper's `.labels(...)` literals must all be in that set.
"""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client import CollectorRegistry

from thunder_dra.controllers import reaper
from thunder_dra.controllers.shared.metrics import REAPED_RESULTS, OperatorMetrics


def test_every_reaper_result_is_exposed_at_zero() -> None:
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    samples = {
        s.labels["result"]: s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == "thunder_dra_operator_clients_reaped_total"
    }
    assert samples == dict.fromkeys(REAPED_RESULTS, 0.0)


def test_the_reaper_counts_only_with_those_results() -> None:
    tree = ast.parse(Path(reaper.__file__).read_text())
    used = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "labels"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "clients_reaped"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }
    assert used == set(REAPED_RESULTS)

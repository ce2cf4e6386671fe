"""The real operator writes the shared log schema, names its traces from
OTEL_SERVICE_NAME, answers the shared probes, serves a /metrics that
`promtool check metrics` passes and logs no credential."""

from __future__ import annotations

import urllib.request

from hack.testbed.operator import API_TOKEN, OperatorEnv
from tests.support.promtool import metrics_problems

SERVICE = "thunder-operator-under-test"


def probe(env: OperatorEnv, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{env.operator.health_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return int(response.status), response.read().decode()


def test_logs_spans_and_probes_of_a_pass(env: OperatorEnv) -> None:
    env.operator.environment = {
        "OTEL_SDK_DISABLED": "false",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": SERVICE,
    }
    try:
        env.operator.restart()
        env.sync()
        assert probe(env, "/healthz") == (200, "ok\n")
        assert probe(env, "/readyz") == (200, "ok\n")
        # The real exposition, after a pass, passes promtool's lint.
        exposition = env.operator.metrics_text()
        assert "thunder_dra_operator_inventory_passes_total" in exposition
        assert metrics_problems(exposition) == ""
        env.operator.stop()  # flushes the spans still waiting for export
        text = env.operator.log_text()
        records = env.operator.log_records()
    finally:
        env.operator.environment = {}
        env.operator.restart()

    assert records
    for record in records:
        assert list(record)[:4] == ["time", "level", "logger", "message"], record
    assert f'"service.name": "{SERVICE}"' in text
    assert '"name": "thunder.reconcile"' in text
    assert API_TOKEN not in text

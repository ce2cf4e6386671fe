"""The real daemon writes the shared log schema, names its traces from OTEL_SERVICE_NAME,
joins its log lines to their spans, answers the shared probes, serves a /metrics that
`promtool check metrics` passes and logs no credential."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import NodeHarness, Workloads, ZonePool, secrets_of
from hack.testbed.kube import Kube
from tests.support.promtool import metrics_problems

SERVICE = "gpu-node-agent-under-test"


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.environment = {
            "OTEL_TRACES_EXPORTER": "console",
            "OTEL_SERVICE_NAME": SERVICE,
        }
        harness.daemon.start().wait_serving()
        harness.kubelet.wait_registered("thundercompute.com")
        yield harness


def test_logs_spans_and_probes_of_a_prepared_claim(
    kube: Kube, fake: FakeThunderProcess, node: NodeHarness, namespace: str, pool: ZonePool
) -> None:
    pods = Workloads(kube, namespace, pool)
    assert node.daemon.http("/healthz") == (200, "ok\n")
    assert node.daemon.http("/readyz") == (200, "ok\n")
    name, _ = pods.create(node, count=1)
    pod = pods.wait_running(node, name)
    pods.delete(name)
    pods.wait_gone(node, name)
    secrets = secrets_of(fake)
    # The real exposition, after a prepare and an unprepare, passes promtool's lint.
    status, exposition = node.daemon.http("/metrics")
    assert status == 200, exposition
    assert "thunder_dra_daemon_prepare_claims_total" in exposition
    assert metrics_problems(exposition) == ""
    node.daemon.stop()  # flushes the spans still waiting for export

    records = node.daemon.log_records()
    assert records
    # The process runs on uvloop's event loop (docs/daemon.md, "Start-up").
    ready = [r for r in records if r["message"] == "daemon ready to serve"]
    assert [r.get("event_loop") for r in ready] == ["uvloop"], ready
    for record in records:
        assert list(record)[:4] == ["time", "level", "logger", "message"], record
        assert "msg" not in record
    claim_lines = [r for r in records if r.get("claim_uid") == pod.claim_uid and "trace_id" in r]
    assert claim_lines, "no log line of the claim carries its trace"

    text = node.daemon.log_text()
    assert f'"service.name": "{SERVICE}"' in text
    assert '"name": "thunder_dra.prepare"' in text
    exported = set(re.findall(r'"trace_id": "0x([0-9a-f]{32})"', text))
    assert {r["trace_id"] for r in claim_lines} <= exported
    for secret in secrets:
        assert secret not in text, "a credential reached the daemon's log"

"""The real operator exports its traces over OTLP/gRPC (the chart's default protocol) to
an OTLP receiver: an inventory pass arrives as one trace, from the reconcile cycle down to
the Thunder client's requests and the Kubernetes API requests, and no span carries the
Thunder API token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hack.otlp_receiver import OtlpReceiver, ReceivedSpan, tree
from hack.testbed.operator import API_TOKEN, OperatorEnv

SERVICE = "thunder-operator"  # the default: OTEL_SERVICE_NAME is not set
READS = (
    "GET /api/v1/zones",
    "GET /api/v1/hosts",
    "GET /api/v1/clients",
    "GET /api/v1/zones/{zoneId}/oversubscription-targets",
)


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


def _pass_traces(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    """The traces holding a finished inventory pass, with every span of each."""
    ids = {s.trace_id for s in spans if s.name == "thunder.inventory_pass"}
    return {i: [s for s in spans if s.trace_id == i] for i in ids}


def _complete(trace: list[ReceivedSpan]) -> bool:
    names = {s.name for s in trace}
    return {"thunder.reconcile", "thunder.inventory_pass", *READS} <= names


def test_an_inventory_pass_arrives_as_one_trace_over_otlp_grpc(
    env: OperatorEnv, receiver: OtlpReceiver
) -> None:
    env.add_zone(env.zone("traced"), [("A6000", 4)])
    env.operator.environment = {
        "OTEL_SDK_DISABLED": "false",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
        # Batches leave every 200 ms instead of 5 s; no test waits on the default.
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    env.operator.restart()
    env.sync()
    spans = receiver.wait_for(
        lambda got: any(_complete(t) for t in _pass_traces(got).values()), timeout=60
    )
    trace = next(t for t in _pass_traces(spans).values() if _complete(t))
    by_id = {s.span_id: s for s in trace}
    print("\none inventory pass:\n" + "\n".join(tree(trace)))

    assert {s.transport for s in spans} == {"grpc"}
    assert {s.service_name for s in spans} == {SERVICE}
    [root] = [s for s in trace if s.parent_id is None]
    assert root.name == "thunder.reconcile"
    assert root.attributes["thunder.cluster"] == env.name
    [inventory_pass] = [s for s in trace if s.name == "thunder.inventory_pass"]
    assert inventory_pass.parent_id == root.span_id
    assert inventory_pass.attributes["thunder.result"] in ("synced", "unchanged")
    [read] = [s for s in trace if s.name == "thunder.read_inventory"]
    assert read.parent_id == inventory_pass.span_id
    requests = [s for s in trace if s.kind == "CLIENT" and "thunder.endpoint" in s.attributes]
    assert {s.name for s in requests} == set(READS)
    # The pass's Kubernetes requests are client spans of the same trace, by resource.
    kube = [s for s in trace if s.kind == "CLIENT" and "k8s.resource" in s.attributes]
    assert "resourceslices" in {s.attributes["k8s.resource"] for s in kube}, tree(trace)
    for request in kube:
        method, template = (
            request.attributes["http.request.method"],
            request.attributes["url.template"],
        )
        assert str(template).startswith("/api"), request.name
        assert request.name == f"{method!s} kube:{template!s}"

    for request in requests:
        # Beneath the Thunder read (every client span's ancestors are in this trace).
        ancestors = []
        parent = by_id.get(request.parent_id or "")
        while parent is not None:
            ancestors.append(parent.name)
            parent = by_id.get(parent.parent_id or "")
        assert "thunder.read_inventory" in ancestors, (request.name, ancestors)
        assert request.attributes["http.response.status_code"] == 200

    for span in spans:
        for text in span.texts():
            assert API_TOKEN not in text, f"the API token is in span {span.name}"

"""The real daemon exports its traces over OTLP/HTTP (protobuf) to an OTLP receiver: one
NodePrepareResources call through the kubelet-plugin socket is one trace, from the server
span of the call through the claim's prepare to the Thunder mint and exchange and the
journal, config.json, CDI spec and checkpoint writes; the unprepare likewise; and no span
carries a credential (the API token, an enrollment token, a client's auth token)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.otlp_receiver import OtlpReceiver, ReceivedSpan, tree
from hack.testbed.daemon import (
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
    secrets_of,
)
from hack.testbed.kube import Kube
from thunder_dra.plugin.files.clientconfig import CONFIG_FILE_NAME

SERVICE = "thunder-dra-daemon"  # the default: OTEL_SERVICE_NAME is not set
MINT = "POST /api/v1/enrollment-tokens"
EXCHANGE = "POST /api/v1/enrollment-tokens/enroll"
REVOKE = "POST /api/v1/clients/{clientId}/revoke"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


def _exporting(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, protocol: str, endpoint: str
) -> NodeHarness:
    harness = NodeHarness(kube, fake, zone=pool.zone)
    harness.daemon.environment = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        # Batches leave every 200 ms instead of 5 s; no test waits on the default.
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    return harness


@pytest.fixture(scope="module")
def node(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, receiver: OtlpReceiver
) -> Iterator[NodeHarness]:
    with _exporting(kube, fake, pool, "http/protobuf", receiver.http_endpoint) as harness:
        harness.daemon.start().wait_serving()
        yield harness


def _call_trace(spans: list[ReceivedSpan], method: str, claim_uid: str) -> list[ReceivedSpan]:
    """The trace of the ``method`` call that worked on ``claim_uid`` (empty: none yet)."""
    for call in spans:
        if call.name != f"DRAPlugin/{method}":
            continue
        trace = [s for s in spans if s.trace_id == call.trace_id]
        if any(s.attributes.get("k8s.resourceclaim.uid") == claim_uid for s in trace):
            return trace
    return []


def _one(trace: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in trace if s.name == name]
    assert len(found) == 1, (name, tree(trace))
    return found[0]


def _children(trace: list[ReceivedSpan], parent: ReceivedSpan) -> list[str]:
    return [
        s.name for s in sorted(trace, key=lambda s: s.start_ns) if s.parent_id == parent.span_id
    ]


def test_one_prepare_is_one_trace_and_no_span_carries_a_credential(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    namespace: str,
    node: NodeHarness,
    receiver: OtlpReceiver,
) -> None:
    [claim] = allocated_claims(kube, namespace, pool, 1, prefix="traced")
    answers = dra_prepare(node.daemon, [claim])
    assert answers[claim.uid].error == ""

    complete = {MINT, EXCHANGE, "thunder_dra.checkpoint.write", "thunder_dra.journal.close"}
    spans = receiver.wait_for(
        lambda got: (
            complete <= {s.name for s in _call_trace(got, "NodePrepareResources", claim.uid)}
        ),
        timeout=60,
    )
    trace = _call_trace(spans, "NodePrepareResources", claim.uid)
    print("\none prepare:\n" + "\n".join(tree(trace, timed=True)))

    assert {s.transport for s in spans} == {"http"}
    assert {s.service_name for s in spans} == {SERVICE}
    # The kubelet's call is the root, the claim's prepare its one child, and everything
    # the prepare did (Thunder requests, file writes) lies beneath the prepare.
    [call] = [s for s in trace if s.parent_id is None]
    assert call.name == "DRAPlugin/NodePrepareResources"
    assert call.kind == "SERVER"
    assert call.attributes["rpc.method"] == "NodePrepareResources"
    assert call.attributes["thunder_dra.claims"] == 1
    prepare = _one(trace, "thunder_dra.prepare")
    assert prepare.parent_id == call.span_id
    assert prepare.attributes["k8s.resourceclaim.uid"] == claim.uid
    assert prepare.attributes["k8s.namespace.name"] == namespace
    assert prepare.status_code != "ERROR"
    assert {s.parent_id for s in trace if s is not call and s is not prepare} == {prepare.span_id}

    mint, exchange = _one(trace, MINT), _one(trace, EXCHANGE)
    for request in (mint, exchange):
        assert request.kind == "CLIENT"
        assert request.attributes["http.request.method"] == "POST"
        assert request.attributes["http.response.status_code"] == 200
    config = _one(trace, "thunder_dra.client_config.write")
    assert str(config.attributes["file.path"]).endswith(f"{claim.uid}/{CONFIG_FILE_NAME}")
    cdi = _one(trace, "thunder_dra.cdi_spec.write")
    assert str(cdi.attributes["file.path"]).startswith(str(node.daemon.cdi_dir))
    # The order of a prepare (docs/daemon.md): journal, mint, token ID journaled,
    # exchange, client ID journaled, config.json, CDI spec, checkpoint, journal closed.
    steps = [
        name
        for name in _children(trace, prepare)
        if name.startswith("thunder_dra.") or name in (MINT, EXCHANGE)
    ]
    assert steps == [
        "thunder_dra.journal.begin",
        MINT,
        "thunder_dra.journal.record",
        EXCHANGE,
        "thunder_dra.journal.record",
        "thunder_dra.client_config.write",
        "thunder_dra.cdi_spec.write",
        "thunder_dra.checkpoint.write",
        "thunder_dra.journal.close",
    ]
    records = [s for s in trace if s.name == "thunder_dra.journal.record"]
    assert [r.attributes["thunder_dra.journal.fields"] for r in records] == [
        ["enrollment_token_id"],
        ["client_id"],
    ]

    answers = dra_unprepare(node.daemon, [claim])
    assert answers[claim.uid].error == ""
    spans = receiver.wait_for(
        lambda got: (
            REVOKE in {s.name for s in _call_trace(got, "NodeUnprepareResources", claim.uid)}
        ),
        timeout=60,
    )
    undone = _call_trace(spans, "NodeUnprepareResources", claim.uid)
    print("one unprepare:\n" + "\n".join(tree(undone, timed=True)))
    [call] = [s for s in undone if s.parent_id is None]
    unprepare = _one(undone, "thunder_dra.unprepare")
    assert unprepare.parent_id == call.span_id
    assert _one(undone, REVOKE).parent_id == unprepare.span_id
    # The files go while Thunder revokes, each removal a span of its own.
    spec_removed = _one(undone, "thunder_dra.cdi_spec.remove")
    assert spec_removed.parent_id == unprepare.span_id
    assert str(spec_removed.attributes["file.path"]).startswith(str(node.daemon.cdi_dir))
    dir_removed = _one(undone, "thunder_dra.claim_dir.remove")
    assert dir_removed.parent_id == unprepare.span_id
    assert str(dir_removed.attributes["file.path"]).endswith(claim.uid)
    assert undone[0].trace_id != trace[0].trace_id
    # The work after the answer, the Client record's removal, is in the same trace,
    # beneath the call (whose span had ended by then).
    spans = receiver.wait_for(
        lambda got: any(
            s.name.startswith("DELETE kube:") and s.name.endswith("/clients/{name}")
            for s in _call_trace(got, "NodeUnprepareResources", claim.uid)
        ),
        timeout=60,
    )
    undone = _call_trace(spans, "NodeUnprepareResources", claim.uid)
    [removal] = [
        s
        for s in undone
        if s.name.startswith("DELETE kube:") and s.name.endswith("/clients/{name}")
    ]
    assert removal.parent_id == call.span_id, tree(undone)

    node.daemon.stop()  # flushes what is still waiting for export
    secrets = secrets_of(fake)
    state = fake.admin.state()
    minted = [t["enrollmentToken"] for t in state.get("enrollmentTokens", [])]
    issued = [c["authToken"] for c in state.get("clients", []) if c.get("authToken")]
    assert minted, "the fake issued no enrollment token: nothing to look for"
    assert issued, "the fake issued no client auth token: nothing to look for"
    every_span = receiver.spans()
    for span in every_span:
        for text in span.texts():
            leaked = [secret for secret in secrets if secret in text]
            assert not leaked, f"a credential is in span {span.name}: {text!r}"


def test_the_daemon_exports_over_otlp_grpc_too(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, namespace: str
) -> None:
    """The protocol the chart sets by default, in the process that serves the kubelet
    with gRPC itself."""
    with (
        OtlpReceiver() as receiver,
        _exporting(kube, fake, pool, "grpc", receiver.grpc_endpoint) as harness,
    ):
        harness.daemon.start().wait_serving()
        [claim] = allocated_claims(kube, namespace, pool, 1, prefix="grpc")
        assert dra_prepare(harness.daemon, [claim])[claim.uid].error == ""
        spans = receiver.wait_for(
            lambda got: (
                MINT in {s.name for s in _call_trace(got, "NodePrepareResources", claim.uid)}
            ),
            timeout=60,
        )
        assert dra_unprepare(harness.daemon, [claim])[claim.uid].error == ""
    trace = _call_trace(spans, "NodePrepareResources", claim.uid)
    assert {s.transport for s in trace} == {"grpc"}
    [call] = [s for s in trace if s.parent_id is None]
    assert call.name == "DRAPlugin/NodePrepareResources"
    assert _one(trace, "thunder_dra.prepare").parent_id == call.span_id

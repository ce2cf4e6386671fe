"""hack.otlp_receiver against the real OTLP exporters: spans sent over gRPC and over
HTTP/protobuf (plain and gzip) arrive decoded, with their resource, IDs, parent, kind,
attributes, events and status; a body that is not OTLP protobuf is refused."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from hack.otlp_receiver import OtlpReceiver, ReceivedSpan, tree


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


def _export(exporter: SpanExporter, service: str) -> tuple[str, str, str]:
    """One trace of a server span with a client child; the IDs (trace, parent, child)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("receiver-test")
    with (
        tracer.start_as_current_span(
            "DRAPlugin/NodePrepareResources", kind=SpanKind.SERVER, attributes={"claims": 1}
        ) as parent,
        tracer.start_as_current_span(
            "POST /api/v1/enrollment-tokens",
            kind=SpanKind.CLIENT,
            attributes={"http.response.status_code": 201, "tags": ["a", "b"], "ok": True},
        ) as child,
    ):
        child.add_event("retry", {"reason": "429"})
        child.set_status(Status(StatusCode.ERROR, "too many requests"))
    provider.shutdown()
    return (
        format(parent.get_span_context().trace_id, "032x"),
        format(parent.get_span_context().span_id, "016x"),
        format(child.get_span_context().span_id, "016x"),
    )


def _check(spans: list[ReceivedSpan], ids: tuple[str, str, str], service: str) -> None:
    trace_id, parent_id, child_id = ids
    by_name = {s.name: s for s in spans}
    parent = by_name["DRAPlugin/NodePrepareResources"]
    child = by_name["POST /api/v1/enrollment-tokens"]
    assert (parent.trace_id, parent.span_id, parent.parent_id) == (trace_id, parent_id, None)
    assert (child.trace_id, child.span_id, child.parent_id) == (trace_id, child_id, parent_id)
    assert parent.service_name == child.service_name == service
    assert parent.resource["service.name"] == service
    assert (parent.kind, child.kind) == ("SERVER", "CLIENT")
    assert parent.attributes == {"claims": 1}
    assert child.attributes == {"http.response.status_code": 201, "tags": ["a", "b"], "ok": True}
    assert [(e.name, dict(e.attributes)) for e in child.events] == [("retry", {"reason": "429"})]
    assert (child.status_code, child.status_message) == ("ERROR", "too many requests")
    assert parent.status_code == "UNSET"
    assert parent.scope == "receiver-test"
    assert parent.start_ns <= child.start_ns <= child.end_ns <= parent.end_ns
    assert tree(spans) == [
        "DRAPlugin/NodePrepareResources [SERVER]",
        "  POST /api/v1/enrollment-tokens [CLIENT]",
    ]
    timed = tree(spans, timed=True)
    offset = (child.start_ns - parent.start_ns) / 1e6
    assert timed[0] == (
        f"DRAPlugin/NodePrepareResources [SERVER] at 0.0 ms, "
        f"{(parent.end_ns - parent.start_ns) / 1e6:.1f} ms"
    )
    assert timed[1] == (
        f"  POST /api/v1/enrollment-tokens [CLIENT] at {offset:.1f} ms, "
        f"{(child.end_ns - child.start_ns) / 1e6:.1f} ms"
    )
    assert "too many requests" in set(child.texts())
    assert "reason" in set(child.texts())


def test_spans_exported_over_grpc_arrive_decoded(receiver: OtlpReceiver) -> None:
    ids = _export(GrpcSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True), "over-grpc")
    spans = receiver.wait_for(lambda got: len(got) == 2, timeout=30)
    assert {s.transport for s in spans} == {"grpc"}
    _check(spans, ids, "over-grpc")


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_exported_over_http_protobuf_arrive_decoded(
    receiver: OtlpReceiver, compression: Compression
) -> None:
    exporter = HttpSpanExporter(endpoint=receiver.http_traces_url, compression=compression)
    ids = _export(exporter, "over-http")
    spans = receiver.wait_for(lambda got: len(got) == 2, timeout=30)
    assert {s.transport for s in spans} == {"http"}
    _check(spans, ids, "over-http")
    assert receiver.trace(ids[0]) == spans
    receiver.clear()
    assert receiver.spans() == []


def test_a_body_that_is_not_otlp_protobuf_is_refused(receiver: OtlpReceiver) -> None:
    def post(path: str, media: str, body: bytes) -> int:
        request = urllib.request.Request(
            receiver.http_endpoint + path, data=body, headers={"Content-Type": media}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as err:
            return err.code

    assert post("/v1/traces", "application/json", b"{}") == 415
    assert post("/v1/metrics", "application/x-protobuf", b"") == 404
    assert post("/v1/traces", "application/x-protobuf", b"\xff\xff\xff") == 400
    assert post("/v1/traces", "application/x-protobuf", b"") == 200  # an empty request
    assert receiver.spans() == []


def test_wait_for_names_what_arrived_when_the_predicate_never_holds(
    receiver: OtlpReceiver,
) -> None:
    _export(HttpSpanExporter(endpoint=receiver.http_traces_url), "named")
    receiver.wait_for(lambda got: len(got) == 2, timeout=30)
    with pytest.raises(AssertionError, match="POST /api/v1/enrollment-tokens"):
        receiver.wait_for(lambda got: False, timeout=0.2)


def test_the_host_is_the_callers_and_the_ports_are_free_ones() -> None:
    with OtlpReceiver("127.0.0.2") as first, OtlpReceiver("127.0.0.2") as second:
        assert first.grpc_endpoint.startswith("http://127.0.0.2:")
        assert first.http_endpoint.startswith("http://127.0.0.2:")
        ports = {first.grpc_port, first.http_port, second.grpc_port, second.http_port}
        assert len(ports) == 4
        assert 0 not in ports
        _export(GrpcSpanExporter(endpoint=second.grpc_endpoint, insecure=True), "second")
        assert {s.service_name for s in second.wait_for(lambda got: len(got) == 2)} == {"second"}
        assert first.spans() == []

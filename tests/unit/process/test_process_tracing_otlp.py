"""OTEL_TRACES_EXPORTER=otlp exports, over either protocol, to a real OTLP receiver: the
exporters are dependencies, so the processes' tracing set-up finds them."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from hack.otlp_receiver import OtlpReceiver
from thunder_dra.process.tracing import DAEMON_SERVICE, OPERATOR_SERVICE, configure_tracing

OTEL_VARIABLES = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


@pytest.mark.parametrize(
    ("protocol", "variable", "transport"),
    [
        ("grpc", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL", "http"),
        ("grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        (None, None, "http"),  # the default protocol
    ],
)
def test_otlp_reaches_the_receiver_over_the_protocol_asked_for(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    receiver: OtlpReceiver,
    protocol: str | None,
    variable: str | None,
    transport: str,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    if protocol is not None and variable is not None:
        monkeypatch.setenv(variable, protocol)
    endpoint = receiver.grpc_endpoint if transport == "grpc" else receiver.http_endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    with caplog.at_level(logging.WARNING, logger="thunder_dra.process.tracing"):
        provider = configure_tracing(DAEMON_SERVICE, install_global=False)
    assert caplog.records == []
    with provider.get_tracer("test").start_as_current_span("thunder_dra.prepare") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()  # flushes the batch
    [received] = receiver.wait_for(lambda got: len(got) == 1, timeout=30)
    assert (received.name, received.trace_id) == ("thunder_dra.prepare", trace_id)
    assert received.transport == transport
    assert received.service_name == DAEMON_SERVICE


def test_otlp_and_console_together(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    receiver: OtlpReceiver,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.grpc_endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "operator-under-test")
    provider = configure_tracing(OPERATOR_SERVICE, install_global=False)
    with provider.get_tracer("test").start_as_current_span("thunder.reconcile"):
        pass
    provider.shutdown()
    [received] = receiver.wait_for(lambda got: len(got) == 1, timeout=30)
    assert (received.name, received.service_name) == ("thunder.reconcile", "operator-under-test")
    assert '"name": "thunder.reconcile"' in capsys.readouterr().err

"""Tracing set-up from the standard OTEL_* variables, the same for both processes."""

from __future__ import annotations

import json
import logging

import pytest

from thunder_dra.process.tracing import DAEMON_SERVICE, OPERATOR_SERVICE, configure_tracing

OTEL_VARIABLES = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("default", [OPERATOR_SERVICE, DAEMON_SERVICE])
def test_the_default_service_name_is_the_process_s_own(default: str) -> None:
    provider = configure_tracing(default, install_global=False)
    assert provider.resource.attributes["service.name"] == default
    assert provider.resource.attributes["service.version"]


@pytest.mark.parametrize("default", [OPERATOR_SERVICE, DAEMON_SERVICE])
def test_otel_service_name_wins(default: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gpu-node-agent")
    provider = configure_tracing(default, install_global=False)
    assert provider.resource.attributes["service.name"] == "gpu-node-agent"


def test_resource_attributes_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,deployment.environment=prod"
    )
    attributes = configure_tracing(DAEMON_SERVICE, install_global=False).resource.attributes
    assert attributes["service.name"] == "from-attributes"
    assert attributes["deployment.environment"] == "prod"


def test_spans_are_exported_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    provider = configure_tracing(DAEMON_SERVICE, install_global=False)
    with provider.get_tracer("test").start_as_current_span("quiet") as span:
        assert span.get_span_context().is_valid  # made, so logs can carry its ids
        assert not span.is_recording()  # nobody reads it: nothing recorded
        with provider.get_tracer("test").start_as_current_span("child") as child:
            assert child.get_span_context().trace_id == span.get_span_context().trace_id
    provider.shutdown()
    assert capsys.readouterr().err == ""

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "named")
    provider = configure_tracing(DAEMON_SERVICE, install_global=False)
    with provider.get_tracer("test").start_as_current_span("thunder_dra.prepare"):
        pass
    provider.shutdown()
    exported = json.loads(capsys.readouterr().err)
    assert exported["name"] == "thunder_dra.prepare"
    assert exported["resource"]["attributes"]["service.name"] == "named"


def test_sdk_disabled_makes_no_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    provider = configure_tracing(OPERATOR_SERVICE, install_global=False)
    with provider.get_tracer("test").start_as_current_span("nothing") as span:
        assert not span.is_recording()
    provider.shutdown()


def test_unknown_or_missing_exporters_are_named_in_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "jaeger,otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with caplog.at_level(logging.WARNING, logger="thunder_dra.process.tracing"):
        configure_tracing(OPERATOR_SERVICE, install_global=False).shutdown()
    by_message = {record.getMessage(): record for record in caplog.records}
    assert by_message["unknown OTEL_TRACES_EXPORTER entry, ignored"].exporter == "jaeger"  # type: ignore[attr-defined]
    assert (
        by_message["unknown OTLP protocol, spans are not exported over OTLP"].protocol  # type: ignore[attr-defined]
        == "carrier-pigeon"
    )


def test_a_sampler_set_by_the_user_is_honoured_without_an_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    provider = configure_tracing(DAEMON_SERVICE, install_global=False)
    with provider.get_tracer("test").start_as_current_span("kept") as span:
        assert span.is_recording()
    provider.shutdown()

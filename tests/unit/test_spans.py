"""Step spans: none of their own inside a span that is not recorded, as before elsewhere."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler

from thunder_dra.spans import step_span


def _provider(sampler: Sampler) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_inside_an_unrecorded_span_a_step_is_the_enclosing_span() -> None:
    provider, exporter = _provider(ALWAYS_OFF)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("call") as call:
        assert call.get_span_context().is_valid
        assert not call.is_recording()
        with step_span(tracer, "step", attributes={"file.path": "/x"}) as step:
            assert step is call
            assert trace.get_current_span() is call
            step.set_attribute("http.response.status_code", 200)  # a no-op, as on call
        assert trace.get_current_span() is call
    assert exporter.get_finished_spans() == ()


def test_inside_a_recorded_span_a_step_is_a_child_span() -> None:
    provider, exporter = _provider(ALWAYS_ON)
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("call") as call,
        step_span(tracer, "step", attributes={"file.path": "/x"}) as step,
    ):
        assert step is not call
        assert step.is_recording()
    step_span_data, call_data = exporter.get_finished_spans()
    assert step_span_data.name == "step"
    assert step_span_data.attributes == {"file.path": "/x"}
    assert step_span_data.parent is not None
    assert step_span_data.parent.span_id == call_data.context.span_id


def test_after_a_recorded_span_ended_a_step_beneath_it_is_still_a_child_span() -> None:
    # Work after a kubelet call's answer runs in the call's context, its span ended.
    provider, exporter = _provider(ALWAYS_ON)
    tracer = provider.get_tracer("test")
    call = tracer.start_span("call")
    call.end()
    assert not call.is_recording()
    with trace.use_span(call), step_span(tracer, "after the answer") as step:
        assert step is not call
        assert step.is_recording()
    call_data, step_data = exporter.get_finished_spans()
    assert step_data.name == "after the answer"
    assert step_data.parent is not None
    assert step_data.parent.span_id == call_data.context.span_id


@pytest.mark.parametrize("sampler", [ALWAYS_ON, ALWAYS_OFF])
def test_outside_any_span_a_step_starts_its_own_trace(sampler: Sampler) -> None:
    provider, exporter = _provider(sampler)
    tracer = provider.get_tracer("test")
    with step_span(tracer, "sweep step") as step:
        assert step.get_span_context().is_valid
        assert step.is_recording() is (sampler is ALWAYS_ON)
    assert [s.name for s in exporter.get_finished_spans()] == (
        ["sweep step"] if sampler is ALWAYS_ON else []
    )


def test_an_error_inside_a_step_without_a_span_of_its_own_goes_through() -> None:
    provider, _ = _provider(ALWAYS_OFF)
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("call"),
        pytest.raises(OSError, match="disk full"),
        step_span(tracer, "step"),
    ):
        raise OSError("disk full")

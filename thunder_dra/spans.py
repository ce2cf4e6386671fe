"""Spans of the steps beneath a traced unit of work, made only where they can be recorded.

A kubelet call, a claim and a reconcile cycle always get their span: its trace and span
IDs go on every log line written inside it (docs/observability.md). The steps beneath
(a Thunder or Kubernetes request, a journal, checkpoint or file write) are many, about
twenty a claim, and a span costs the event loop CPU even when nothing records it. So a
step inside a span that is not recorded (no exporter, or a trace the sampler left out)
gets no span of its own: :func:`step_span` hands back the enclosing span, and a line
logged inside the step carries its IDs. A span tells by its sampled flag, which an
ended span keeps (work after a kubelet call's answer goes on beneath the call's span).
A step inside a recorded span, or outside any span (work of its own, such as the
journal sweep), gets its span as before.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.util.types import Attributes


class _Within(AbstractContextManager[Span]):
    """The enclosing span, entered and left as a step's would be: nothing changes."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def __enter__(self) -> Span:
        return self._span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


def unrecorded_parent() -> Span | None:
    """The current span when it exists and was not sampled (so nothing beneath it is
    recorded); else None. A span that was sampled counts even once it has ended (work
    after a kubelet call's answer goes on beneath the call's span)."""
    current = trace.get_current_span()
    context = current.get_span_context()
    if not context.is_valid or context.trace_flags.sampled:
        return None
    return current


def step_span(
    tracer: Tracer,
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes = None,
    record_exception: bool = True,
    set_status_on_exception: bool = True,
) -> AbstractContextManager[Span]:
    """``tracer.start_as_current_span(name, ...)`` for a step, unless the enclosing span is
    not recorded: then that span, with no new one."""
    parent = unrecorded_parent()
    if parent is not None:
        return _Within(parent)
    return tracer.start_as_current_span(
        name,
        kind=kind,
        attributes=attributes,
        record_exception=record_exception,
        set_status_on_exception=set_status_on_exception,
    )

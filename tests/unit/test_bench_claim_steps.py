"""The claim-steps benchmark's reading of traces: a call's steps beneath its claim's span,
in the wait or after the answer, repeated steps told apart, the daemon's own time as the
part of the call no step covers (overlapping steps counted once), Kubernetes span names
shortened, other claims' and incomplete traces left out; and its section of
docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bench import claim_steps
from bench.claim_steps import Call, Step, calls_of, every_call_of, render, short_name, table
from bench.docsection import INTRO
from hack.otlp_receiver import ReceivedSpan
from tests.unit.test_bench_kubelet_calls import MACHINE

MS = 1_000_000


def _span(
    name: str,
    start_ms: float,
    end_ms: float,
    *,
    trace: str = "t1",
    span_id: str = "",
    parent: str | None = "claim",
    uid: str = "",
) -> ReceivedSpan:
    return ReceivedSpan(
        transport="grpc",
        service_name="thunder-dra-daemon",
        resource={},
        scope="test",
        trace_id=trace,
        span_id=span_id or name,
        parent_id=parent,
        name=name,
        kind="INTERNAL",
        attributes={"k8s.resourceclaim.uid": uid} if uid else {},
        events=(),
        status_code="UNSET",
        status_message="",
        start_ns=int(start_ms * MS),
        end_ns=int(end_ms * MS),
    )


def _prepare_trace(uid: str, trace: str = "t1", offset: float = 100.0) -> list[ReceivedSpan]:
    def at(name: str, start: float, end: float, **kw: object) -> ReceivedSpan:
        return _span(name, offset + start, offset + end, trace=trace, **kw)  # type: ignore[arg-type]

    return [
        at("DRAPlugin/NodePrepareResources", 0, 10, span_id="root", parent=None),
        at("thunder_dra.prepare", 0.1, 9.9, span_id="claim", parent="root", uid=uid),
        at(
            "GET kube:/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}",
            0.2,
            1.2,
        ),
        at("thunder_dra.journal.record", 2, 3, span_id="r1"),
        at("thunder_dra.journal.record", 4, 5, span_id="r2"),
        # Two steps at once: 5-8 covered once.
        at("POST kube:/apis/thundercompute.com/v1alpha1/namespaces/{namespace}/clients", 5, 8),
        at("thunder_dra.cdi_spec.write", 6, 7),
        at(
            "PATCH kube:/apis/thundercompute.com/v1alpha1/namespaces/{namespace}"
            "/clients/{name}/status",
            60,
            65,
        ),
    ]


def test_a_call_is_its_steps_beneath_the_claim_in_the_wait_and_after_the_answer() -> None:
    [call] = calls_of(_prepare_trace("u1"), {"u1"})
    assert call.kind == "prepare"
    assert call.claim_uid == "u1"
    assert call.duration == pytest.approx(10)
    assert [s.name for s in call.steps] == [
        "GET kube:.../resourceclaims/{name}",
        "thunder_dra.journal.record",
        "thunder_dra.journal.record (2)",
        "POST kube:.../clients",
        "thunder_dra.cdi_spec.write",
        "PATCH kube:.../clients/{name}/status",
    ]
    assert [s.after_answer for s in call.steps] == [False] * 5 + [True]
    assert call.steps[1].start == pytest.approx(2)
    # 10 ms, less 1 + 1 + 1 + 3 covered (the record and the spec overlap): 4 ms.
    assert call.own_time() == pytest.approx(4)


def test_other_claims_and_traces_without_one_call_and_one_claim_are_left_out() -> None:
    spans = [
        *_prepare_trace("u1", "t1"),
        *_prepare_trace("u2", "t2"),
        # A sweep's trace: no call at its root.
        _span("thunder_dra.unprepare", 0, 1, trace="t3", span_id="c3", parent=None, uid="u1"),
    ]
    assert [c.claim_uid for c in calls_of(spans, {"u1"})] == ["u1"]
    assert sorted(c.claim_uid for c in calls_of(spans, {"u1", "u2"})) == ["u1", "u2"]


def test_the_daemons_own_time_is_never_negative_nor_counts_steps_past_the_call() -> None:
    call = Call(
        "unprepare",
        "u",
        5.0,
        (
            Step("a", 0.5, 3.0, after_answer=False),
            Step("b", 1.0, 10.0, after_answer=False),  # ends after the answer (stage work)
            Step("c", 50.0, 5.0, after_answer=True),
        ),
    )
    assert call.own_time() == pytest.approx(0.5)


def test_short_names_drop_group_version_and_namespace_but_keep_the_rest() -> None:
    assert short_name("GET /api/v1/zones") == "GET /api/v1/zones"
    assert short_name("GET kube:/api/v1/namespaces/{namespace}/pods/{name}") == (
        "GET kube:.../pods/{name}"
    )
    assert short_name("GET kube:/apis/resource.k8s.io/v1/resourceslices") == (
        "GET kube:.../resourceslices"
    )
    assert short_name("GET kube:/api/v1/nodes/{name}") == "GET kube:.../nodes/{name}"
    assert short_name("thunder_dra.checkpoint.write") == "thunder_dra.checkpoint.write"


def _rows(calls: Sequence[Call]) -> dict[str, list[str]]:
    """The table's rows by their first cell (backquotes dropped): the other cells."""
    rows = {}
    for row in table(calls)[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_table_orders_steps_by_start_in_the_wait_then_after_the_answer() -> None:
    calls = calls_of([*_prepare_trace("u1", "t1"), *_prepare_trace("u2", "t2", 500)], {"u1", "u2"})
    rows = _rows(calls)
    assert next(iter(rows)) == "the call (server span)"
    assert list(rows)[-2:] == [
        "PATCH kube:.../clients/{name}/status",
        "the daemon's own time in the wait (no step)",
    ]
    assert rows["the call (server span)"] == ["", "2", "0.0", "10.00", "10.00"]
    assert rows["POST kube:.../clients"] == ["in the wait", "2", "5.0", "3.00", "3.00"]
    assert rows["the daemon's own time in the wait (no step)"][-2:] == ["4.00", "4.00"]


def test_the_section_lands_after_the_kubernetes_requests_and_replaces_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        f"{INTRO}\n## Kubernetes requests of a claim\n\nx\n\n## Checkpoint writes\n\ny\n"
    )
    monkeypatch.setattr(claim_steps, "DOC", doc)
    calls = calls_of(_prepare_trace("u1"), {"u1"})
    section = render(
        {1: calls, 20: calls},
        "python -m bench.claim_steps --claims 1 --in-flight 20 --write-docs",
        MACHINE,
        1,
    )
    claim_steps.write_docs(section)
    claim_steps.write_docs(section)
    text = doc.read_text()
    assert text.count(claim_steps.HEADING) == 1
    assert text.index("## Kubernetes requests") < text.index(claim_steps.HEADING)
    assert text.index(claim_steps.HEADING) < text.index("## Checkpoint writes")
    for table_title in (
        "Prepare, 1 in flight:",
        "Unprepare, 1 in flight:",
        "Prepare, 20 in flight:",
        "Unprepare, 20 in flight:",
    ):
        assert table_title in text
    assert "1 claims 1 at a time and then 20 at a time" in text


def test_a_step_made_both_in_the_wait_and_after_the_answer_has_a_row_for_each() -> None:
    def unprepare(uid: str, trace: str, with_mark: bool) -> list[ReceivedSpan]:
        spans = [
            _span(
                "DRAPlugin/NodeUnprepareResources", 0, 4, trace=trace, span_id="root", parent=None
            ),
            _span("thunder_dra.unprepare", 0.1, 3.9, trace=trace, parent="root", uid=uid),
            _span("thunder_dra.checkpoint.write", 600, 605, trace=trace, span_id="drop"),
        ]
        if with_mark:  # else another call's write covered the mark (one write for both)
            spans.append(_span("thunder_dra.checkpoint.write", 0.2, 1.2, trace=trace, span_id="m"))
        return spans

    calls = calls_of([*unprepare("u1", "t1", True), *unprepare("u2", "t2", False)], {"u1", "u2"})
    rows = [
        [c.strip() for c in row.strip().strip("|").split("|")]
        for row in table(calls)
        if row.startswith("| `thunder_dra.checkpoint.write`")
    ]
    assert rows == [
        ["`thunder_dra.checkpoint.write`", "in the wait", "1", "0.2", "1.00", "1.00"],
        ["`thunder_dra.checkpoint.write`", "after the answer", "2", "600.0", "5.00", "5.00"],
    ]
    after = [s for c in calls for s in c.steps if s.after_answer]
    assert [s.name for s in after] == ["thunder_dra.checkpoint.write"] * 2


def test_the_run_waits_until_each_claim_has_its_prepare_and_its_unprepare() -> None:
    prepared = _prepare_trace("u1")
    unprepared = [
        _span(
            "DRAPlugin/NodeUnprepareResources", 200, 204, trace="t9", span_id="root", parent=None
        ),
        _span("thunder_dra.unprepare", 200.1, 203.9, trace="t9", parent="root", uid="u1"),
    ]
    assert not every_call_of({"u1"})(prepared)
    assert every_call_of({"u1"})([*prepared, *unprepared])
    assert not every_call_of({"u1", "u2"})([*prepared, *unprepared])

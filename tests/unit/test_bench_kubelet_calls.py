"""The kubelet-calls benchmark's arithmetic and its section of docs/benchmarks.md: figures
from drabench's JSON become the right percentiles, ratios, CPU per claim and verdicts, and
the section lands after the daemon's, replacing itself on the next run. With a baseline
the earlier commit's daemon ("before") stands beside ours; the enrollment-before-binding
cases get their row and their verdict against the target; a run in rounds pools each
case's rounds and shows each round's p50; the API server's requests of claims and
records are counted per claim; the bench recognises a claim whose binding
fields the API server dropped and one the daemon has enrolled."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.docsection import INTRO
from bench.kubelet_calls import (
    REPO,
    VARIANT_DIR,
    api_request_counts,
    apply_variant,
    binding_allocation,
    dropped_binding_fields,
    enrollment,
    in_turns,
    turned,
    variant_names,
    variant_summary,
)
from bench.kubelet_report import (
    BEFORE,
    BEFORE_BINDING,
    FLOOR,
    OURS,
    OURS_BINDING,
    Baseline,
    Case,
    Machine,
    against,
    kubernetes_version,
    merge_runs,
    parse_case,
    parse_rounds,
    render,
    write_docs,
)
from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED

MACHINE = Machine(
    started="2026-12-02 17:00 UTC",
    arch="x86_64",
    cpus=2,
    cpu_model="Test CPU",
    python="3.11.7",
    go="go1.26.8",
    kubernetes="v1.37.2",
    load_mean=6.5,
)


def _raw(
    in_flight: int, prepare_ms: float, unprepare_ms: float, *, calls: int = 100
) -> dict[str, Any]:
    """drabench's result: every prepare ``prepare_ms`` but the slowest one, twice as slow."""
    prepare = [prepare_ms / 1000] * (calls - 1) + [2 * prepare_ms / 1000]
    unprepare = [unprepare_ms / 1000] * calls
    return {
        "in_flight": in_flight,
        "prepare_s": prepare,
        "unprepare_s": unprepare,
        "wall_s": calls * (prepare_ms + unprepare_ms) / 1000 / in_flight,
        "cpu_ticks": {"plugin": 300, "kube-apiserver": 200, "drabench": 50},
        "grpc": {
            "NodePrepareResources": {"count": calls, "sum_s": calls * prepare_ms / 2000},
            "NodeUnprepareResources": {"count": 0, "sum_s": 0.0},
        },
        "registered_after_s": 1.2,
    }


def _cases() -> list[Case]:
    return [
        parse_case(OURS, _raw(1, 50.0, 30.0), clock_ticks=100),
        parse_case(FLOOR, _raw(1, 10.0, 2.0), clock_ticks=100),
        parse_case(OURS, _raw(20, 800.0, 600.0), clock_ticks=100),
        parse_case(FLOOR, _raw(20, 100.0, 20.0), clock_ticks=100),
    ]


BASELINE = Baseline(commit="abc1234", subject="Prepare: fewer API calls")


def _with_before() -> list[Case]:
    """The cases in the order of a run with a baseline: before, ours, floor, 1 in flight
    then 20."""
    ours_1, floor_1, ours_20, floor_20 = _cases()
    before_1 = parse_case(BEFORE, _raw(1, 100.0, 15.0), clock_ticks=100)
    before_20 = parse_case(BEFORE, _raw(20, 800.0, 600.0), clock_ticks=100)
    return [before_1, ours_1, floor_1, before_20, ours_20, floor_20]


def _binding(one_ms: float = 12.0, many_ms: float = 200.0) -> list[Case]:
    return [
        parse_case(OURS_BINDING, _raw(1, one_ms, 30.0), clock_ticks=100),
        parse_case(OURS_BINDING, _raw(20, many_ms, 600.0), clock_ticks=100),
    ]


def test_a_case_reads_percentiles_cpu_per_claim_and_the_grpc_mean() -> None:
    case = parse_case(OURS, _raw(1, 50.0, 30.0), clock_ticks=100)
    assert case.calls == 100
    assert case.prepare.pct(0.5) == 50.0
    assert case.prepare.pct(0.99) == 50.0  # nearest rank of 100: the slowest but one
    assert case.prepare.pct(1.0) == 100.0
    # 300 ticks at 100 per second over 100 claims: 30 ms of CPU per prepare + unprepare.
    assert case.cpu_ms == {"plugin": 30.0, "kube-apiserver": 20.0, "kubelet": 5.0}
    assert case.grpc_ms == {"NodePrepareResources": 25.0}  # a method never called is left out
    assert case.claims_per_second == 100 / 8.0


def test_the_section_gives_each_call_side_by_side_with_its_ratio_and_verdict() -> None:
    section = render(_cases(), MACHINE, "python -m bench.kubelet_calls --write-docs")
    assert section.startswith("## Kubelet calls\n")
    assert "`python -m bench.kubelet_calls --write-docs`" in section
    assert "| prepare | 1 | 100 / 100 | 50.0 | 10.0 | 5.0x | 50.0 | 10.0 | 5.0x |" in section
    assert "| unprepare | 1 | 100 / 100 | 30.0 | 2.0 | 15x | 30.0 | 2.0 | 15x |" in section
    assert "| prepare | 20 | 100 / 100 | 800.0 | 100.0 | 8.0x |" in section
    assert "prepare p50 5.0x (target <= 2.5x: misses)" in section
    assert "unprepare p50 15x (target <= 3x: misses)" in section
    # 100 claims in 7 s against 100 in 0.6 s at 20 in flight.
    assert "the floor completes 12x as many claims per second" in section
    assert "| plugin process CPU per claim, ms | 30.0 | 30.0 | 30.0 | 30.0 |" in section
    assert "| of which the plugin's gRPC call, mean ms | 25.0 | 5.0 | 400.0 | 50.0 |" in section
    assert "| of which the plugin's gRPC call, mean ms | - | - | - | - |" in section
    assert "mean of 6.5 on these 2 CPUs: the machine was busy" in section


def test_a_ratio_within_the_target_meets_it() -> None:
    cases = [
        parse_case(OURS, _raw(1, 20.0, 5.0), clock_ticks=100),
        parse_case(FLOOR, _raw(1, 10.0, 2.0), clock_ticks=100),
        parse_case(OURS, _raw(20, 100.0, 20.0), clock_ticks=100),
        parse_case(FLOOR, _raw(20, 100.0, 20.0), clock_ticks=100),
    ]
    idle = dataclasses.replace(MACHINE, load_mean=1.0)
    section = render(cases, idle, "cmd", note="Nothing else ran.")
    assert "prepare p50 2.0x (target <= 2.5x: meets)" in section
    assert "unprepare p50 2.5x (target <= 3x: meets)" in section
    assert "machine was busy" not in section
    assert section.rstrip().endswith("Nothing else ran.")


def test_the_section_goes_after_the_daemons_and_replaces_itself(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        INTRO + "\n## Daemon\n\ndaemon figures\n\n### Before and after\n\nold runs\n"
        "\n## Operator\n\noperator figures\n"
    )
    write_docs(render(_cases(), MACHINE, "first"), doc)
    write_docs(render(_cases(), MACHINE, "second"), doc)
    text = doc.read_text()
    assert text.count("## Kubelet calls") == 1
    assert "`first`" not in text
    assert "`second`" in text
    daemon, kubelet, operator = (text.index(h) for h in ("## Daemon", "## Kubelet", "## Operator"))
    assert daemon < text.index("old runs") < kubelet < operator
    assert text.endswith("operator figures\n")


DAEMON_VARIANT = dataclasses.replace(
    BASELINE, variant="answers-early", variant_summary="It answers before its work is done."
)

OWN_SECTIONS = [
    (
        _cases,
        {"thunder_latency_ms": 20},
        {"thunder_latency_ms": 20},
        "## Kubelet calls, Thunder 20 ms away",
        "answered 20 ms late (a latency fault on every `/api/v1/` path)",
    ),
    (
        _cases,
        {"run_ms": 100},
        {"run_ms": 100},
        "## Kubelet calls, pods running 100 ms",
        "Each pod runs 100 ms between its prepare and its unprepare",
    ),
    (
        _with_before,
        {"baseline": DAEMON_VARIANT},
        {"variant": "answers-early"},
        "## Kubelet calls, variant answers-early",
        '"before" is not an earlier daemon but a variant of this one: the tree of commit '
        '`abc1234` ("Prepare: fewer API calls") with `bench/variants/answers-early.patch` '
        "applied, exported from git and started as ours is, with its own directories. "
        "It answers before its work is done.",
    ),
]


@pytest.mark.parametrize(("cases", "rendered", "written", "title", "phrase"), OWN_SECTIONS)
def test_a_run_with_thunder_late_pods_running_or_a_daemon_variant_has_its_own_section(
    tmp_path: Path,
    cases: Callable[[], list[Case]],
    rendered: dict[str, Any],
    written: dict[str, Any],
    title: str,
    phrase: str,
) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(INTRO + "\n## Daemon\n\ndaemon figures\n\n## Operator\n\noperator figures\n")
    write_docs(render(_cases(), MACHINE, "loopback"), doc)
    first = render(cases(), MACHINE, "first", **rendered)
    assert first.startswith(title + "\n")
    assert phrase in first
    assert phrase not in render(_cases(), MACHINE, "loopback")
    write_docs(first, doc, **written)
    write_docs(render(cases(), MACHINE, "again", **rendered), doc, **written)
    text = doc.read_text()
    assert text.count(title) == 1
    assert "`again`" in text
    assert "`first`" not in text
    loopback, own, operator = (text.index(h) for h in ("## Kubelet calls\n", title, "## Operator"))
    assert loopback < text.index("`loopback`") < own < operator


def _touched(name: str) -> list[str]:
    """The files variant ``name``'s patch changes, relative to the repository."""
    text = (VARIANT_DIR / f"{name}.patch").read_text()
    return re.findall(r"^diff --git a/(\S+) b/", text, flags=re.MULTILINE)


@pytest.mark.parametrize("name", variant_names())
def test_every_daemon_variant_applies_to_this_tree_and_says_what_it_changes(
    tmp_path: Path, name: str
) -> None:
    # A patch that no longer applies fails here, not in the middle of a benchmark run.
    touched = _touched(name)
    assert touched
    tree = tmp_path / "tree"
    for path in touched:
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / path, tree / path)
    apply_variant(name, tree, "HEAD")
    for path in touched:
        changed = (tree / path).read_text()
        assert changed != (REPO / path).read_text()
        assert f"variant {name}:" in changed.lower()
    summary = variant_summary(name)
    assert "\n" not in summary
    assert "A measurement, never a product" in summary
    assert "diff --git" not in summary


def test_a_variant_that_no_longer_applies_names_its_patch_and_the_commit(tmp_path: Path) -> None:
    name = variant_names()[0]
    tree = tmp_path / "tree"
    for path in _touched(name):
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        (tree / path).write_text("rewritten since the patch was made\n")
    rotten = rf"bench/variants/{name}\.patch does not apply to abc1234"
    with pytest.raises(SystemExit, match=rotten):
        apply_variant(name, tree, "abc1234")


def test_the_kubernetes_version_is_the_go_modules() -> None:
    go_mod = Path(__file__).resolve().parents[2] / "hack" / "tools" / "kubeletbench" / "go.mod"
    assert kubernetes_version(go_mod) == "v1.37.2"


def test_without_a_baseline_or_binding_cases_the_section_has_neither() -> None:
    section = render(_cases(), MACHINE, "cmd")
    assert "| call | in flight | calls (ours / floor) | ours p50 ms | floor p50 ms | ratio |" in (
        section
    )
    assert '"before"' not in section
    assert "ours against before" not in section
    assert "enrolled before binding" not in section
    assert "Both plugins run on the same simulated node" in section


def test_with_a_baseline_before_stands_beside_ours_with_its_own_ratio_over_the_floor() -> None:
    section = render(_with_before(), MACHINE, "cmd", baseline=BASELINE)
    assert (
        "| call | in flight | calls (before / ours / floor) | before p50 ms | ours p50 ms "
        "| floor p50 ms | before / floor | ours / floor | before p99 ms | ours p99 ms "
        "| floor p99 ms | before / floor | ours / floor |"
    ) in section
    assert (
        "| prepare | 1 | 100 / 100 / 100 | 100.0 | 50.0 | 10.0 | 10x | 5.0x "
        "| 100.0 | 50.0 | 10.0 | 10x | 5.0x |"
    ) in section
    assert "| unprepare | 1 | 100 / 100 / 100 | 15.0 | 30.0 | 2.0 | 7.5x | 15x |" in section
    assert (
        "| per case | before, 1 in flight | ours, 1 in flight | floor, 1 in flight "
        "| before, 20 in flight | ours, 20 in flight | floor, 20 in flight |"
    ) in section
    assert "| of which the plugin's gRPC call, mean ms | 50.0 | 25.0 | 5.0 | 400.0 |" in section
    assert '"before" is the daemon of commit `abc1234` ("Prepare: fewer API calls")' in section
    assert "All three plugins run on the same simulated node" in section
    assert "alternating: before with 1 in flight, ours with 1 in flight, floor with 1" in section
    # The verdicts stay ours over the floor.
    assert "prepare p50 5.0x (target <= 2.5x: misses)" in section


def test_ours_against_before_says_faster_or_slower_for_each_call() -> None:
    section = render(_with_before(), MACHINE, "cmd", baseline=BASELINE)
    assert (
        "ours against before: prepare p50 2.0x faster and unprepare p50 2.0x slower one at "
        "a time; prepare p50 as fast (1.0x) and unprepare p50 as fast (1.0x) with 20 in "
        "flight."
    ) in section


def test_against_compares_latencies_within_rounding() -> None:
    assert against(100.0, 50.0) == "2.0x faster"
    assert against(50.0, 60.0) == "1.2x slower"
    assert against(50.0, 51.0) == "as fast (1.0x)"
    assert against(300.0, 10.0) == "30x faster"
    assert against(0.0, 10.0) == "not comparable"


def test_the_binding_row_is_ours_over_the_floors_prepare_with_its_verdict() -> None:
    section = render(_cases() + _binding(), MACHINE, "cmd")
    assert (
        "| prepare, enrolled before binding | 1 | 100 / 100 | 12.0 | 10.0 | 1.2x "
        "| 12.0 | 10.0 | 1.2x |"
    ) in section
    assert "| prepare, enrolled before binding | 20 | 100 / 100 | 200.0 | 100.0 | 2.0x |" in (
        section
    )
    assert (
        "- enrolled before binding, one at a time, prepare p50 1.2x (target <= 1.5x: meets); "
        "20 in flight, prepare p50 2.0x (target <= 1.5x: misses)."
    ) in section
    assert "the floor completes 12x as many claims per second;" in section
    assert (
        f'"{OURS_BINDING}", run last with 1 and then 20 in flight, is ours restarted with '
        "`--enroll-before-binding` against 100 claims of its own"
    ) in section
    assert "alternating: ours with 1 in flight, floor with 1 in flight, ours with 20" in section
    assert "ours, enrolled before binding, 1 in flight |" in section


def test_a_binding_prepare_over_the_target_misses_it() -> None:
    section = render(_cases() + _binding(one_ms=16.0)[:1], MACHINE, "cmd")
    assert (
        "- enrolled before binding, one at a time, prepare p50 1.6x (target <= 1.5x: misses)."
        in (section)
    )


def test_with_a_baseline_the_binding_row_leaves_before_empty() -> None:
    section = render(_with_before() + _binding(), MACHINE, "cmd", baseline=BASELINE)
    assert (
        "| prepare, enrolled before binding | 1 | - / 100 / 100 | - | 12.0 | 10.0 | - | 1.2x "
        "| - | 12.0 | 10.0 | - | 1.2x |"
    ) in section


def test_a_baseline_enrolled_before_binding_stands_beside_ours() -> None:
    before = [
        parse_case(BEFORE_BINDING, _raw(1, 15.0, 30.0), clock_ticks=100),
        parse_case(BEFORE_BINDING, _raw(20, 300.0, 600.0), clock_ticks=100),
    ]
    cases = [*_with_before(), before[0], _binding()[0], before[1], _binding()[1]]
    section = render(cases, MACHINE, "cmd", baseline=BASELINE)
    assert (
        "| prepare, enrolled before binding | 1 | 100 / 100 / 100 | 15.0 | 12.0 | 10.0 | 1.5x "
        "| 1.2x | 15.0 | 12.0 | 10.0 | 1.5x | 1.2x |"
    ) in section
    assert (
        "enrolled before binding, prepare p50 1.2x faster one at a time; enrolled before "
        "binding, prepare p50 1.5x faster with 20 in flight."
    ) in section
    assert (
        f'"{BEFORE_BINDING}" and "{OURS_BINDING}", run last, alternating, with 1 and then 20 '
        "in flight, are before and ours, each alone and restarted with "
        "`--enroll-before-binding`"
    ) in section
    assert (
        "| before, enrolled before binding, 1 in flight | ours, enrolled before binding, "
        "1 in flight | before, enrolled before binding, 20 in flight |"
    ) in section
    assert "alternating: before with 1 in flight, ours with 1 in flight, floor" in section
    assert "before, enrolled before binding with" not in section


def _binding_claim(**result: Any) -> dict[str, Any]:
    return {
        "status": {
            "allocation": {
                **binding_allocation("node-a"),
                "devices": {"results": [{"driver": "thundercompute.com", **result}]},
            }
        }
    }


def test_binding_fields_the_api_server_dropped_are_named() -> None:
    kept = _binding_claim(
        bindingConditions=[ENROLLED], bindingFailureConditions=[ENROLLMENT_FAILED]
    )
    assert dropped_binding_fields(kept, "node-a") == []
    assert dropped_binding_fields(_binding_claim(), "node-a") == [
        "status.allocation.devices.results[0].bindingConditions",
        "status.allocation.devices.results[0].bindingFailureConditions",
    ]
    assert dropped_binding_fields(kept, "node-b") == ["status.allocation.nodeSelector"]


def _entry(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "status": {
            "devices": [
                {"driver": "other.example.com", "conditions": []},
                {
                    "driver": "thundercompute.com",
                    "conditions": [
                        {"type": kind, "status": status, "reason": "R", "message": "M"}
                        for kind, status in conditions
                    ],
                },
            ]
        }
    }


def test_a_claim_is_enrolled_once_its_entry_says_enrolled() -> None:
    assert enrollment({"status": {}}) is None
    assert enrollment(_entry(("Ready", "True"))) is None
    assert enrollment(_entry(("Ready", "True"), (ENROLLED, "True"))) == ""
    assert enrollment(_entry(("Ready", "False"), (ENROLLMENT_FAILED, "True"))) == "R: M"


def test_rounds_pool_their_calls_cpu_and_grpc_totals_and_keep_each_rounds_p50() -> None:
    first, second = _raw(1, 40.0, 10.0, calls=50), _raw(1, 60.0, 30.0, calls=50)
    second["cpu_ticks"] = {"plugin": 100, "kube-apiserver": 100, "drabench": 50}
    merged = merge_runs([first, second])
    assert len(merged["prepare_s"]) == 100
    assert merged["wall_s"] == first["wall_s"] + second["wall_s"]
    assert merged["cpu_ticks"] == {"plugin": 400, "kube-apiserver": 300, "drabench": 100}
    assert merged["grpc"]["NodePrepareResources"] == {
        "count": 100,
        "sum_s": 50 * 40.0 / 2000 + 50 * 60.0 / 2000,
    }
    case = parse_rounds(OURS, [first, second], clock_ticks=100)
    assert case.calls == 100
    assert case.round_p50_ms == ((40.0, 10.0), (60.0, 30.0))
    # 400 ticks at 100 per second over the 100 claims of both rounds.
    assert case.cpu_ms["plugin"] == 40.0
    assert case.grpc_ms["NodePrepareResources"] == 25.0
    with pytest.raises(ValueError, match="numbers in flight"):
        merge_runs([first, _raw(20, 40.0, 10.0)])
    with pytest.raises(ValueError, match="no drabench result"):
        merge_runs([])


def test_each_round_turns_the_order_by_one() -> None:
    plugins = [BEFORE, OURS, FLOOR]
    assert [turned(plugins, turn) for turn in range(4)] == [
        [BEFORE, OURS, FLOOR],
        [OURS, FLOOR, BEFORE],
        [FLOOR, BEFORE, OURS],
        [BEFORE, OURS, FLOOR],
    ]
    assert turned([], 3) == []
    assert in_turns([OURS, FLOOR], 2) == [(0, OURS), (0, FLOOR), (1, FLOOR), (1, OURS)]


def test_a_run_in_rounds_says_so_and_gives_each_rounds_p50() -> None:
    def rounds(plugin: str, in_flight: int, ms: tuple[float, float, float]) -> Case:
        runs = [_raw(in_flight, p, p / 2, calls=30) for p in ms]
        return parse_rounds(plugin, runs, clock_ticks=100)

    cases = [
        rounds(BEFORE, 1, (44.0, 46.0, 45.0)),
        rounds(OURS, 1, (40.0, 41.0, 39.0)),
        rounds(FLOOR, 1, (10.0, 11.0, 10.0)),
        rounds(BEFORE, 20, (500.0, 520.0, 510.0)),
        rounds(OURS, 20, (480.0, 490.0, 470.0)),
        rounds(FLOOR, 20, (60.0, 70.0, 65.0)),
        rounds(OURS_BINDING, 1, (12.0, 13.0, 12.0)),
        rounds(OURS_BINDING, 20, (150.0, 160.0, 140.0)),
    ]
    section = render(cases, MACHINE, "cmd", baseline=BASELINE)
    # Each round prepares the same 30 claims again.
    assert "with 1 and then 20 in flight (3 rounds each, the order turning)" in section
    assert "against 30 claims of its own" in section
    assert "with 1 and then 20 in flight, 3 rounds each" in section
    assert "(first round: before, ours, floor)" in section
    assert (
        "| prepare p50 of each round, ms | 44.0 / 46.0 / 45.0 | 40.0 / 41.0 / 39.0 "
        "| 10.0 / 11.0 / 10.0 | 500.0 / 520.0 / 510.0 | 480.0 / 490.0 / 470.0 "
        "| 60.0 / 70.0 / 65.0 |"
    ) in section
    assert "| unprepare p50 of each round, ms | 22.0 / 23.0 / 22.5 |" in section
    # One round's worth of calls per plugin is not what a single run says.
    assert "| prepare | 1 | 90 / 90 / 90 |" in section
    single = render(_with_before(), MACHINE, "cmd", baseline=BASELINE)
    assert "of each round" not in single
    assert "alternating: before with 1 in flight, ours with 1 in flight" in single


def _request_line(group: str, resource: str, verb: str, count: int, sub: str = "") -> str:
    labels = {
        "code": "200",
        "component": "apiserver",
        "group": group,
        "resource": resource,
        "subresource": sub,
        "verb": verb,
        "version": "v1",
    }
    text = ",".join(f'{name}="{value}"' for name, value in labels.items())
    return f"apiserver_request_total{{{text}}} {count}"


METRICS = "\n".join(
    [
        "# HELP apiserver_request_total [STABLE] Counter of apiserver requests.",
        "# TYPE apiserver_request_total counter",
        _request_line("resource.k8s.io", "resourceclaims", "GET", 7),
        _request_line("resource.k8s.io", "resourceclaims", "GET", 1).replace("200", "404"),
        _request_line("resource.k8s.io", "resourceclaims", "APPLY", 2, sub="status"),
        _request_line("resource.k8s.io", "resourceclaims", "LIST", 40),
        _request_line("resource.k8s.io", "resourceclaims", "WATCH", 3),
        _request_line("thundercompute.com", "clients", "POST", 5),
        _request_line("thundercompute.com", "clients", "DELETE", 4),
        _request_line("thundercompute.com", "clients", "PATCH", 4),
        _request_line("", "pods", "GET", 9),
        _request_line("", "events", "POST", 6),
        "# HELP apiserver_request_duration_seconds [STABLE] Response latency.",
        "# TYPE apiserver_request_duration_seconds histogram",
        _request_line("resource.k8s.io", "resourceclaims", "GET", 8).replace(
            "apiserver_request_total", "apiserver_request_duration_seconds_count"
        ),
        "",
    ]
)


def test_requests_of_claims_and_records_are_reads_and_writes_lists_and_others_left_out() -> None:
    assert api_request_counts(METRICS) == {"reads": 8, "writes": 15}
    assert api_request_counts("") == {"reads": 0, "writes": 0}


def test_requests_per_claim_pool_the_rounds_and_show_beside_the_cpu() -> None:
    def counted(raw: dict[str, Any], claims: int, reads: int, writes: int) -> dict[str, Any]:
        return {**raw, "api_requests": {"claims": claims, "reads": reads, "writes": writes}}

    first = counted(_raw(1, 40.0, 10.0, calls=50), 52, 104, 156)
    second = counted(_raw(1, 60.0, 30.0, calls=50), 52, 156, 156)
    case = parse_rounds(OURS, [first, second], clock_ticks=100)
    assert case.api_requests == {"reads": 2.5, "writes": 3.0}
    # A round without a count (a run of an older benchmark) leaves the case without one.
    assert parse_rounds(OURS, [first, _raw(1, 60.0, 30.0, calls=50)], 100).api_requests is None

    ours_1, floor_1, ours_20, floor_20 = _cases()
    cases = [
        dataclasses.replace(ours_1, api_requests={"reads": 2.0, "writes": 3.0}),
        dataclasses.replace(floor_1, api_requests={"reads": 2.0, "writes": 0.0}),
        ours_20,
        floor_20,
    ]
    text = render(cases, MACHINE, "python -m bench.kubelet_calls")
    (row,) = [line for line in text.splitlines() if line.startswith("| Kubernetes requests")]
    assert row == (
        "| Kubernetes requests per claim, reads / writes | 2.0 / 3.0 | 2.0 / 0.0 | - | - |"
    )
    assert "`apiserver_request_total`" in text
    assert "Kubernetes requests" not in render(_cases(), MACHINE, "python -m bench.kubelet_calls")

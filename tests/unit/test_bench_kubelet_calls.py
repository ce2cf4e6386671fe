"""The kubelet-calls benchmark's arithmetic and its section of docs/benchmarks.md: figures
from drabench's JSON become the right percentiles, ratios, CPU per claim and verdicts, and
the section lands after the daemon's, replacing itself on the next run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bench.docsection import INTRO
from bench.kubelet_calls import (
    FLOOR,
    OURS,
    Case,
    Machine,
    kubernetes_version,
    parse_case,
    render,
    write_docs,
)

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


def test_the_kubernetes_version_is_the_go_modules() -> None:
    go_mod = Path(__file__).resolve().parents[2] / "hack" / "tools" / "kubeletbench" / "go.mod"
    assert kubernetes_version(go_mod) == "v1.37.2"

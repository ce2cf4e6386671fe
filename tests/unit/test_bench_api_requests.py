"""The rendering of bench/api_requests.py's section (the measurement itself runs on the
local control plane: `python -m bench.api_requests`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.api_requests import AFTER, HEADING, ORDERS, STEPS, Figure, render, write_docs
from bench.docsection import INTRO

pytestmark = pytest.mark.unit


def _figures() -> list[Figure]:
    figures = []
    for number, extra in ((1, 0.0), (2, 1.0)):
        for index, step in enumerate((*STEPS, *ORDERS)):
            apiserver = 2.0 if index == 0 else 5.0 * step.requests + index
            figures.append(
                Figure(
                    step,
                    number,
                    {"kube-apiserver": apiserver + extra, "etcd": 1.0},
                    10.0,
                )
            )
    return figures


def test_each_request_of_a_claim_has_its_cpu_per_round_and_the_sum() -> None:
    section = render(
        _figures(), 150, "python -m bench.api_requests", "2026-12-03 12:00 UTC", "2 CPUs (x)"
    )
    assert section.startswith(HEADING + "\n")
    assert (
        "| claim GET | prepare, in the kubelet's wait | 1 | 2.0 / 1.0 / 10.0 | 3.0 / 1.0 / 10.0 |"
        in (section)
    )
    assert (
        "| `Client` finalizer removed, then the record deleted | after the unprepare's answer "
        "| 2 | 15.0 / 1.0 / 10.0 | 16.0 / 1.0 / 10.0 |"
    ) in section
    # 2 + 6 + 7 + 8 + 9 + 15 = 47 in round 1, one more per step in round 2.
    assert "| all of a claim's | | 7 | 47.0 / 6.0 / - | 53.0 / 6.0 / - |" in section
    assert "A claim's 7 requests cost the API server 47.0 and 53.0 ms of CPU" in section
    # Per write request: 6 .. 9 in round 1, the delete step's 15 over its 2 requests.
    assert "each write request 6.0 to 10.0 ms" in section
    assert "against 2.0 and 3.0 ms for the claim read" in section
    # The two orders of the removal: beside the sum, not in it.
    assert (
        "| `Client` finalizer removed, then deleted | the daemon's order "
        "| 2 | 16.0 / 1.0 / 10.0 | 17.0 / 1.0 / 10.0 |"
    ) in section
    assert (
        "| `Client` deleted, then its finalizer removed | the other order "
        "| 2 | 17.0 / 1.0 / 10.0 | 18.0 / 1.0 / 10.0 |"
    ) in section
    assert (
        "The daemon's order costs the API server 16.0 and 17.0 ms and etcd 1.0 and 1.0 ms, "
        "against 17.0 and 18.0 ms and etcd 1.0 and 1.0 ms the other way."
    ) in section


def test_the_section_goes_after_the_kubelet_call_sections(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(INTRO + f"\n{AFTER}\n\nearlier\n\n## Checkpoint writes\n\nlater\n")
    section = render(_figures(), 150, "cmd", "now", "2 CPUs (x)")
    write_docs(section, doc)
    text = doc.read_text()
    assert text.index(AFTER) < text.index(HEADING) < text.index("## Checkpoint writes")
    write_docs(section, doc)
    assert doc.read_text().count(HEADING) == 1

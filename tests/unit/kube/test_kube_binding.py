"""The allocation results that ask for the Enrolled binding condition
(thunder_dra/kube/binding.py), which the daemon's claim watcher and its claim status writer
both go by: only this driver's, only a real list of conditions, and nothing from a status
that is not shaped as the API server writes it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED, enrollment_results

pytestmark = pytest.mark.unit

DRIVER = "thundercompute.com"


def _claim(*results: Any) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": list(results)}}}}


def _result(device: str, conditions: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {"driver": driver, "pool": "p", "device": device, "bindingConditions": conditions}


def test_only_this_drivers_results_that_ask_for_enrolled() -> None:
    claim = _claim(
        _result("a", [ENROLLED]),
        _result("b", [ENROLLMENT_FAILED]),
        _result("c", [ENROLLED], driver="net.example.com"),
        _result("d", None),
        {"driver": DRIVER, "pool": "p", "device": "e"},
        _result("f", ["other", ENROLLED]),
    )
    assert [r["device"] for r in enrollment_results(claim, DRIVER)] == ["a", "f"]


def test_a_string_of_conditions_is_not_a_list_of_them() -> None:
    assert enrollment_results(_claim(_result("a", ENROLLED)), DRIVER) == []


@pytest.mark.parametrize(
    "claim",
    [
        {},
        {"status": None},
        {"status": []},
        {"status": {"allocation": "x"}},
        {"status": {"allocation": {"devices": []}}},
        {"status": {"allocation": {"devices": {"results": {"driver": DRIVER}}}}},
        _claim("a result", 7, None),
    ],
)
def test_a_status_not_shaped_as_the_api_server_writes_it_asks_for_nothing(claim: Any) -> None:
    assert enrollment_results(claim, DRIVER) == []


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.just(ENROLLED),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["status", "allocation", "devices", "results"]), JSONISH, max_size=4
    )
)
def test_any_claim_gives_mappings_of_this_driver_that_ask_for_enrolled(claim: Any) -> None:
    for result in enrollment_results(claim, DRIVER):
        assert result["driver"] == DRIVER
        assert ENROLLED in result["bindingConditions"]

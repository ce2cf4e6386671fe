"""The binding conditions in the daemon's ResourceClaim.status.devices entries
(thunder_dra/plugin/claims/status.py): ``Enrolled`` beside ``Ready`` for the devices whose
allocation asks for it, ``EnrollmentFailed`` after a prepare made before binding failed,
and nothing new for devices that ask for nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED
from thunder_dra.plugin.claims.status import (
    CONDITION_READY,
    MAX_CONDITIONS,
    REASON_PREPARED,
    Outcome,
    check_entry,
    desired_entries,
    failed_outcome,
    prepared_outcome,
    unchanged,
)
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import Consumer, PreparedClaim

pytestmark = pytest.mark.unit

DRIVER = "thundercompute.com"
OTHER = "net.example.com"
NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
LATER = NOW + timedelta(minutes=5)
STAMP_NOW = "2026-12-02T09:00:00Z"
STAMP_LATER = "2026-12-02T09:05:00Z"
BINDING = [ENROLLED]


def _result(device: str, *, driver: str = DRIVER, binding: bool = True) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": "p", "device": device}
    if binding:
        result["bindingConditions"] = list(BINDING)
        result["bindingFailureConditions"] = [ENROLLMENT_FAILED]
    return result


def _claim(*results: dict[str, Any], devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"allocation": {"devices": {"results": list(results)}}}
    if devices is not None:
        status["devices"] = devices
    return {"metadata": {"name": "gpu", "namespace": "work", "uid": "uid-1"}, "status": status}


def _prepared() -> PreparedClaim:
    return PreparedClaim(
        uid="uid-1",
        namespace="work",
        name="gpu",
        consumer=Consumer(kind="pod", name="p"),
        zone_name="zone-a",
        zone_id="z-1",
        gpu_type="A6000",
        gpu_count=1,
        enrollment_token_id="tok-1",
        client_id="client-42",
    )


PREPARED = prepared_outcome(_prepared())
FAILED = failed_outcome("Thunder mint failed: 503", ErrorReason.THUNDER_MINT, str)
FAILED_BEFORE_BINDING = failed_outcome(
    "Thunder mint failed: 503", ErrorReason.THUNDER_MINT, str, before_binding=True
)


def _conditions(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in entry["conditions"]}


def test_enrolled_is_set_beside_ready_only_where_the_allocation_asks_for_it() -> None:
    claim = _claim(_result("gpu-0"), _result("gpu-1", binding=False))
    asking, plain = desired_entries(claim, DRIVER, PREPARED, NOW)
    assert asking["device"] == "gpu-0"
    conditions = _conditions(asking)
    assert list(conditions) == [CONDITION_READY, ENROLLED]
    enrolled = conditions[ENROLLED]
    assert enrolled["status"] == "True"
    assert enrolled["reason"] == REASON_PREPARED == conditions[CONDITION_READY]["reason"]
    assert enrolled["lastTransitionTime"] == STAMP_NOW
    assert [c["type"] for c in plain["conditions"]] == [CONDITION_READY]
    assert asking["data"] == plain["data"]


def test_another_drivers_binding_conditions_do_not_count() -> None:
    claim = _claim(_result("gpu-0", binding=False), _result("eth1", driver=OTHER))
    (entry,) = desired_entries(claim, DRIVER, PREPARED, NOW)
    assert [c["type"] for c in entry["conditions"]] == [CONDITION_READY]


def test_a_shared_device_is_matched_with_its_share_id() -> None:
    shared = {**_result("gpu-0"), "shareID": "share-1"}
    plain = {**_result("gpu-0", binding=False), "shareID": "share-2"}
    entries = desired_entries(_claim(shared, plain), DRIVER, PREPARED, NOW)
    by_share = {e["shareID"]: [c["type"] for c in e["conditions"]] for e in entries}
    assert by_share == {"share-1": [CONDITION_READY, ENROLLED], "share-2": [CONDITION_READY]}


def test_a_failed_prepare_before_binding_sets_enrollment_failed_with_readys_words() -> None:
    claim = _claim(_result("gpu-0"), _result("gpu-1", binding=False))
    asking, plain = desired_entries(claim, DRIVER, FAILED_BEFORE_BINDING, NOW)
    conditions = _conditions(asking)
    assert list(conditions) == [CONDITION_READY, ENROLLMENT_FAILED]
    ready, failed = conditions[CONDITION_READY], conditions[ENROLLMENT_FAILED]
    assert ready["status"] == "False"
    assert failed["status"] == "True"
    assert (failed["reason"], failed["message"]) == (ready["reason"], ready["message"])
    assert (failed["reason"], failed["message"]) == (
        "ThunderMintFailed",
        "Thunder mint failed: 503",
    )
    assert ENROLLED not in conditions
    assert [c["type"] for c in plain["conditions"]] == [CONDITION_READY]


def test_a_failed_prepare_by_the_kubelet_sets_no_binding_condition() -> None:
    (entry,) = desired_entries(_claim(_result("gpu-0")), DRIVER, FAILED, NOW)
    assert [(c["type"], c["status"]) for c in entry["conditions"]] == [(CONDITION_READY, "False")]


def test_the_failure_message_is_scrubbed_and_bounded_like_readys() -> None:
    outcome = failed_outcome(
        "refused tcet_secret " + "x" * 5000,
        ErrorReason.THUNDER_MINT,
        lambda text: text.replace("tcet_secret", "***"),
        before_binding=True,
    )
    (entry,) = desired_entries(_claim(_result("gpu-0")), DRIVER, outcome, NOW)
    conditions = _conditions(entry)
    failed = conditions[ENROLLMENT_FAILED]
    assert "tcet_secret" not in failed["message"]
    assert failed["message"] == conditions[CONDITION_READY]["message"]
    assert len(failed["message"]) <= 1024


def test_unprepared_leaves_no_entry_even_where_binding_is_asked() -> None:
    assert desired_entries(_claim(_result("gpu-0")), DRIVER, Outcome(ready=None), NOW) == []


def test_enrolled_keeps_its_transition_time_while_it_stays_true() -> None:
    claim = _claim(_result("gpu-0"))
    (first,) = desired_entries(claim, DRIVER, PREPARED, NOW)
    (again,) = desired_entries(_claim(_result("gpu-0"), devices=[first]), DRIVER, PREPARED, LATER)
    assert _conditions(again)[ENROLLED]["lastTransitionTime"] == STAMP_NOW
    assert _conditions(again)[CONDITION_READY]["lastTransitionTime"] == STAMP_NOW
    assert unchanged([first], [again]), "the same outcome again writes nothing"


def test_enrollment_failed_keeps_its_transition_time_while_it_stays_true() -> None:
    (first,) = desired_entries(_claim(_result("gpu-0")), DRIVER, FAILED_BEFORE_BINDING, NOW)
    claim = _claim(_result("gpu-0"), devices=[first])
    (again,) = desired_entries(claim, DRIVER, FAILED_BEFORE_BINDING, LATER)
    assert _conditions(again)[ENROLLMENT_FAILED]["lastTransitionTime"] == STAMP_NOW


def test_a_condition_that_changes_status_gets_a_new_transition_time() -> None:
    (failed,) = desired_entries(_claim(_result("gpu-0")), DRIVER, FAILED_BEFORE_BINDING, NOW)
    claim = _claim(_result("gpu-0"), devices=[failed])
    (prepared,) = desired_entries(claim, DRIVER, PREPARED, LATER)
    conditions = _conditions(prepared)
    assert list(conditions) == [CONDITION_READY, ENROLLED]
    assert conditions[CONDITION_READY]["lastTransitionTime"] == STAMP_LATER
    assert conditions[ENROLLED]["lastTransitionTime"] == STAMP_LATER


def test_a_stored_false_enrolled_is_a_transition_to_true() -> None:
    stale = {
        "driver": DRIVER,
        "pool": "p",
        "device": "gpu-0",
        "conditions": [
            {"type": ENROLLED, "status": "False", "lastTransitionTime": "2026-12-01T00:00:00Z"}
        ],
    }
    (entry,) = desired_entries(_claim(_result("gpu-0"), devices=[stale]), DRIVER, PREPARED, NOW)
    assert _conditions(entry)[ENROLLED]["lastTransitionTime"] == STAMP_NOW


@pytest.mark.parametrize("outcome", [PREPARED, FAILED, FAILED_BEFORE_BINDING])
def test_every_entry_stays_within_the_apiservers_condition_limit(outcome: Outcome) -> None:
    many = [
        {"type": f"example.com/C{i}", "status": "True", "lastTransitionTime": STAMP_NOW}
        for i in range(20)
    ]
    stored = {"driver": DRIVER, "pool": "p", "device": "gpu-0", "conditions": many}
    claim = _claim(_result("gpu-0"), _result("gpu-1", binding=False), devices=[stored])
    for entry in desired_entries(claim, DRIVER, outcome, NOW):
        assert len(entry["conditions"]) <= MAX_CONDITIONS
        check_entry(entry)


@pytest.mark.parametrize("outcome", [PREPARED, FAILED, FAILED_BEFORE_BINDING])
def test_devices_without_binding_conditions_are_as_before(outcome: Outcome) -> None:
    """Without bindingConditions an entry is one Ready condition, whatever the outcome."""
    (entry,) = desired_entries(_claim(_result("gpu-0", binding=False)), DRIVER, outcome, NOW)
    (ready,) = entry["conditions"]
    assert ready == {
        "type": CONDITION_READY,
        "status": "True" if outcome.ready else "False",
        "reason": outcome.reason,
        "message": outcome.message,
        "lastTransitionTime": STAMP_NOW,
    }
    expected = {"driver", "pool", "device", "conditions"} | ({"data"} if outcome.ready else set())
    assert set(entry) == expected


def test_binding_conditions_other_than_enrolled_add_nothing() -> None:
    result = {**_result("gpu-0", binding=False), "bindingConditions": ["example.com/Attached"]}
    (entry,) = desired_entries(_claim(result), DRIVER, PREPARED, NOW)
    assert [c["type"] for c in entry["conditions"]] == [CONDITION_READY]

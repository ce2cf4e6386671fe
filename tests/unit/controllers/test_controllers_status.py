"""ThunderCluster status: conditions, Ready, and the rule for when status is written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from thunder_dra.api.base import find_condition
from thunder_dra.api.thundercluster import PoolStatus
from thunder_dra.controllers.shared.status import (
    LAST_SYNC_REFRESH,
    ConditionState,
    Observation,
    build_status,
    status_patch,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POOL = PoolStatus(
    zone="us-east",
    model="A6000",
    pool="us-east/a6000",
    physical=4,
    target="1.5",
    published=6,
    live_clients=0,
)
GOOD = ConditionState(True, "Fine", "fine")


def observation(
    *,
    thunder: ConditionState = GOOD,
    daemon: ConditionState = GOOD,
    pools: list[PoolStatus] | None = None,
    synced: bool = True,
) -> Observation:
    return Observation(
        generation=3,
        thunder=thunder,
        inventory=GOOD,
        daemon=daemon,
        pools=[POOL] if pools is None else pools,
        synced=synced,
    )


def test_ready_holds_when_every_condition_holds() -> None:
    status = build_status(None, observation(), T0)
    ready = find_condition(status.conditions, "Ready")
    assert ready is not None
    assert ready.status == "True"
    assert status.pool_count == 1
    assert status.device_count == 6
    assert status.observed_generation == 3
    assert {c.type for c in status.conditions} == {
        "Ready",
        "InventorySynced",
        "ThunderReachable",
        "DaemonReady",
    }


def test_ready_takes_the_reason_of_the_first_failing_condition() -> None:
    down = ConditionState(False, "ServerError", "Thunder answered 503")
    status = build_status(None, observation(thunder=down), T0)
    ready = find_condition(status.conditions, "Ready")
    assert ready is not None
    assert (ready.status, ready.reason, ready.message) == (
        "False",
        "ServerError",
        "Thunder answered 503",
    )


def test_unread_inventory_keeps_the_previous_pool_figures() -> None:
    before = build_status(None, observation(), T0)
    after = build_status(before, observation(pools=None, synced=False), T0)
    kept = Observation(3, GOOD, GOOD, GOOD, None, synced=False)
    after = build_status(before, kept, T0)
    assert after.pools == [POOL]
    assert after.device_count == 6


def test_nothing_is_written_when_only_the_sync_time_would_move() -> None:
    first = status_patch(None, build_status(None, observation(), T0), synced=True, now=T0)
    assert first is not None
    assert first.last_sync_time == T0
    later = T0 + timedelta(seconds=30)
    again = build_status(first, observation(), later)
    assert status_patch(first, again, synced=True, now=later) is None
    stale = T0 + LAST_SYNC_REFRESH
    refreshed = status_patch(
        first, build_status(first, observation(), stale), synced=True, now=stale
    )
    assert refreshed is not None
    assert refreshed.last_sync_time == stale


def test_a_real_change_is_written_at_once_and_keeps_transition_times() -> None:
    first = status_patch(None, build_status(None, observation(), T0), synced=True, now=T0)
    assert first is not None
    later = T0 + timedelta(seconds=10)
    waiting = ConditionState(False, "PodsNotReady", "0 of 2 daemon pods are ready")
    changed = status_patch(
        first, build_status(first, observation(daemon=waiting), later), synced=True, now=later
    )
    assert changed is not None
    thunder = find_condition(changed.conditions, "ThunderReachable")
    daemon = find_condition(changed.conditions, "DaemonReady")
    assert thunder is not None
    assert thunder.last_transition_time == T0
    assert daemon is not None
    assert daemon.last_transition_time == later


def test_a_failed_pass_keeps_the_last_sync_time() -> None:
    first = status_patch(None, build_status(None, observation(), T0), synced=True, now=T0)
    assert first is not None
    later = T0 + timedelta(minutes=1)
    down = ConditionState(False, "ServerError", "503")
    failed = status_patch(
        first,
        build_status(first, observation(thunder=down, synced=False), later),
        synced=False,
        now=later,
    )
    assert failed is not None
    assert failed.last_sync_time == T0

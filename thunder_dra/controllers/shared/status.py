"""The ThunderCluster status: conditions, pool figures, and when to write them.

Conditions: `ThunderReachable` (every zone was read), `InventorySynced` (the published
objects match Thunder), `DaemonReady` (every daemon pod is updated and ready),
`InventorySuspect` (True while a shrinking answer is held back until it repeats),
`SpecValid` (False while the spec does not validate and the last valid one is served)
and `Ready` (the first three, and a valid spec). A condition keeps its
`lastTransitionTime` while its status holds.

Write policy. Status patches are not inventory writes, but a patch every pass would
still be an etcd write every `reconcileInterval` for nothing. So the status is patched
when anything in it besides `lastSyncTime` changes, and otherwise only to refresh
`lastSyncTime`, at most once per `LAST_SYNC_REFRESH` (5 minutes). `lastSyncTime` is
therefore accurate to 5 minutes plus one interval: a value older than that means the
operator is not completing passes. A restarted operator compares with the stored
status, so it writes nothing either when nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from thunder_dra.api.base import Condition, set_condition
from thunder_dra.api.thundercluster import ConditionType, PoolStatus, ThunderClusterStatus

LAST_SYNC_REFRESH: Final = timedelta(minutes=5)
MAX_STATUS_POOLS: Final = 5000
"""Pools listed in status (etcd objects are limited to 1.5 MiB); counts cover all."""


@dataclass(frozen=True, slots=True)
class ConditionState:
    status: bool
    reason: str
    message: str = ""

    def condition(self, type_: str, now: datetime, generation: int | None) -> Condition:
        return Condition(
            type=type_,
            status="True" if self.status else "False",
            reason=self.reason,
            message=self.message[:32768],
            last_transition_time=now,
            observed_generation=generation,
        )


@dataclass(frozen=True, slots=True)
class Observation:
    """What one pass found, before it becomes status."""

    generation: int | None
    thunder: ConditionState
    inventory: ConditionState
    daemon: ConditionState
    pools: Sequence[PoolStatus] | None
    """None keeps the previous figures (nothing was read)."""
    synced: bool
    """The pass read Thunder and brought the published objects in line."""
    suspect: ConditionState | None = None
    """InventorySuspect; None keeps the previous condition."""
    spec_valid: ConditionState | None = None
    """SpecValid; None keeps the previous condition."""


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def ready_state(*states: ConditionState) -> ConditionState:
    failing = [state for state in states if not state.status]
    if not failing:
        return ConditionState(True, "Ready", "inventory published and daemon ready")
    return ConditionState(
        False, failing[0].reason, "; ".join(state.message for state in failing if state.message)
    )


def build_status(
    previous: ThunderClusterStatus | None, observation: Observation, now: datetime
) -> ThunderClusterStatus:
    """The status after `observation`; lastSyncTime is the caller's decision."""
    base = previous or ThunderClusterStatus()
    generation = observation.generation
    conditions = list(base.conditions)
    states = {
        ConditionType.THUNDER_REACHABLE: observation.thunder,
        ConditionType.INVENTORY_SYNCED: observation.inventory,
        ConditionType.DAEMON_READY: observation.daemon,
    }
    gating = list(states.values())
    if observation.spec_valid is not None:
        gating.append(observation.spec_valid)
    states[ConditionType.READY] = ready_state(*gating)
    if observation.suspect is not None:
        states[ConditionType.INVENTORY_SUSPECT] = observation.suspect
    if observation.spec_valid is not None:
        states[ConditionType.SPEC_VALID] = observation.spec_valid
    for type_ in (
        ConditionType.READY,
        ConditionType.INVENTORY_SYNCED,
        ConditionType.THUNDER_REACHABLE,
        ConditionType.DAEMON_READY,
        ConditionType.INVENTORY_SUSPECT,
        ConditionType.SPEC_VALID,
    ):
        if type_ in states:
            conditions = set_condition(conditions, states[type_].condition(type_, now, generation))
    pools = (
        list(base.pools)
        if observation.pools is None
        else sorted(observation.pools, key=lambda pool: pool.pool)
    )
    return ThunderClusterStatus(
        observed_generation=generation,
        conditions=conditions,
        pools=pools[:MAX_STATUS_POOLS],
        pool_count=len(pools) if observation.pools is not None else base.pool_count,
        device_count=(
            sum(pool.published for pool in pools)
            if observation.pools is not None
            else base.device_count
        ),
        last_sync_time=base.last_sync_time,
    )


def _comparable(status: ThunderClusterStatus | None) -> dict[str, Any]:
    if status is None:
        return {}
    data = status.to_json_dict()
    data.pop("lastSyncTime", None)
    return data


def status_patch(
    previous: ThunderClusterStatus | None,
    new: ThunderClusterStatus,
    *,
    synced: bool,
    now: datetime,
) -> ThunderClusterStatus | None:
    """The status to write now, or None to write nothing (see the module docstring).

    The stored lastSyncTime is the time of the last refresh, so the rule holds across
    operator restarts without any memory of past writes.
    """
    if synced:
        new = new.model_copy(update={"last_sync_time": now})
    if _comparable(previous) != _comparable(new):
        return new
    if not synced or previous is None:
        return None
    last = previous.last_sync_time
    if last is None or now - last >= LAST_SYNC_REFRESH:
        return new
    return None

"""NoExecute after an outage longer than `spec.operator.inventoryProtection.noExecuteAfter`.

Off by default. When set, a device whose `thundercompute.com/unbacked` NoSchedule taint
is at least that old, by the `timeAdded` the API server stored (so a restarted operator
keeps counting), also carries the same key and value with effect NoExecute; both go when
Thunder backs the device again; the NoExecute taint's `timeAdded` is carried back too,
so a pass with no change writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from tests.support.plans import plan_pass
from tests.unit.controllers.test_controllers_diff import FakeApiServer
from tests.unit.controllers.test_controllers_taints import CONFIG, PROTECTION, a6000, zone
from thunder_dra.api.thundercluster import InventoryProtectionSpec, ThunderClusterSpec
from thunder_dra.controllers.inventory.capacity import ZoneInventory
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.layout import outage_layout, plan_layout
from thunder_dra.controllers.inventory.slices import InventoryConfig
from thunder_dra.controllers.inventory.taints import (
    TAINT_KEY,
    no_execute_due,
    parse_time,
    taint_body,
    time_added_index,
)
from thunder_dra.controllers.inventory.thunder import ThunderInventory, ZoneFailure

pytestmark = pytest.mark.unit

AFTER = timedelta(minutes=5)
EVICTING = replace(CONFIG, no_execute_after=AFTER)


class Passes:
    """plan_layout (or outage_layout) and the planner over the fake API server, at a
    given time."""

    def __init__(self, config: InventoryConfig = EVICTING) -> None:
        self.server = FakeApiServer()
        self.config = config
        self.streaks: dict[str, tuple[int, int]] = {}

    def run(
        self, answer: Sequence[ZoneInventory], now: datetime, *, unreadable: Sequence[str] = ()
    ) -> int:
        slices = self.server.list("ResourceSlice")
        read = ThunderInventory(
            zones=[z for z in answer if z.zone_name not in unreadable],
            unavailable=[ZoneFailure(f"id-{n}", n, "503") for n in unreadable],
            listed_zone_names=frozenset(z.zone_name for z in answer),
        )
        planned = plan_layout(read, self.config, slices, {}, PROTECTION, self.streaks, now=now)
        self.streaks = planned.decision.streaks
        pools = planned.layout.pools
        plan = plan_pass(
            pools,
            build_device_classes(pools, self.config),
            slices,
            self.server.list("DeviceClass"),
            unavailable_zones=read.unavailable_zone_names,
            keep_pools=planned.decision.held_names,
        )
        self.server.apply(plan.ordered())
        return len(plan.actions)

    def outage(self, now: datetime) -> int:
        slices = self.server.list("ResourceSlice")
        pools = outage_layout(self.config, slices, {}, now=now)
        plan = plan_pass(pools, (), slices, (), inventory_available=False)
        self.server.apply(plan.ordered())
        return len(plan.actions)

    def taints(self) -> dict[str, list[tuple[str, str, str]]]:
        """ "<pool>/<device>" -> (value, effect, timeAdded) of each of its taints, in order."""
        found = {}
        for piece in self.server.list("ResourceSlice"):
            pool = piece["spec"]["pool"]["name"]
            for device in piece["spec"]["devices"]:
                taints = device.get("taints") or []
                assert all(t["key"] == TAINT_KEY for t in taints), taints
                if taints:
                    found[f"{pool}/{device['name']}"] = [
                        (t["value"], t["effect"], t["timeAdded"]) for t in taints
                    ]
        return found

    def effects(self) -> dict[str, list[str]]:
        return {name: [e for _, e, _ in taints] for name, taints in self.taints().items()}

    def added(self, effect: str = "NoSchedule", *, first: bool = False) -> datetime:
        """The latest (or first) timeAdded of the taints with `effect` (the fake server
        stamps each taint a second later than the one before)."""
        stamps = [
            parse_time(t) for taints in self.taints().values() for _, e, t in taints if e == effect
        ]
        assert stamps, "no taint with that effect"
        assert None not in stamps, stamps
        found = [s for s in stamps if s is not None]
        return min(found) if first else max(found)


EAST = [zone("east", a6000(2)), zone("west", a6000(1))]


def test_the_setting_is_off_by_default_and_bounded() -> None:
    assert InventoryProtectionSpec().no_execute_after is None
    assert InventoryConfig.from_spec(ThunderClusterSpec()).no_execute_after is None
    spec = ThunderClusterSpec.model_validate(
        {"operator": {"inventoryProtection": {"noExecuteAfter": "30s"}}}
    )
    assert InventoryConfig.from_spec(spec).no_execute_after == timedelta(seconds=30)
    for bad in ("29s", "169h", "-1m", "soon"):
        with pytest.raises(ValidationError):
            InventoryProtectionSpec.model_validate({"noExecuteAfter": bad})


def test_an_outage_longer_than_the_setting_adds_no_execute_and_recovery_removes_both() -> None:
    passes = Passes()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    passes.run(EAST, start)
    assert passes.run(EAST, start, unreadable=["east"]) == 1
    assert passes.effects() == {
        "east/a6000/a6000-0": ["NoSchedule"],
        "east/a6000/a6000-1": ["NoSchedule"],
    }
    since = passes.added()

    # Short of the setting: nothing to add, nothing written.
    short = passes.added(first=True) + AFTER - timedelta(seconds=1)
    assert passes.run(EAST, short, unreadable=["east"]) == 0

    # Reached: the same key and value with NoExecute, a second entry on every device of
    # the unreadable zone; the NoSchedule taint keeps its timeAdded.
    assert passes.run(EAST, since + AFTER, unreadable=["east"]) == 1
    both = ["NoSchedule", "NoExecute"]
    assert passes.effects() == {"east/a6000/a6000-0": both, "east/a6000/a6000-1": both}
    assert {v for taints in passes.taints().values() for v, _, _ in taints} == {"ZoneUnreadable"}
    assert passes.added() == since
    stamped = passes.taints()

    # No change with both taints present: no write, both timeAdded carried back, also for
    # a freshly started operator (no memory: the count is the stored timeAdded).
    later = since + 3 * AFTER
    assert passes.run(EAST, later, unreadable=["east"]) == 0
    assert Passes.run(_fresh(passes), EAST, later, unreadable=["east"]) == 0
    assert passes.taints() == stamped

    # Thunder backs the devices again: both taints go.
    assert passes.run(EAST, later) == 1
    assert passes.taints() == {}


def _fresh(passes: Passes) -> Passes:
    """A new planner (a restarted operator) over the same API server."""
    fresh = Passes(passes.config)
    fresh.server = passes.server
    return fresh


def test_thunder_unreachable_adds_no_execute_after_the_setting() -> None:
    passes = Passes()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    passes.run(EAST, start)
    assert passes.outage(start) == 2, "every pool's slice: tainted"
    since = passes.added()
    assert passes.outage(passes.added(first=True) + AFTER / 2) == 0
    assert passes.outage(since + AFTER) == 2
    assert set(map(tuple, passes.effects().values())) == {("NoSchedule", "NoExecute")}
    assert len(passes.effects()) == 3
    assert passes.outage(since + 2 * AFTER) == 0, "timeAdded of both carried back"
    assert passes.run(EAST, since + 2 * AFTER) == 2
    assert passes.taints() == {}


def test_with_the_setting_off_a_taint_never_turns_no_execute() -> None:
    passes = Passes(CONFIG)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    passes.run(EAST, start)
    passes.run(EAST, start, unreadable=["east"])
    assert passes.run(EAST, start + timedelta(days=30), unreadable=["east"]) == 0
    assert passes.effects() == {
        "east/a6000/a6000-0": ["NoSchedule"],
        "east/a6000/a6000-1": ["NoSchedule"],
    }


def test_turning_the_setting_off_removes_only_the_no_execute_taint() -> None:
    passes = Passes()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    passes.run(EAST, start)
    passes.run(EAST, start, unreadable=["east"])
    since = passes.added()
    passes.run(EAST, since + AFTER, unreadable=["east"])
    assert passes.effects()["east/a6000/a6000-0"] == ["NoSchedule", "NoExecute"]
    off = _fresh(passes)
    off.config = CONFIG
    assert off.run(EAST, since + AFTER, unreadable=["east"]) == 1
    assert passes.effects() == {
        "east/a6000/a6000-0": ["NoSchedule"],
        "east/a6000/a6000-1": ["NoSchedule"],
    }
    assert passes.added() == since


def test_due_counts_from_the_stored_no_schedule_taint_of_the_same_value() -> None:
    def stored(value: str, added: str) -> Mapping[str, object]:
        return {"name": "a6000-0", "taints": [{**taint_body(value), "timeAdded": added}]}

    now = datetime(2026, 1, 1, 1, tzinfo=UTC)
    taints = (("a6000-0", "ZoneUnreadable"),)
    old = time_added_index([stored("ZoneUnreadable", "2026-01-01T00:00:00Z")])
    assert no_execute_due(taints, old, AFTER, now) == ("a6000-0",)
    assert no_execute_due(taints, old, None, now) == (), "off"
    assert no_execute_due(taints, old, timedelta(hours=2), now) == ()
    other = time_added_index([stored("ThunderUnreachable", "2026-01-01T00:00:00Z")])
    assert no_execute_due(taints, other, AFTER, now) == (), "a new value counts again"
    assert no_execute_due(taints, {}, AFTER, now) == (), "not stored yet"
    garbage = time_added_index([stored("ZoneUnreadable", "yesterday")])
    assert no_execute_due(taints, garbage, AFTER, now) == ()
    naive = time_added_index([stored("ZoneUnreadable", "2026-01-01T00:00:00")])
    assert no_execute_due(taints, naive, AFTER, now) == ()

"""Device taints from Thunder's view: which devices, which value, and no churn.

Devices Thunder no longer backs carry `thundercompute.com/unbacked` with effect
NoSchedule at once, before any withdrawal; the taint goes when Thunder backs them
again; the stored `timeAdded` is carried back so a pass with no change writes nothing;
an API server that drops taints (DRADeviceTaints off) is reported once and not fought.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from tests.support.fakekube import Address, FakeKube
from tests.support.operator_pass import (
    OperatorWorld,
    operator_world,
)
from tests.support.plans import plan_pass
from tests.unit.controllers.test_controllers_diff import FakeApiServer
from thunder_dra.api import syntax
from thunder_dra.api.thundercluster import InventoryProtectionSpec
from thunder_dra.controllers.inventory.capacity import (
    HostInventory,
    OversubscriptionTargets,
    ZoneInventory,
)
from thunder_dra.controllers.inventory.classes import build_device_classes
from thunder_dra.controllers.inventory.layout import outage_layout, plan_layout
from thunder_dra.controllers.inventory.slices import InventoryConfig
from thunder_dra.controllers.inventory.taints import (
    TAINT_KEY,
    TaintReason,
    carry_time_added,
    taint_body,
    taints_dropped,
    time_added_index,
)
from thunder_dra.controllers.inventory.thunder import ThunderInventory, ZoneFailure
from thunder_dra.controllers.shared.ownership import ThunderClusterRef

pytestmark = pytest.mark.unit

CONFIG = InventoryConfig(owner=ThunderClusterRef("thunder", "uid-1"))
PROTECTION = InventoryProtectionSpec(max_shrink_percent=50, confirm_passes=3)


def zone(
    name: str, *hosts: HostInventory, targets: Mapping[str, Any] | None = None
) -> ZoneInventory:
    return ZoneInventory(
        f"id-{name}", name, hosts, (), OversubscriptionTargets(per_model=dict(targets or {}))
    )


class Passes:
    """plan_layout and the planner over the fake API server, with the guard's memory."""

    def __init__(self, server: FakeApiServer | None = None) -> None:
        self.server = server or FakeApiServer()
        self.streaks: dict[str, tuple[int, int]] = {}

    def run(
        self,
        answer: Sequence[ZoneInventory],
        *,
        unreadable: Sequence[str] = (),
        allocated: Mapping[str, frozenset[str]] | None = None,
        listed: Sequence[str] | None = None,
    ) -> int:
        slices = self.server.list("ResourceSlice")
        read = ThunderInventory(
            zones=[z for z in answer if z.zone_name not in unreadable],
            unavailable=[ZoneFailure(f"id-{n}", n, "503") for n in unreadable],
            listed_zone_names=frozenset(
                listed if listed is not None else [z.zone_name for z in answer]
            ),
        )
        planned = plan_layout(read, CONFIG, slices, allocated or {}, PROTECTION, self.streaks)
        self.streaks = planned.decision.streaks
        pools = planned.layout.pools
        plan = plan_pass(
            pools,
            build_device_classes(pools, CONFIG),
            slices,
            self.server.list("DeviceClass"),
            unavailable_zones=read.unavailable_zone_names,
            keep_pools=planned.decision.held_names,
        )
        self.server.apply(plan.ordered())
        return len(plan.actions)

    def taints(self) -> dict[str, tuple[str, str]]:
        """Device -> (value, timeAdded) of its taint."""
        found = {}
        for piece in self.server.list("ResourceSlice"):
            for device in piece["spec"]["devices"]:
                for taint in device.get("taints") or []:
                    assert (taint["key"], taint["effect"]) == (TAINT_KEY, "NoSchedule")
                    found[device["name"]] = (taint["value"], taint["timeAdded"])
        return found

    def values(self) -> dict[str, str]:
        return {name: value for name, (value, _) in self.taints().items()}

    def devices(self) -> list[str]:
        return sorted(
            d["name"] for s in self.server.list("ResourceSlice") for d in s["spec"]["devices"]
        )


def a6000(count: int, status: str = "") -> HostInventory:
    return HostInventory("A6000", count, status=status)


def test_every_device_of_an_unreadable_zone_is_tainted_and_kept() -> None:
    passes = Passes()
    answer = [zone("east", a6000(4)), zone("west", a6000(2))]
    passes.run(answer)
    assert passes.values() == {}

    assert passes.run(answer, unreadable=["east"]) == 1, "one slice written: the taints"
    assert passes.values() == {f"a6000-{i}": "ZoneUnreadable" for i in range(4)}
    assert len(passes.devices()) == 6, "nothing withdrawn"
    stamped = passes.taints()
    assert passes.run(answer, unreadable=["east"]) == 0, "tainted and unchanged: no write"
    assert passes.taints() == stamped, "timeAdded as the API server set it"

    assert passes.run(answer) == 1
    assert passes.values() == {}, "readable again: the taints go"


def test_a_held_shrink_taints_the_devices_beyond_the_answer() -> None:
    passes = Passes()
    passes.run([zone("east", a6000(8))])
    offline = [zone("east", a6000(2), a6000(6, status="offline"))]
    passes.run(offline)
    assert passes.values() == {f"a6000-{i}": "HostsOffline" for i in range(2, 8)}
    assert len(passes.devices()) == 8, "held: tainted, not withdrawn"
    assert passes.run(offline) == 0, "the second held pass writes nothing"
    passes.run(offline)  # the third pass with the same answer: applied
    assert passes.devices() == ["a6000-0", "a6000-1"]
    assert passes.values() == {}


def test_a_lowered_target_is_named_and_the_reason_stays_once_the_label_moves() -> None:
    passes = Passes()
    passes.run([zone("east", a6000(4), targets={"A6000": 4})])
    assert len(passes.devices()) == 16
    lowered = [zone("east", a6000(4), targets={"A6000": 1})]
    # Claims hold 5 devices, one more than Thunder now backs.
    allocated = {"east/a6000": frozenset(f"a6000-{i}" for i in range(11, 16))}
    passes.run(lowered, allocated=allocated)
    assert passes.values() == {f"a6000-{i}": "TargetLowered" for i in range(4, 16)}
    passes.run(lowered, allocated=allocated)
    passes.run(lowered, allocated=allocated)  # confirmed: the label says 1 now
    assert passes.devices() == [f"a6000-{i}" for i in range(11, 16)], "allocated: kept"
    assert passes.values() == {"a6000-15": "TargetLowered"}, "one beyond the 4 backed"
    assert passes.run(lowered, allocated=allocated) == 0


def test_a_zone_no_longer_listed_is_tainted_while_held() -> None:
    passes = Passes()
    passes.run([zone("east", a6000(2)), zone("west", a6000(1))])
    assert passes.run([zone("west", a6000(1))]) == 1
    assert passes.values() == {"a6000-0": "ZoneNotListed", "a6000-1": "ZoneNotListed"}


def test_thunder_unreachable_taints_every_published_device() -> None:
    passes = Passes()
    passes.run([zone("east", a6000(3)), zone("west", HostInventory("H100", 70))])
    layout = {
        s["metadata"]["name"]: s["spec"]["devices"] for s in passes.server.list("ResourceSlice")
    }
    slices = passes.server.list("ResourceSlice")
    pools = outage_layout(CONFIG, slices, {})
    plan = plan_pass(pools, (), slices, (), inventory_available=False)
    assert all(type(a).__name__ == "Update" for a in plan.actions), plan.actions
    passes.server.apply(plan.ordered())
    assert set(passes.values().values()) == {"ThunderUnreachable"}
    assert len(passes.values()) == 73
    after = passes.server.list("ResourceSlice")
    assert {s["metadata"]["name"]: [d["name"] for d in s["spec"]["devices"]] for s in after} == {
        name: [d["name"] for d in devices] for name, devices in layout.items()
    }, "the same slices hold the same devices"
    again = plan_pass(outage_layout(CONFIG, after, {}), (), after, (), inventory_available=False)
    assert again.empty
    assert outage_layout(CONFIG, after, {}, taints=False)[0].taints == ()


def test_time_added_is_carried_only_for_the_same_taint_on_the_same_device() -> None:
    stored = [
        {"name": "a6000-0", "taints": [{**taint_body("HostsOffline"), "timeAdded": "T0"}]},
        {"name": "a6000-1", "taints": [{**taint_body("ZoneUnreadable"), "timeAdded": "T1"}]},
    ]
    index = time_added_index(stored)
    assert carry_time_added("a6000-0", taint_body("HostsOffline"), index)["timeAdded"] == "T0"
    assert "timeAdded" not in carry_time_added("a6000-0", taint_body("TargetLowered"), index)
    assert "timeAdded" not in carry_time_added("a6000-2", taint_body("HostsOffline"), index)


def test_taint_values_are_label_values() -> None:
    assert TAINT_KEY == "thundercompute.com/unbacked"
    assert syntax.is_qualified_name(TAINT_KEY)
    for reason in TaintReason:
        assert syntax.is_label_value(reason.value)


def test_a_dropped_taint_is_told_apart() -> None:
    sent = {"spec": {"devices": [{"name": "a-0", "taints": [taint_body("HostsOffline")]}]}}
    assert taints_dropped(sent, {"spec": {"devices": [{"name": "a-0"}]}})
    assert not taints_dropped(sent, sent)
    assert not taints_dropped({"spec": {"devices": [{"name": "a-0"}]}}, {"spec": {}})


# -- through the operator's pass, against an API server with DRADeviceTaints off ------


class TaintlessKube(FakeKube):
    """An in-memory apiserver that drops ResourceSlice device taints, as 1.34 and 1.35
    do with DRADeviceTaints off."""

    def _store(self, address: Address, stored: Any, new: Any) -> Any:
        if address.plural == "resourceslices":
            for device in (new.get("spec") or {}).get("devices") or []:
                device.pop("taints", None)
        return super()._store(address, stored, new)

    def _create(self, address: Address, body: Any, *, dry_run: bool) -> Any:
        if address.plural == "resourceslices" and isinstance(body, dict):
            for device in (body.get("spec") or {}).get("devices") or []:
                device.pop("taints", None)
        return super()._create(address, body, dry_run=dry_run)


@contextlib.asynccontextmanager
async def taintless_world(zones: Mapping[str, Mapping[str, int]]) -> AsyncIterator[OperatorWorld]:
    spec = {"operator": {"inventoryProtection": {"confirmPasses": 6}}}
    async with operator_world(zones, spec, apiserver=TaintlessKube()) as world:
        yield world


async def test_a_server_that_drops_taints_is_reported_once_and_not_fought() -> None:
    async with taintless_world({"us-east": {"A6000": 4}, "eu-west": {"H100": 2}}) as world:
        first = await world.run_pass()
        assert any("dryRun" in dict(r.query) for r in first.requests if r.method == "POST")
        world.set_gpus("us-east", "A6000", 1)
        # The first pass's dry run found taints dropped: no taint is written at all.
        assert world.events().count(("Warning", "DeviceTaintsUnsupported")) == 1
        tainting = await world.run_pass()
        assert tainting.writes_to("resourceslices") == []
        for _ in range(2):
            again = await world.run_pass()
            assert again.writes_to("resourceslices") == [], "no rewrite in a loop"
        assert world.events().count(("Warning", "DeviceTaintsUnsupported")) == 1
        assert world.operator.services.inventory.taints_supported is False


async def test_a_write_that_loses_its_taints_turns_taints_off_when_no_probe_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with taintless_world({"us-east": {"A6000": 4}}) as world:
        inventory = world.operator.services.inventory

        async def no_probe(*_: Any) -> None:
            return None

        monkeypatch.setattr(inventory, "_learn_taint_support", no_probe)
        await world.run_pass()
        assert inventory.taints_supported is None
        world.set_gpus("us-east", "A6000", 1)
        tainting = await world.run_pass()
        assert len(tainting.writes_to("resourceslices")) == 1, "the taint is tried once"
        assert inventory.taints_supported is False
        assert ("Warning", "DeviceTaintsUnsupported") in world.events()
        assert (await world.run_pass()).writes_to("resourceslices") == []


async def test_an_outage_taints_then_writes_nothing_and_the_taints_go_after() -> None:
    async with operator_world({"us-east": {"A6000": 4}}) as world:
        await world.run_pass()
        world.thunder.faults.add(
            {"path": "/api/v1/zones", "method": "GET", "status": 503, "times": 1000}
        )
        down = await world.run_pass()
        assert len(down.writes_to("resourceslices")) == 1
        assert world.published() == {"us-east/a6000": 4}
        values = {
            t["value"]
            for s in world.slices()
            for d in s["spec"]["devices"]
            for t in d.get("taints") or []
        }
        assert values == {"ThunderUnreachable"}
        assert world.conditions()["ThunderReachable"][0] == "False"
        assert (await world.run_pass()).writes_to("resourceslices") == []
        world.thunder.faults.clear()
        back = await world.run_pass()
        assert len(back.writes_to("resourceslices")) == 1
        assert not any(d.get("taints") for s in world.slices() for d in s["spec"]["devices"])
